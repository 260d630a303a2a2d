#!/usr/bin/env bash
# Rollout throughput on an RL-like workload: echelon's builtin engine against PyTorch eager
# (../shared/tools/ref_qwen3.py: KV cache, HF-style static left-padded batches), same model,
# same rows, one thread each, median of 3. The two sides alternate run by run (echelon's three
# configurations, then PyTorch, three times), so a change in the machine's load falls on both.
#
# Workload (fixed seed): 32 prompts of 16..128 random tokens, G = 8 samples each (256 rows, in
# group order), temperature 1. Every row i ends after exactly L_i tokens, L_i drawn uniformly
# from 8..256, as if it drew EOS there: echelon gets the lengths as per-row limits
# (SamplingParams::max_new_tokens_per_row) and ignores drawn EOS; the PyTorch side runs the rows
# in batches of SLOTS, each batch until its longest row's L_i (where an HF-style generate stops
# once every row has hit EOS), and counts only each row's L_i tokens. Both sides hold at most
# SLOTS rows at once. tokens/s = sum(L_i) / wall seconds, prefill included.
#
# Two Qwen3-shaped models: the default tiny policy (3 layers x hidden 128, vocab 17) and a
# larger one (8 layers x hidden 512, vocab 2048). The gain is split by technique, one at a
# time: the engine itself (echelon static batches that prefill every row / PyTorch), continuous
# batching (continuous / static), one prefill per group (shared / continuous); `share` is each
# factor's part of the whole gain on a log scale.
#
# Usage: bench/rollout_vs_pytorch.sh [BUILD_DIR]   (root; installs python3-torch if missing)
#   SIZES="tiny large" SLOTS=64 REPEATS=3 override the defaults.
# The last lines are one JSON object per model size.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SIZES=${SIZES:-tiny large}
SLOTS=${SLOTS:-64}
REPEATS=${REPEATS:-3}
. bench/reference.sh
cmake --build "$BUILD" --target rollout_bench -j "$(nproc)" >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

for size in $SIZES; do
  case $size in
    tiny) shape="--layers 3 --hidden 128 --heads 4 --kv-heads 2 --head-dim 32 --intermediate 384 --vocab 17 --tie" ;;
    large) shape="--layers 8 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 --intermediate 1536 --vocab 2048" ;;
    *) echo "unknown size $size (tiny, large)" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  /usr/bin/python3 "$REF" init --out "$TMP/$size" $shape --rope-theta 10000 --seed 1 >/dev/null
  /usr/bin/python3 - "$TMP/$size" > "$TMP/$size.workload.json" <<'PY'
import json, sys
import numpy as np
vocab = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
rng = np.random.default_rng(20261202)
group, prompts = 8, 32
out = {"group": group,
       "prompts": [rng.integers(3, vocab, int(rng.integers(16, 129))).tolist() for _ in range(prompts)],
       "lengths": rng.integers(8, 257, group * prompts).tolist()}
json.dump(out, sys.stdout)
PY
  for run in $(seq "$REPEATS"); do
    echo "== $size, run $run of $REPEATS: echelon" >&2
    "$BUILD/rollout_bench" --model "$TMP/$size" --workload "$TMP/$size.workload.json" --slots "$SLOTS" \
      --repeats 1 --seed "$run" | tee -a "$TMP/$size.echelon.jsonl" >&2
    echo "== $size, run $run of $REPEATS: PyTorch eager" >&2
    /usr/bin/python3 - "$REF" "$TMP/$size" "$TMP/$size.workload.json" "$SLOTS" "$run" <<'PY' | tee -a "$TMP/$size.pytorch.jsonl" >&2
import importlib.util, json, sys, time
ref_path, model_dir, workload_path, slots, run = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
spec = importlib.util.spec_from_file_location("ref_qwen3", ref_path)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
threads = ref.set_threads(1, 1)
model = ref.load(model_dir)
w = json.load(open(workload_path))
rows = [p for p in w["prompts"] for _ in range(w["group"])]
lengths = w["lengths"]
ref.generate(model, [rows[0]], 4, temperature=1.0)  # warm-up
start = time.perf_counter()
for b in range(0, len(rows), slots):
    ref.generate(model, rows[b:b + slots], max(lengths[b:b + slots]), temperature=1.0, seed=run * 1000 + b)
seconds = time.perf_counter() - start
print(json.dumps({"tokens": sum(lengths), "seconds": seconds, "tokens_per_s": sum(lengths) / seconds, **threads}))
PY
  done
done

/usr/bin/python3 - "$TMP" "$SLOTS" $SIZES <<'PY'
import json, math, os, sys
tmp, slots, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = []
for size in sizes:
    def median_run(runs):  # the run of median time
        runs = sorted(runs, key=lambda r: r["seconds"])
        return runs[len(runs) // 2]
    by_mode = {}
    for line in open(os.path.join(tmp, size + ".echelon.jsonl")):
        m = json.loads(line)
        by_mode.setdefault(m["mode"], []).append(m)
    modes = {k: median_run(v) for k, v in by_mode.items()}
    pt = median_run([json.loads(line) for line in open(os.path.join(tmp, size + ".pytorch.jsonl"))])
    assert all(m["tokens"] == pt["tokens"] for m in modes.values()), "both sides must generate the same tokens"
    full = modes["continuous+shared_prefix"]["tokens_per_s"]
    total = full / pt["tokens_per_s"]
    factors = {"engine": modes["static"]["tokens_per_s"] / pt["tokens_per_s"],
               "continuous_batching": modes["continuous"]["tokens_per_s"] / modes["static"]["tokens_per_s"],
               "prefix_sharing": full / modes["continuous"]["tokens_per_s"]}
    shares = {k: round(math.log(f) / math.log(total), 3) if total > 1 else None for k, f in factors.items()}
    rows.append({"size": size, "echelon_tokens_per_s": round(full, 1), "pytorch_tokens_per_s": round(pt["tokens_per_s"], 1),
                 "ratio": round(total, 3), "factors": {k: round(f, 3) for k, f in factors.items()}, "shares": shares,
                 "echelon_modes_tokens_per_s": {k: round(m["tokens_per_s"], 1) for k, m in modes.items()},
                 "decode_rows": {k: m["decode_rows"] for k, m in modes.items()},
                 "prefill_tokens": {k: m["prefill_tokens"] for k, m in modes.items()},
                 "tokens": pt["tokens"], "rows": modes["static"]["rows"], "slots": slots, "threads": 1})
print("| size | PyTorch eager tok/s | echelon tok/s | ratio | engine | continuous batching | prefix sharing |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    f, s = r["factors"], r["shares"]
    cell = lambda k: f"{f[k]:.2f}x ({s[k]:.0%})" if s[k] is not None else f"{f[k]:.2f}x"
    print(f"| {r['size']} | {r['pytorch_tokens_per_s']:,.0f} | {r['echelon_tokens_per_s']:,.0f} | {r['ratio']:.2f} | "
          f"{cell('engine')} | {cell('continuous_batching')} | {cell('prefix_sharing')} |")
for r in rows:
    print(json.dumps(r))
PY
