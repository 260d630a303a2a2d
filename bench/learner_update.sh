#!/usr/bin/env bash
# Learner update time and peak memory per rank on a Qwen3-shaped model (8 layers, hidden 512,
# ~27M parameters; 8 groups x 8 samples, 32-token prompts, 16..96-token completions):
# rows padded to the longest vs packed without padding (the default), fp32 vs bf16, one
# forward/backward vs micro-batches of 1,024 tokens, one rank vs two
# data-parallel ranks (c10d Gloo over loopback) with a sharded optimizer or sharded parameters,
# and activation checkpointing. All on
# the same cores: one rank runs 2 intra-op threads, two ranks 1 each. Median of 5 updates after
# one warm-up. Last lines: one JSON object per configuration (rank 0's line, with the peak
# memory of every rank).
# Usage: bench/learner_update.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
cmake --build "$BUILD" --target learner_update_bench -j "$(nproc)" >/dev/null
BIN=$BUILD/learner_update_bench
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1

one() {  # NAME THREADS ARGS...: one rank
  local name=$1 threads=$2
  shift 2
  OMP_NUM_THREADS=$threads "$BIN" "$@" > "$TMP/$name.0"
}
two() {  # NAME ARGS...: two ranks, one thread each
  local name=$1
  shift
  local port=$((29700 + RANDOM % 200))
  OMP_NUM_THREADS=1 WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$BIN" "$@" > "$TMP/$name.1" &
  local pid=$!
  OMP_NUM_THREADS=1 WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$BIN" "$@" > "$TMP/$name.0"
  wait "$pid"
}

one fp32_padded 2 --no-pack
one fp32 2
one bf16 2 --precision bf16
one fp32_micro_padded 2 --micro 1024 --no-pack
one fp32_micro 2 --micro 1024
one bf16_micro 2 --precision bf16 --micro 1024
one fp32_micro_1thread 1 --micro 1024
one fp32_micro_ckpt 2 --micro 1024 --checkpoint
two ranks2_micro --micro 1024
two ranks2_micro_shard --micro 1024 --shard optimizer
two ranks2_micro_params --micro 1024 --shard params
two ranks2_bf16_micro --precision bf16 --micro 1024

/usr/bin/python3 - "$TMP" <<'PY'
import json, sys, os
tmp = sys.argv[1]
names = ["fp32_padded", "fp32", "bf16", "fp32_micro_padded", "fp32_micro", "bf16_micro", "fp32_micro_1thread",
         "fp32_micro_ckpt", "ranks2_micro", "ranks2_micro_shard", "ranks2_micro_params", "ranks2_bf16_micro"]
rows = {}
for n in names:
    r0 = json.loads(open(os.path.join(tmp, n + ".0")).read())
    r0["name"] = n
    r0["peak_rss_mb_per_rank"] = [r0["peak_rss_mb"]]
    p1 = os.path.join(tmp, n + ".1")
    if os.path.exists(p1):
        r0["peak_rss_mb_per_rank"].append(json.loads(open(p1).read())["peak_rss_mb"])
    rows[n] = r0
base = rows["fp32_padded"]["update_s"]
print("%-22s %6s %5s %7s %9s %8s %12s %10s %9s" % ("config", "ranks", "thr", "update s", "vs padded", "micro",
                                                    "peak MB/rank", "adam MB", "state MB"))
for n in names:
    r = rows[n]
    print("%-22s %6d %5d %8.3f %8.2fx %8d %12s %10.1f %9.1f" % (n, r["ranks"], r["threads"], r["update_s"],
          base / r["update_s"], r["micro_batch_tokens"], "/".join("%.0f" % m for m in r["peak_rss_mb_per_rank"]),
          r["optimizer_mb"], r["state_mb"]))
for n in names:
    rows[n]["speedup_vs_fp32_padded"] = base / rows[n]["update_s"]
    print(json.dumps(rows[n]))
PY
