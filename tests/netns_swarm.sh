# Hosts in network namespaces joined by a bridge (itself in a namespace, so no traffic touches
# the host's interfaces), for the broadcast's system tests. Source after lib.sh and skip.sh
# with P (a per-run prefix, a few characters: interface names stay under 15) and SUBNET (the
# first three octets) set; every namespace it makes is deleted by name on exit.
#   swarm_bridge                     the bridge; skips (fails under CI=true) where namespaces
#                                    or tc cannot be used
#   swarm_host NAME INDEX TBF...     namespace ${P}NAME at $SUBNET.INDEX, its uplink shaped by
#                                    `tc qdisc add ... root tbf TBF...`
NSES=()
extra_cleanup() {
  for ns in "${NSES[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
swarm_bridge() {
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! ip netns add "${P}br" 2>/dev/null; then
    skip_or_fail "cannot create network namespaces here (needs root, iproute2 and tc)"
  fi
  NSES+=("${P}br")
  ip -n "${P}br" link add br0 type bridge
  ip -n "${P}br" link set br0 up
}
swarm_host() {
  local ns="${P}$1" i=$2
  shift 2
  ip netns add "$ns"
  NSES+=("$ns")
  ip link add "${P}v$i" netns "$ns" type veth peer name "${P}b$i" netns "${P}br"
  ip -n "$ns" addr add "$SUBNET.$i/24" dev "${P}v$i"
  ip -n "$ns" link set "${P}v$i" up
  ip -n "$ns" link set lo up
  ip -n "${P}br" link set "${P}b$i" master br0 up
  ip netns exec "$ns" tc qdisc add dev "${P}v$i" root tbf "$@"
}
