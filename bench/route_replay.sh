#!/usr/bin/env bash
# Router replay's bytes against the disagreements they cover (bench/route_replay_bench.cc), on a
# random Qwen3-MoE with routers of three sharpnesses, several seeds: one markdown row per router
# scale and margin, mean over the seeds (min-max of the share covered).
# Usage: bench/route_replay.sh BUILD_DIR [SEEDS]
set -euo pipefail
BUILD=${1:?usage: bench/route_replay.sh BUILD_DIR [SEEDS]}
SEEDS=${2:-3}
cmake --build "$BUILD" --target route_replay_bench > /dev/null 2>&1
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for scale in 1 10 30; do
  for seed in $(seq 1 "$SEEDS"); do
    "$BUILD/route_replay_bench" --router-scale "$scale" --seed "$seed" >> "$OUT"
  done
done
echo "| router scale | margin (nats) | routes sent | disagreements covered (min-max) | bytes / token | full replay bytes / token | routes disagreeing |"
echo "|---|---|---|---|---|---|---|"
jq -rs 'group_by([.router_scale, .margin]) | .[] |
  "| \(.[0].router_scale) | \(if .[0].margin >= 1e9 then "every route" else .[0].margin end) | \((map(.sent_frac) | add / length * 1000 | round / 10))% | \((map(.disagreements_covered) | add / length * 1000 | round / 10))% (\((map(.disagreements_covered) | min * 1000 | round / 10))-\((map(.disagreements_covered) | max * 1000 | round / 10))) | \((map(.bytes_per_token) | add / length * 10 | round / 10)) | \((map(.full_bytes_per_token) | add / length * 10 | round / 10)) | \((map(.disagree_frac) | add / length * 1000 | round / 10))% |"' "$OUT"
