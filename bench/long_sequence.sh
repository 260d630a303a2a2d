#!/usr/bin/env bash
# Reasoning-length sequences: memory (peak resident set, VmHWM, minus the resident set before
# the phase) and time per token of one learner update and one greedy generation on a tiny Qwen3
# with the real 151,936-entry vocabulary (bench/long_sequence_bench.cc), at 1k .. 32k tokens,
# tiled (attention in tiles, log-probs in chunks, block KV cache) and, as far as it fits in
# memory, untiled (T x S scores, T x vocab logits: what the code did before). One process per
# measurement. Prints the JSON lines, a Markdown table, and the checks:
#   - tiled memory grows at most linearly: delta(16k) / delta(8k) <= 2.3, train and generate;
#   - tiled train at 16k needs at most 1/8 of the untiled train's largest measured delta;
#   - train: the peak grows by less than a quarter of one fp32 T x V tensor from 1,024 to
#     4,096 new tokens (3,072 x 151,936 x 4 B / 4 = 445 MiB);
#   - train: the learner memory model's estimate within 15% of the measured peak - baseline.
# Usage: bench/long_sequence.sh [BUILD_DIR]
#   LENGTHS (default "1024 2048 4096 8192 16384 32768"), UNTILED_MAX (default 4096: the untiled
#   update at 8k needs ~32 GB), OUT (default long_sequence.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
LENGTHS=${LENGTHS:-"1024 2048 4096 8192 16384 32768"}
UNTILED_MAX=${UNTILED_MAX:-4096}
OUT=${OUT:-long_sequence.jsonl}
cmake --build "$BUILD" --target long_sequence_bench -j "$(nproc)" >/dev/null
BIN="$BUILD/long_sequence_bench"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
: > "$OUT"
run() {  # mode tokens [--untiled]
  echo "long_sequence: $*" >&2
  timeout 3600 "$BIN" --mode "$1" --tokens "$2" ${3:-} | tee -a "$OUT"
}
for t in $LENGTHS; do
  run train "$t"
  run generate "$t"
  if [ "$t" -le "$UNTILED_MAX" ]; then
    run train "$t" --untiled
    run generate "$t" --untiled
  fi
done
python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["mode"], r["path"], r["tokens"]): r for r in rows}
print("\n| mode | path | tokens | peak - baseline (MiB) | model's estimate (MiB) | peak (MiB) | ms / token |")
print("|---|---|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (r["mode"], r["path"], r["tokens"])):
    est = f'{r["estimate_mb"]:.0f}' if "estimate_mb" in r else "-"
    print(f'| {r["mode"]} | {r["path"]} | {r["tokens"]} | {r["delta_mb"]:.0f} | {est} | {r["peak_mb"]:.0f} | {r["ms_per_token"]:.3f} |')
ok = True
def check(name, value, bound, less=True):
    global ok
    good = value <= bound if less else value >= bound
    ok = ok and good
    print(f'{"ok  " if good else "FAIL"} {name}: {value:.3f} (bound {bound})')
print()
for mode in ("train", "generate"):
    a, b = by.get((mode, "tiled", 8192)), by.get((mode, "tiled", 16384))
    if a and b:
        check(f"{mode}: tiled delta 16k / 8k", b["delta_mb"] / a["delta_mb"], 2.3)
untiled = [r for r in rows if r["mode"] == "train" and r["path"] == "untiled"]
t16 = by.get(("train", "tiled", 16384))
if untiled and t16:
    top = max(untiled, key=lambda r: r["tokens"])
    check(f'train: tiled delta at 16k / untiled delta at {top["tokens"]}', t16["delta_mb"] / top["delta_mb"], 0.125)
for r in rows:
    if "estimate_mb" in r:
        check(f'train {r["tokens"]}: memory model / measured', r["estimate_mb"] / r["delta_mb"], 1.15)
        check(f'train {r["tokens"]}: memory model / measured (at least)', r["estimate_mb"] / r["delta_mb"], 0.85, less=False)
a, b = by.get(("train", "tiled", 1024)), by.get(("train", "tiled", 4096))
if a and b:
    check("train: peak growth 1,024 -> 4,096 tokens (MiB)", b["peak_mb"] - a["peak_mb"], 3072 * 151936 * 4 / 4 / 2**20)
sys.exit(0 if ok else 1)
EOF
