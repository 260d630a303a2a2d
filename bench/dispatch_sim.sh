#!/usr/bin/env bash
# Deadline-aware dispatch and resumable groups against first come, first served, in the
# simulator, on the same seeds: configs/simulate-mixed-fleet.yaml (8 fast H200 workers and 32
# four-times-slower spot RTX 4090s, heavy-tailed response lengths, spot preemption) at S = 2, 3
# and 4. Prints one markdown row per (S, rule): fifo without resumable groups (the dispatch of
# before), deadline-aware dispatch alone, and both; each with the share of generated tokens
# wasted (stale, preempted, refused), $ per million consumed tokens and learner utilisation, as
# the mean over the seeds with its range.
# Usage: bench/dispatch_sim.sh [path/to/echelon] [seeds (default 3)]
set -euo pipefail
ECHELON=${1:-build/echelon}
SEEDS=${2:-3}
ECHELON=$(realpath "$ECHELON")
CONFIG=$(realpath "$(dirname "$0")/../configs/simulate-mixed-fleet.yaml")
PRICES=$(realpath "$(dirname "$0")/../data/prices.yaml")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
command -v jq >/dev/null || { apt-get update -qq && apt-get install -y -qq jq >/dev/null; }
echo "| S | dispatch, resumable groups | wasted % of generated (stale / preempted) | \$ per M consumed tokens | learner utilisation |"
echo "|---|---|---|---|---|"
for S in 2 3 4; do
  sed "s/^  max_staleness: .*/  max_staleness: $S/; s|^prices: .*|prices: $PRICES|" "$CONFIG" > "$WORK/config.yaml"
  for rule in fifo,off deadline,off deadline,on; do
    dispatch=${rule%,*} resume=${rule#*,}
    for seed in $(seq 1 "$SEEDS"); do
      "$ECHELON" simulate "$WORK/config.yaml" --dispatch "$dispatch" --resume "$resume" --seed "$seed" | tail -1
    done > "$WORK/runs.jsonl"
    jq -rs --arg S "$S" --arg d "$dispatch, $resume" '
      def stat(f): (map(f) | add / length) as $m | (map(f) | min) as $lo | (map(f) | max) as $hi | [$m, $lo, $hi];
      def pct(x): (x * 1000 | round) / 10;
      stat(.wasted_fraction) as $w | stat(.tokens_stale / .tokens_generated) as $s |
      stat(.tokens_preempted / .tokens_generated) as $p | stat(.cost_per_million_consumed_tokens) as $c |
      stat(.utilization) as $u |
      "| \($S) | \($d) | \(pct($w[0])) (\(pct($w[1]))-\(pct($w[2])); \(pct($s[0])) / \(pct($p[0]))) | " +
      "\(($c[0] * 1000 | round) / 1000) (\(($c[1] * 1000 | round) / 1000)-\(($c[2] * 1000 | round) / 1000)) | " +
      "\(($u[0] * 1000 | round) / 1000) |"' "$WORK/runs.jsonl"
  done
done
