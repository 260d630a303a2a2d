#!/usr/bin/env bash
# System test of resumable groups over gRPC: a learner fed by two very slow actor processes
# (its updates wait for them, so their groups stay fresh); one is stopped with SIGTERM, as a spot
# instance's preemption notice would, while its group generates: it reports what its samples drew,
# hands the group back and exits 0, and a fast actor that joins continues the group from there.
# Checks the run completes with every group accounted for and staleness within S, that a group
# was resumed, and that no prefix was refused.
# Usage: tests/resumable_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
INVARIANTS=$(realpath "$(dirname "$0")/run_invariants.py")
source "$(dirname "$0")/lib.sh"
enter_workdir
need_jq

S=4
STEPS=20
echo "s3cret-token-0123456789" > token
timeout 300 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file token --out run \
  --set warmstart.steps=5 --set rl.steps=$STEPS --set rl.groups_per_step=2 --set rl.staleness=$S \
  --set task.eval_size=20 --set eval.every=0 > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
port=$(learner_port learner.out)
check "learner listens" test -n "$port"
start_actor() {  # name slowdown; sets LAST
  "$ECHELON" actor --learner "127.0.0.1:$port" --name "$1" --token-file token --slowdown "$2" > "$1.out" 2> "$1.err" &
  LAST=$!
  PIDS+=("$LAST")
}
step_reached() { grep -c '^step ' learner.out; }
# Each slow group takes seconds: the slow actors are inside one nearly all the time.
start_actor spot0 200; SPOT0=$LAST
start_actor spot1 200; SPOT1=$LAST
for _ in $(seq 1 1200); do [ "$(step_reached)" -ge 2 ] && break; sleep 0.1; done
check "the slow actors carried the first updates" test "$(step_reached)" -ge 2
sleep 1
kill -TERM "$SPOT0" "$SPOT1"
for p in "$SPOT0" "$SPOT1"; do
  wait_exit "$p" 30
  check "a stopped actor exits 0" test $? -eq 0
done
start_actor fast 1.0; FAST=$LAST
wait "$LEARNER"
LEARNER_RC=$?
wait_exit "$FAST"
check "learner exits 0" test "$LEARNER_RC" -eq 0
check "all steps ran" test "$(step_reached)" -eq "$STEPS"
/usr/bin/python3 "$INVARIANTS" run/metrics.jsonl --staleness "$S" --steps "$STEPS" --batch 2 --end final > check.out 2>&1
check "metrics: steps, groups, staleness and counts" grep -q '^ok' check.out
final=$(tail -n 1 run/metrics.jsonl)
check "a stopped actor handed its group back" grep -q "handed back" spot0.err spot1.err
check "the fast actor continued it ($(jq -c .groups_resumed <<< "$final") resumed)" \
  jq -e '.groups_resumed >= 1' <<< "$final" > /dev/null
check "no prefix was refused" \
  jq -e '[.refused | to_entries[] | select(.key | startswith("prefix_"))] | length == 0' <<< "$final" > /dev/null
if [ "$fails" -ne 0 ]; then
  cat check.out
  for f in learner.err spot0.err spot1.err fast.err; do echo "--- $f"; tail -8 "$f"; done
  tail -3 learner.out
  jq -c '{groups_resumed, refused, tokens_by_fate}' <<< "$final"
fi
finish
