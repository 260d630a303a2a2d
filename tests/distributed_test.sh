#!/usr/bin/env bash
# System test of the distributed planes on loopback: a learner process and 3 actor processes;
# one actor is SIGKILLed mid-run and a new one joins later; an actor with a wrong token is
# refused while the others keep working. Checks the run completes with every group accounted
# for and staleness within S, and that snapshots reached the actors by peer-assisted broadcast.
# Usage: tests/distributed_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
INVARIANTS=$(realpath "$(dirname "$0")/run_invariants.py")
source "$(dirname "$0")/lib.sh"
enter_workdir
need_jq

S=2
STEPS=300
echo "s3cret-token-0123456789" > token
echo "wrong-token" > bad-token
timeout 300 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file token --out run \
  --set warmstart.steps=20 --set rl.steps=$STEPS --set rl.groups_per_step=8 --set rl.staleness=$S \
  --set task.eval_size=50 --set eval.every=0 --set model.num_hidden_layers=1 > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
port=$(learner_port learner.out)
check "learner listens" test -n "$port"
start_actor() {  # name token slowdown; sets LAST
  "$ECHELON" actor --learner "127.0.0.1:$port" --name "$1" --token-file "$2" --slowdown "$3" \
    > "$1.out" 2> "$1.err" &
  LAST=$!
  PIDS+=("$LAST")
}
start_actor a0 token 1.0; A0=$LAST
start_actor a1 token 2.0; A1=$LAST
start_actor a2 token 3.0; A2=$LAST
step_reached() { grep -c '^step ' learner.out; }
for _ in $(seq 1 600); do [ "$(step_reached)" -ge 10 ] && break; sleep 0.1; done
kill -9 "$A1"
timeout 60 "$ECHELON" actor --learner "127.0.0.1:$port" --name intruder --token-file bad-token > intruder.out 2> intruder.err
INTRUDER_RC=$?
for _ in $(seq 1 600); do [ "$(step_reached)" -ge 60 ] && break; sleep 0.1; done
start_actor a3 token 1.0; A3=$LAST
wait "$LEARNER"
LEARNER_RC=$?
# Actors leave on their own once the learner says the run is over (bounded wait).
for p in "$A0" "$A2" "$A3"; do
  wait_exit "$p"
  check "actor $p exits 0 when the run ends" test $? -eq 0
done

check "learner exits 0" test "$LEARNER_RC" -eq 0
check "intruder refused (non-zero exit)" test "$INTRUDER_RC" -ne 0
check "intruder told why" grep -q "wrong bearer token" intruder.err
check "all steps ran" test "$(step_reached)" -eq "$STEPS"
/usr/bin/python3 "$INVARIANTS" run/metrics.jsonl --staleness "$S" --steps "$STEPS" --batch 8 --end final > check.out 2>&1
check "metrics: steps, groups, staleness and counts" grep -q '^ok' check.out
final=$(tail -n 1 run/metrics.jsonl)
check "the killed actor was evicted" jq -e '.refused.evicted >= 1' <<< "$final" > /dev/null
check "the intruder was counted" jq -e '.refused.unauthenticated >= 1' <<< "$final" > /dev/null
check "surviving and late actors contributed" jq -e '.actor_groups | has("a0") and has("a2") and has("a3")' <<< "$final" > /dev/null
timed=$(jq -c 'select(.step != null and .broadcast_s != null) | .broadcast_s' run/metrics.jsonl)
check "snapshots went by broadcast ($(echo "$timed" | grep -c .) of $STEPS steps timed one)" \
  test "$(echo "$timed" | grep -c .)" -ge $((STEPS / 4))
check "broadcast times are sane" jq -se 'all(. >= 0 and . < 60)' <<< "$timed" > /dev/null
for a in a0 a2 a3; do
  check "$a joined the snapshot broadcast" grep -q "joined the snapshot broadcast" $a.err
done
if [ "$fails" -ne 0 ]; then
  cat check.out
  for f in learner.err a0.err a2.err a3.err intruder.err; do echo "--- $f"; tail -8 "$f"; done
  tail -3 learner.out
fi
finish
