#!/usr/bin/env bash
# Generation throughput of echelon's LibTorch generator against the PyTorch-eager reference
# (../shared/tools/ref_qwen3.py) on the same model shape (the default math-tiny policy), the
# same batch shapes, greedy decoding, both on one thread, measured back to back in one run.
# Usage: bench/generate_vs_pytorch.sh [BUILD_DIR]     (root; installs python3-torch if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
. bench/reference.sh
cmake --build "$BUILD" --target generate_bench -j "$(nproc)" >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
/usr/bin/python3 "$REF" init --out "$TMP/model" --layers 3 --hidden 128 --heads 4 --kv-heads 2 --head-dim 32 \
  --intermediate 384 --vocab 17 --tie --rope-theta 10000 --seed 1 >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
"$BUILD/generate_bench" --benchmark_filter=BM_Generate/ --benchmark_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true > "$TMP/echelon.json"
for shape in "256 6 8" "16 32 64"; do
  set -- $shape
  /usr/bin/python3 "$REF" bench --model "$TMP/model" --threads 1 --blas-threads 1 --batch "$1" --prompt-len "$2" \
    --new-tokens "$3" --repeats 3 > "$TMP/ref-$1-$2-$3.json"
done
/usr/bin/python3 - "$TMP" <<'PY'
import json, sys, glob, os
tmp = sys.argv[1]
ech = {}
for b in json.load(open(os.path.join(tmp, "echelon.json")))["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    parts = dict(p.split(":") for p in b["run_name"].split("/")[1:] if ":" in p)
    ech[(parts["cache"], parts["batch"], parts["prompt"], parts["new"])] = b["tokens_per_s"]
print("| batch x prompt -> new | KV cache | echelon tok/s | PyTorch eager tok/s | echelon / PyTorch |")
print("|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(tmp, "ref-*.json"))):
    r = json.load(open(path))
    key = (str(r["batch"]), str(r["prompt_len"]), str(r["new_tokens"]))
    for cache, name in (("1", "kv_cache"), ("0", "no_cache")):
        e = ech[(cache,) + key]
        p = r[name]["tokens_per_s"]
        print(f"| {key[0]} x {key[1]} -> {key[2]} | {'yes' if cache == '1' else 'no'} | {e:,.0f} | {p:,.0f} | {e / p:.2f} |")
PY
