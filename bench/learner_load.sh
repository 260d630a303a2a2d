#!/usr/bin/env bash
# Load test of one learner: `echelon learner` (a tiny model, so the learner's own work is
# small and the RPC path is what is measured) serving N synthetic actors from
# `echelon_testkit load-actors` over loopback. Each actor has its own worker token, registers,
# heartbeats every second, asks for work with the real actors' idle backoff (2 ms doubling to
# 64 ms), takes GROUP_SECONDS to "generate" a group, and submits a valid one. For each N the
# load runs SECONDS; the script reports RPCs per second, p50/p99 latency, honest refusals and
# errors, and the learner's resident memory. The answer: the largest N with no honest request
# refused and p99 latency under 1 s.
# Usage: bench/learner_load.sh [path/to/echelon [path/to/echelon_testkit]]
#   env: NS ("100 300 1000"), SECONDS_EACH (30), GROUP_SECONDS (2)
set -euo pipefail
ECHELON=$(realpath "${1:-$(dirname "$0")/../build/echelon}")
TESTKIT=$(realpath "${2:-$(dirname "$0")/../build/echelon_testkit}")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
NS=${NS:-"100 300 1000"}
SECONDS_EACH=${SECONDS_EACH:-30}
GROUP_SECONDS=${GROUP_SECONDS:-2}
command -v jq > /dev/null || apt-get install -y -q jq > /dev/null
WORK=$(mktemp -d)
LEARNER=""
cleanup() {
  [ -n "$LEARNER" ] && kill -9 "$LEARNER" 2> /dev/null
  wait 2> /dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
cd "$WORK"
max=0
for n in $NS; do [ "$n" -gt "$max" ] && max=$n; done
for i in $(seq 0 $((max - 1))); do echo "load-$i $(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"; done > workers
"$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file workers --out run \
  --set model.hidden_size=32 --set model.num_hidden_layers=1 --set model.num_attention_heads=2 \
  --set model.num_key_value_heads=1 --set model.head_dim=16 --set model.intermediate_size=64 \
  --set warmstart.steps=5 --set rl.steps=1000000 --set task.eval_size=20 --set eval.every=0 \
  --set checkpoint.every=0 --set rollout.verify_fraction=0 > learner.out 2> learner.err &
LEARNER=$!
for _ in $(seq 1 600); do grep -q "serving actors on port" learner.out 2> /dev/null && break; sleep 0.1; done
port=$(sed -n 's/^learner serving actors on port \([0-9]*\)$/\1/p' learner.out)
[ -n "$port" ] || { echo "learner did not start" >&2; tail learner.err >&2; exit 1; }
echo "| actors | RPC/s | p50 acquire ms | p99 acquire ms | p99 submit ms | p99 all ms | groups accepted | honest refusals | errors | learner RSS MB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
best=0
for n in $NS; do
  "$TESTKIT" load-actors "127.0.0.1:$port" workers "$n" "$SECONDS_EACH" "$GROUP_SECONDS" > load-$n.json
  rss=$(awk '/^VmRSS/ {print int($2 / 1024)}' /proc/$LEARNER/status)
  j=$(cat load-$n.json)
  refused=$(echo "$j" | jq '[.counts | to_entries[] | select(.key | startswith("refused_")) | .value] | add // 0')
  errors=$(echo "$j" | jq '[.counts | to_entries[] | select(.key | startswith("error_")) | .value] | add // 0')
  p99=$(echo "$j" | jq '.p99_s.all')
  printf "| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %s |\n" "$(echo "$j" | jq .actors)" \
    "$(echo "$j" | jq .rpc_per_s)" "$(echo "$j" | jq '.p50_s.acquire * 1000')" "$(echo "$j" | jq '.p99_s.acquire * 1000')" \
    "$(echo "$j" | jq '.p99_s.submit * 1000')" "$(echo "$j" | jq "$p99 * 1000")" "$(echo "$j" | jq '.counts.accepted // 0')" \
    "$refused" "$errors" "$rss"
  if [ "$refused" = 0 ] && [ "$errors" = 0 ] && jq -ne "$p99 < 1" > /dev/null; then best=$n; fi
  sleep 5  # the actors of this round are evicted before the next
done
echo
echo "largest N with no honest refusal and p99 < 1 s: $best"
