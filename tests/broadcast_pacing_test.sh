#!/usr/bin/env bash
# System test of uplink pacing on FIFO links, across network namespaces: an origin and three
# peers, each in its own namespace, joined by a bridge; every host's uplink is a tbf FIFO of
# 40 Mbit/s with a 300 ms queue (a bufferbloated home router). 32 MiB in 4 MiB chunks go to the
# three peers twice: with the peers' default pacing (nothing declared: each finds its uplink
# from its sockets' TCP_INFO) and with --no-pace. Checks: both deliver bit-exactly; each
# listening peer's JSON exit line reports an estimated uplink near the shaped 40 Mbit/s, found
# by itself; paced, a pace near it and its queueing-delay percentiles. (How much queue the pacing
# keeps away is measured by bench/broadcast_netns.sh, docs/BENCHMARKS.md: over a run this short,
# with the receivers' own queues on the acknowledgements' path, one run's delays are too noisy
# to assert on.)
# Everything it creates is named with a per-run prefix and deleted by name on exit. Skips (exit
# 77) where namespaces cannot be created, and fails then under CI=true.
# Usage: tests/broadcast_pacing_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/skip.sh"
P="ebp$$"
SUBNET="10.215.0"
source "$(dirname "$0")/netns_swarm.sh"
enter_workdir

swarm_bridge
set -e
host() { swarm_host "$1" "$2" rate 40mbit burst 64kb latency 300ms; }  # host NAME INDEX
host o 1
for i in 1 2 3; do host "p$i" $((10 + i)); done
set +e

head -c $((32 << 20)) /dev/urandom > file.bin
WANT=$(sha256sum file.bin | cut -d' ' -f1)

# broadcast NAME PEER_FLAGS...: one origin, three listening peers; outputs NAME-*.out
broadcast() {
  local name=$1
  shift
  ip netns exec "${P}o" "$ECHELON" broadcast origin --file file.bin --listen 10.215.0.1:7800 --key origin.key \
    --chunk-mib 4 --expect-peers 3 --exit-when-done --timeout 120 > "$name-origin.out" 2> "$name-origin.err" &
  local origin=$!
  PIDS+=("$origin")
  for _ in $(seq 1 100); do grep -q "listening on" "$name-origin.err" 2>/dev/null && break; sleep 0.1; done
  local peers=()
  for i in 1 2 3; do
    ip netns exec "${P}p$i" "$ECHELON" broadcast peer --origin 10.215.0.1:7800 --listen "10.215.0.$((10 + i)):7801" \
      --out "$name-$i.bin" --origin-key origin.key.pub --name "p$i" --exit-when-done --timeout 120 "$@" \
      > "$name-$i.out" 2> "$name-$i.err" &
    peers+=($!)
    PIDS+=($!)
  done
  wait_exit "$origin" 150
  check "$name: the origin completes" test $? -eq 0
  for i in 1 2 3; do
    wait_exit "${peers[$((i - 1))]}" 30
    check "$name: peer $i writes the file bit-exactly" \
      test "$(sha256sum "$name-$i.bin" 2>/dev/null | cut -d' ' -f1)" = "$WANT"
  done
}
uplink() { tail -n1 "$1" | jq -c .uplink; }

broadcast paced
for i in 1 2 3; do
  u=$(uplink "paced-$i.out")
  echo "paced peer $i: $u"
  check "paced: peer $i estimates its 40 Mbit/s uplink from its sockets (30 to 44)" \
    sh -c "echo '$u' | jq -e '.declared_mbps == null and .estimated_mbps >= 30 and .estimated_mbps <= 44' > /dev/null"
  check "paced: peer $i paced what it served near its uplink's rate (20 to 1.25 x its estimate)" \
    sh -c "echo '$u' | jq -e '.pace_mbps >= 20 and .pace_mbps <= 1.26 * .estimated_mbps' > /dev/null"
  check "paced: peer $i measured its queueing delay (p50 <= p99)" \
    sh -c "echo '$u' | jq -e '.delay_samples >= 5 and .queue_delay_ms.p50 <= .queue_delay_ms.p99' > /dev/null"
done

broadcast unpaced --no-pace
for i in 1 2 3; do
  u=$(uplink "unpaced-$i.out")
  echo "unpaced peer $i: $u"
  check "unpaced: peer $i was not paced" sh -c "echo '$u' | jq -e '.pace_mbps == null' > /dev/null"
done
finish
