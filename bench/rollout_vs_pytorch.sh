#!/usr/bin/env bash
# Rollout throughput on an RL-like workload: echelon's builtin engine against PyTorch eager
# (../shared/tools/ref_qwen3.py: KV cache, HF-style static left-padded batches), same model,
# same rows, THREADS intra-op (and OpenBLAS) threads and INTEROP inter-op threads on each side,
# median of REPEATS. The two sides alternate run by run (echelon's three configurations, then
# PyTorch, REPEATS times), so a change in the machine's load falls on both; every run's tokens/s
# is printed and the spread (min, max over the runs) goes into the table and the JSON, so a
# noisy run shows.
#
# Workload (fixed seed): 32 prompts of 16..128 random tokens, G = 8 samples each (256 rows, in
# group order), temperature 1. Every row i ends after exactly L_i tokens, L_i drawn uniformly
# from 8..256, as if it drew EOS there: echelon gets the lengths as per-row limits
# (SamplingParams::max_new_tokens_per_row) and ignores drawn EOS; the PyTorch side runs the rows
# in batches of SLOTS, each batch until its longest row's L_i (where an HF-style generate stops
# once every row has hit EOS), and keeps only each row's first L_i tokens. Both sides hold at
# most SLOTS rows at once. tokens/s = generated tokens / wall seconds, prefill included.
#
# Checks (any failure exits non-zero with one line saying what differed):
#   - before the timed runs, a greedy cross-check: 4 rows (2 prompts x 2, limits up to
#     CHECK_TOKENS=16, 2 slots so finished rows are refilled) decoded at temperature 0 by each of
#     echelon's three configurations and by the reference must give identical token ids, with
#     log-probabilities within 1e-3;
#   - in every timed run each side counts the tokens it generated from its returned rows
#     (echelon: every row must hold exactly L_i; PyTorch: every row at least L_i, truncated to
#     it), and both totals must equal sum(L_i) from the workload file;
#   - both sides report the thread counts they ran with, which must be the ones asked for.
#
# Two Qwen3-shaped models: the default tiny policy (3 layers x hidden 128, vocab 17) and a
# larger one (8 layers x hidden 512, vocab 2048). The gain is split by technique, one at a
# time: the engine itself (echelon static batches that prefill every row / PyTorch), continuous
# batching (continuous / static), one prefill per group (shared / continuous); `share` is each
# factor's part of the whole gain on a log scale.
#
# Usage: bench/rollout_vs_pytorch.sh [BUILD_DIR]   (root; installs python3-torch if missing)
#   SIZES="tiny large" SLOTS=64 REPEATS=5 THREADS=1 INTEROP=1 CHECK_TOKENS=16 override the
#   defaults (REPEATS=0: the greedy check only); NO_BUILD=1 runs BUILD_DIR/rollout_bench as it
#   is (built beforehand).
# The last lines are a markdown table and one JSON object per model size.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SIZES=${SIZES:-tiny large}
SLOTS=${SLOTS:-64}
REPEATS=${REPEATS:-5}
THREADS=${THREADS:-1}
INTEROP=${INTEROP:-1}
CHECK_TOKENS=${CHECK_TOKENS:-16}
. bench/reference.sh
[ -n "${NO_BUILD:-}" ] || cmake --build "$BUILD" --target rollout_bench -j "$(nproc)" >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS

# The PyTorch side. `check`: greedy token ids of a check workload, compared with echelon's
# (a JSON line per configuration on stdin). `timed`: one timed pass over the workload.
cat > "$TMP/pytorch_side.py" <<'PY'
import importlib.util, json, sys, time
import torch
cmd, ref_path, model_dir, workload_path = sys.argv[1:5]
threads, interop, arg = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
torch.set_num_interop_threads(interop)  # before any parallel work, or torch refuses
spec = importlib.util.spec_from_file_location("ref_qwen3", ref_path)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
got = {**ref.set_threads(threads, threads), "interop_threads": torch.get_num_interop_threads()}
if (got["torch_threads"], got["blas_threads"], got["interop_threads"]) != (threads, threads, interop):
    sys.exit(f"PyTorch side runs with {got}, asked for {threads} threads, {threads} BLAS, {interop} inter-op")
model = ref.load(model_dir)
w = json.load(open(workload_path))
rows = [p for p in w["prompts"] for _ in range(w["group"])]
lengths = w["lengths"]
vocab = model.cfg.vocab_size

def truncated(out, first_row, n_rows):
    """Each returned row cut to its L_i; fails when a row is missing or short or holds a bad id."""
    t = out["tokens"]
    if t.shape[0] != n_rows:
        sys.exit(f"PyTorch side: rows {first_row}..: {t.shape[0]} rows returned for {n_rows}")
    rows_out = []
    for i in range(n_rows):
        L = lengths[first_row + i]
        row = t[i, :L].tolist()
        if len(row) != L or any(not 0 <= x < vocab for x in row):
            sys.exit(f"PyTorch side: row {first_row + i} got {len(row)} valid tokens, its length is {L}")
        rows_out.append(row)
    return rows_out

if cmd == "check":
    lengths = [min(L, arg) for L in lengths]
    out = ref.generate(model, rows, max(lengths), temperature=0.0)
    want = truncated(out, 0, len(rows))
    want_lp = [out["logprobs"][i, :len(r)].tolist() for i, r in enumerate(want)]
    for line in sys.stdin:
        e = json.loads(line)
        if len(e["tokens"]) != len(want):
            sys.exit(f"greedy check FAILED: echelon {e['mode']} returned {len(e['tokens'])} rows, PyTorch {len(want)}")
        for i, (a, b) in enumerate(zip(e["tokens"], want)):
            if a != b:
                k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                sys.exit(f"greedy check FAILED: echelon {e['mode']} row {i} differs from PyTorch at token {k}: "
                         f"echelon {a[k:k + 4]}... ({len(a)} tokens), PyTorch {b[k:k + 4]}... ({len(b)} tokens)")
        # The same tokens with different log-probs would mean a different model that happens to
        # agree on the argmax (the tiny model's greedy rows repeat one token at probability ~1).
        diff = max(abs(x - y) for a, b in zip(e["logprobs"], want_lp) for x, y in zip(a, b))
        if diff > 1e-3:
            sys.exit(f"greedy check FAILED: echelon {e['mode']} log-probs differ from PyTorch's by up to {diff:.2e}")
        print(f"greedy check: echelon {e['mode']} == PyTorch on {len(want)} rows, {sum(map(len, want))} tokens "
              f"({len(set(x for r in want for x in r))} distinct ids), log-probs within {diff:.1e}", file=sys.stderr)
else:
    ref.generate(model, [rows[0]], 4, temperature=1.0)  # warm-up
    slots, outs = arg, []
    start = time.perf_counter()
    for b in range(0, len(rows), slots):
        outs.append(ref.generate(model, rows[b:b + slots], max(lengths[b:b + slots]), temperature=1.0,
                                 seed=int(sys.argv[8]) * 1000 + b))
    seconds = time.perf_counter() - start
    tokens = sum(len(r) for k, out in enumerate(outs)
                 for r in truncated(out, k * slots, min(slots, len(rows) - k * slots)))
    print(json.dumps({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, **got}))
    print(f"{sys.argv[9]}: {tokens / seconds:,.0f} tok/s (threads {got['torch_threads']}, BLAS {got['blas_threads']}, "
          f"inter-op {got['interop_threads']})", file=sys.stderr)
PY

# Checks one echelon run's lines (stdin): the threads it ran with; prints a one-line summary.
cat > "$TMP/echelon_run.py" <<'PY'
import json, sys
threads, interop, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in sys.stdin]
for m in lines:
    # blas_threads -1: LibTorch is not linked to OpenBLAS, so it has no pool of its own to check.
    if (m["threads"], m["interop_threads"]) != (threads, interop) or m["blas_threads"] not in (threads, -1):
        sys.exit(f"echelon {m['mode']} ran with {m['threads']} threads, {m['blas_threads']} BLAS, "
                 f"{m['interop_threads']} inter-op; asked for {threads}, {threads}, {interop}")
rate = lambda m: f"{m['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in m else f"{len(m['tokens'])} rows"
print(f"{label}: " + ", ".join(f"{m['mode']} {rate(m)}" for m in lines)
      + f" (threads {lines[0]['threads']}, BLAS {lines[0]['blas_threads']}, inter-op {lines[0]['interop_threads']})",
      file=sys.stderr)
PY

for size in $SIZES; do
  case $size in
    tiny) shape="--layers 3 --hidden 128 --heads 4 --kv-heads 2 --head-dim 32 --intermediate 384 --vocab 17 --tie" ;;
    large) shape="--layers 8 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 --intermediate 1536 --vocab 2048" ;;
    *) echo "unknown size $size (tiny, large)" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  /usr/bin/python3 "$REF" init --out "$TMP/$size" $shape --rope-theta 10000 --seed 1 >/dev/null
  /usr/bin/python3 - "$TMP/$size" "$CHECK_TOKENS" <<'PY'
import json, sys
import numpy as np
vocab = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
rng = np.random.default_rng(20261202)
group, prompts, n = 8, 32, int(sys.argv[2])
w = {"group": group,
     "prompts": [rng.integers(3, vocab, int(rng.integers(16, 129))).tolist() for _ in range(prompts)],
     "lengths": rng.integers(8, 257, group * prompts).tolist()}
json.dump(w, open(sys.argv[1] + ".workload.json", "w"))
# Two prompts of different lengths x 2 samples; unequal limits, so rows finish apart.
check = {"group": 2, "prompts": w["prompts"][:2], "lengths": [n, max(1, n // 2), n, max(1, n - 3)]}
json.dump(check, open(sys.argv[1] + ".check.json", "w"))
PY
  "$BUILD/rollout_bench" --model "$TMP/$size" --workload "$TMP/$size.check.json" --slots 2 \
    --threads "$THREADS" --interop-threads "$INTEROP" --greedy-check "$CHECK_TOKENS" > "$TMP/$size.check.jsonl"
  /usr/bin/python3 "$TMP/echelon_run.py" "$THREADS" "$INTEROP" "== $size, greedy check: echelon" \
    < "$TMP/$size.check.jsonl"
  /usr/bin/python3 "$TMP/pytorch_side.py" check "$REF" "$TMP/$size" "$TMP/$size.check.json" "$THREADS" "$INTEROP" \
    "$CHECK_TOKENS" < "$TMP/$size.check.jsonl"
  for run in $(seq "$REPEATS"); do
    "$BUILD/rollout_bench" --model "$TMP/$size" --workload "$TMP/$size.workload.json" --slots "$SLOTS" \
      --repeats 1 --seed "$run" --threads "$THREADS" --interop-threads "$INTEROP" > "$TMP/run.jsonl"
    /usr/bin/python3 "$TMP/echelon_run.py" "$THREADS" "$INTEROP" "== $size, run $run of $REPEATS: echelon" \
      < "$TMP/run.jsonl"
    cat "$TMP/run.jsonl" >> "$TMP/$size.echelon.jsonl"
    /usr/bin/python3 "$TMP/pytorch_side.py" timed "$REF" "$TMP/$size" "$TMP/$size.workload.json" "$THREADS" \
      "$INTEROP" "$SLOTS" "$run" "== $size, run $run of $REPEATS: PyTorch eager" > "$TMP/run.json"
    cat "$TMP/run.json" >> "$TMP/$size.pytorch.jsonl"
  done
done

[ "$REPEATS" -gt 0 ] || { echo "REPEATS=0: the checks only, no timed runs" >&2; exit 0; }
/usr/bin/python3 - "$TMP" "$SLOTS" "$THREADS" "$INTEROP" $SIZES <<'PY'
import json, math, os, sys
tmp, slots, threads, interop, sizes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
rows = []

def median_run(runs):  # the run of median time
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]

def spread(runs):
    return [round(min(r["tokens_per_s"] for r in runs), 1), round(max(r["tokens_per_s"] for r in runs), 1)]

for size in sizes:
    w = json.load(open(os.path.join(tmp, size + ".workload.json")))
    want = sum(w["lengths"])
    by_mode = {}
    for line in open(os.path.join(tmp, size + ".echelon.jsonl")):
        m = json.loads(line)
        by_mode.setdefault(m["mode"], []).append(m)
    pt_runs = [json.loads(line) for line in open(os.path.join(tmp, size + ".pytorch.jsonl"))]
    for side, runs in [("PyTorch", pt_runs)] + [("echelon " + k, v) for k, v in by_mode.items()]:
        bad = [r["tokens"] for r in runs if r["tokens"] != want]
        if bad:
            sys.exit(f"{size}: {side} generated {bad[0]} tokens in a run, the workload's lengths sum to {want}")
    modes = {k: median_run(v) for k, v in by_mode.items()}
    pt = median_run(pt_runs)
    full_runs = by_mode["continuous+shared_prefix"]
    full = modes["continuous+shared_prefix"]["tokens_per_s"]
    total = full / pt["tokens_per_s"]
    # Run r's echelon against run r's PyTorch: the two ran next to each other.
    run_ratios = [e["tokens_per_s"] / p["tokens_per_s"] for e, p in zip(full_runs, pt_runs)]
    factors = {"engine": modes["static"]["tokens_per_s"] / pt["tokens_per_s"],
               "continuous_batching": modes["continuous"]["tokens_per_s"] / modes["static"]["tokens_per_s"],
               "prefix_sharing": full / modes["continuous"]["tokens_per_s"]}
    shares = {k: round(math.log(f) / math.log(total), 3) if total > 1 else None for k, f in factors.items()}
    e = modes["static"]
    rows.append({"size": size, "echelon_tokens_per_s": round(full, 1), "pytorch_tokens_per_s": round(pt["tokens_per_s"], 1),
                 "ratio": round(total, 3), "factors": {k: round(f, 3) for k, f in factors.items()}, "shares": shares,
                 "repeats": len(pt_runs),
                 "echelon_spread_tokens_per_s": spread(full_runs), "pytorch_spread_tokens_per_s": spread(pt_runs),
                 "run_ratio_spread": [round(min(run_ratios), 3), round(max(run_ratios), 3)],
                 "pytorch_runs_tokens_per_s": [round(r["tokens_per_s"], 1) for r in pt_runs],
                 "echelon_runs_tokens_per_s": {k: [round(r["tokens_per_s"], 1) for r in v] for k, v in by_mode.items()},
                 "echelon_modes_tokens_per_s": {k: round(m["tokens_per_s"], 1) for k, m in modes.items()},
                 "decode_rows": {k: m["decode_rows"] for k, m in modes.items()},
                 "prefill_tokens": {k: m["prefill_tokens"] for k, m in modes.items()},
                 "tokens": want, "rows": e["rows"], "slots": slots,
                 "threads": {"asked": {"intra_op": threads, "inter_op": interop},
                             "echelon": {"intra_op": e["threads"], "blas": e["blas_threads"], "inter_op": e["interop_threads"]},
                             "pytorch": {"intra_op": pt["torch_threads"], "blas": pt["blas_threads"],
                                         "inter_op": pt["interop_threads"], "blas_library": pt["blas"]}}})
print(f"| size | PyTorch eager tok/s (min-max) | echelon tok/s (min-max) | ratio (per-run min-max) | engine | continuous batching | prefix sharing |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    f, s = r["factors"], r["shares"]
    cell = lambda k: f"{f[k]:.2f}x ({s[k]:.0%})" if s[k] is not None else f"{f[k]:.2f}x"
    ps, es, rs = r["pytorch_spread_tokens_per_s"], r["echelon_spread_tokens_per_s"], r["run_ratio_spread"]
    print(f"| {r['size']} | {r['pytorch_tokens_per_s']:,.0f} ({ps[0]:,.0f}-{ps[1]:,.0f}) | "
          f"{r['echelon_tokens_per_s']:,.0f} ({es[0]:,.0f}-{es[1]:,.0f}) | {r['ratio']:.2f} ({rs[0]:.2f}-{rs[1]:.2f}) | "
          f"{cell('engine')} | {cell('continuous_batching')} | {cell('prefix_sharing')} |")
for r in rows:
    print(json.dumps(r))
PY
