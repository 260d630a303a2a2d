#!/usr/bin/env bash
# System test across network namespaces: the learner in one namespace, two actors in two
# others, joined by a bridge in a fourth, so learner and actors talk over real (virtual)
# links with their own addresses. Everything it creates is named with a per-run prefix and
# deleted by name on exit. Skips (exit 77, with a clear message) where namespaces cannot be
# created (not root, no iproute2, no CAP_SYS_ADMIN), and fails then under CI=true.
# Usage: tests/netns_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/skip.sh"
P="ech$$"
NS_BR=${P}br NS_L=${P}l NS_A1=${P}a1 NS_A2=${P}a2
extra_cleanup() {
  for ns in "$NS_L" "$NS_A1" "$NS_A2" "$NS_BR"; do ip netns del "$ns" 2>/dev/null; done
}
enter_workdir

if ! command -v ip >/dev/null || ! ip netns add "$NS_BR" 2>/dev/null; then
  skip_or_fail "cannot create network namespaces here (needs root and iproute2)"
fi
set -e
ip netns exec "$NS_BR" ip link add br0 type bridge
ip netns exec "$NS_BR" ip link set br0 up
i=1
for ns in "$NS_L" "$NS_A1" "$NS_A2"; do
  ip netns add "$ns"
  ip link add "${P}v$i" type veth peer name "${P}p$i"
  ip link set "${P}v$i" netns "$ns"
  ip link set "${P}p$i" netns "$NS_BR"
  ip netns exec "$ns" ip link set "${P}v$i" name eth0
  ip netns exec "$ns" ip addr add "10.213.7.$i/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$NS_BR" ip link set "${P}p$i" master br0
  ip netns exec "$NS_BR" ip link set "${P}p$i" up
  i=$((i + 1))
done
set +e
LEARNER_IP=$(ip netns exec "$NS_L" ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
echo "netns-token-0123456789" > token
STEPS=120
ip netns exec "$NS_L" timeout 300 "$ECHELON" learner "$CONFIG" --listen "$LEARNER_IP:7700" --token-file token \
  --out run --set warmstart.steps=10 --set rl.steps=$STEPS --set rl.groups_per_step=8 --set task.eval_size=50 \
  --set eval.every=0 --set model.num_hidden_layers=1 --set rollout.wait_for_actors=2 > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
for ns in "$NS_A1" "$NS_A2"; do
  ip netns exec "$ns" "$ECHELON" actor --learner "$LEARNER_IP:7700" --token-file token --name "$ns" \
    > "$ns.out" 2> "$ns.err" &
  PIDS+=("$!")
done
wait "$LEARNER"
RC=$?
check "learner in its namespace completes" test "$RC" -eq 0
check "all $STEPS steps ran" test "$(grep -c '^step ' learner.out)" -eq "$STEPS"
check "both actors, each in its own namespace, contributed" \
  python3 -c "import json,sys; f=[json.loads(l) for l in open('run/metrics.jsonl')][-1]; sys.exit(0 if len(f['actor_groups'])==2 and min(f['actor_groups'].values())>0 else 1)"
for ns in "$NS_A1" "$NS_A2"; do
  check "$ns joined the snapshot broadcast across namespaces" grep -q "joined the snapshot broadcast at $LEARNER_IP:" "$ns.err"
done
check "snapshots went by broadcast" test "$(grep -c '"broadcast_s"' run/metrics.jsonl)" -gt 0
[ "$fails" -eq 0 ] || { tail -20 learner.err; tail -n 5 ./*a1.err ./*a2.err; }
finish
