#!/usr/bin/env bash
# System test of a pipelined rollout worker across network namespaces: a learner, a
# single-process actor, and a 3-stage pipeline actor (one process and one namespace per stage),
# on a bridge with every link shaped by tc tbf. They train the default job; mid-run stage 1 is
# SIGKILLed and started again. The run must finish with every count adding up (no group lost or
# consumed twice), the head's in-flight groups re-issued when its stage died, the pipeline
# re-formed, and the head contributing groups both before the kill and after the restart.
# Everything it creates is named with a per-run prefix and deleted by name on exit. Skips
# (exit 77) where namespaces cannot be created, and fails then under CI=true.
# Usage: tests/pipeline_actor_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
ROOT=$(realpath "$(dirname "$0")/..")
CONFIG=$ROOT/configs/math-tiny.yaml
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/skip.sh"
P="epa$$"
NAMES=(l a s0 s1 s2)
extra_cleanup() {
  for n in "${NAMES[@]}" br; do ip netns del "$P$n" 2>/dev/null; done
}
enter_workdir

if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! ip netns add "${P}br" 2>/dev/null; then
  skip_or_fail "cannot create network namespaces here (needs root, iproute2 and tc)"
fi
set -e
ip netns exec "${P}br" ip link add br0 type bridge
ip netns exec "${P}br" ip link set br0 up
i=1
for n in "${NAMES[@]}"; do
  ns=$P$n
  ip netns add "$ns"
  ip link add "${P}v$i" type veth peer name "${P}p$i"
  ip link set "${P}v$i" netns "$ns"
  ip link set "${P}p$i" netns "${P}br"
  ip netns exec "$ns" ip link set "${P}v$i" name eth0
  ip netns exec "$ns" ip addr add "10.214.9.$i/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" ip link set lo up
  # 200 Mbit/s out of every namespace: activations and snapshots cross real, shaped links (the
  # burst above the largest GSO segment, 64 KiB, or tbf drops those for good).
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 200mbit burst 256kb latency 50ms
  ip netns exec "${P}br" ip link set "${P}p$i" master br0
  ip netns exec "${P}br" ip link set "${P}p$i" up
  i=$((i + 1))
done
set +e
LEARNER=10.214.9.1
echo "pipeline-test-token-0123456789" > token
STEPS=60
# 4 registrations before the first step: the single actor and the pipeline's three stages.
ip netns exec "${P}l" timeout 600 "$ECHELON" learner "$CONFIG" --listen "$LEARNER:7700" --token-file token \
  --out run --set warmstart.steps=10 --set rl.steps=$STEPS --set rl.groups_per_step=8 --set task.eval_size=50 \
  --set eval.every=0 --set rollout.wait_for_actors=4 > learner.out 2> learner.err &
LEARNER_PID=$!
PIDS+=("$LEARNER_PID")
stage() {  # stage I: its process in namespace s$I, listening on 7801 there
  ip netns exec "${P}s$1" "$ECHELON" actor --learner "$LEARNER:7700" --token-file token --name "pipe-$1" \
    --pipeline box --stage "$1/3" --stage-listen "10.214.9.$((3 + $1)):7801" --stage-timeout 20 \
    >> "s$1.out" 2>> "s$1.err" &
  PIDS+=("$!")
  eval "S$1=$!"
}
stage 2
stage 1
stage 0
# The single actor 10x slower than it can be, so the pipeline (three processes sharing two
# cores) takes a fair share and the run lasts past the restart.
ip netns exec "${P}a" "$ECHELON" actor --learner "$LEARNER:7700" --token-file token --name single --slowdown 10 \
  > a.out 2> a.err &
PIDS+=("$!")

# groups the head has had accepted, per the last metrics line
head_groups() {
  python3 -c "import json; f=[json.loads(l) for l in open('run/metrics.jsonl')]; print(f[-1].get('actor_groups', {}).get('pipe-0', 0) if f else 0)" 2>/dev/null || echo 0
}
for _ in $(seq 1 1800); do
  [ "$(head_groups)" -ge 6 ] && break
  kill -0 "$LEARNER_PID" 2>/dev/null || break
  sleep 0.1
done
BEFORE=$(head_groups)
check "the pipeline head contributed groups before the kill ($BEFORE)" test "$BEFORE" -ge 6
kill -9 "$S1"
sleep 4
stage 1
for _ in $(seq 1 1800); do
  [ "$(head_groups)" -ge $((BEFORE + 4)) ] && break
  kill -0 "$LEARNER_PID" 2>/dev/null || break
  sleep 0.1
done
AFTER=$(head_groups)
check "the head contributed again once stage 1 was back ($BEFORE -> $AFTER)" test "$AFTER" -ge $((BEFORE + 4))
wait "$LEARNER_PID"
RC=$?
check "learner completes" test "$RC" -eq 0
check "all $STEPS steps ran" test "$(grep -c '^step ' learner.out)" -eq "$STEPS"
check "counts add up, no group consumed twice" \
  /usr/bin/python3 "$ROOT/tests/run_invariants.py" run/metrics.jsonl --staleness 2 --steps "$STEPS" --end final
check "the head's groups in flight through the dead stage were re-issued" \
  grep -q "re-issuing the groups of pipeline head" learner.err
check "the pipeline formed, and formed again after the restart" \
  test "$(grep -c 'pipeline box formed' learner.err)" -ge 2
check "the single actor contributed too" \
  python3 -c "import json,sys; f=[json.loads(l) for l in open('run/metrics.jsonl')][-1]; sys.exit(0 if f['actor_groups'].get('single', 0) > 0 else 1)"
check "the restarted stage 1 served its layer" grep -q "this stage holds layers 1-1" s1.err
for s in 0 1 2; do
  wait_exit "$(eval echo "\$S$s")" 30 >/dev/null
done
check "every stage left when the run ended" test "$(grep -l 'run finished)' s0.err s1.err s2.err | wc -l)" -eq 3
[ "$fails" -eq 0 ] || { tail -20 learner.err; tail -n 8 s0.err s1.err s2.err a.err; }
finish
