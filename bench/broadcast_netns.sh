#!/usr/bin/env bash
# Weight-broadcast benchmark on real links: one origin and up to 16 peers, each in its own
# network namespace, joined by a bridge (itself in a namespace, so no traffic touches the
# host's interfaces). Every sender's veth is shaped with
#   tc qdisc add dev X root tbf rate 100mbit burst 1mbit latency 50ms
# (a FIFO queue of 50 ms, as a home router's; QUEUE_MS=500 for a deep one) so each host uploads
# at ~100 Mbit/s and downloads freely. Times `echelon broadcast` in star
# mode (the origin sends the whole file to every peer) and peer-assisted mode for N in
# {1, 2, 4, 8, 16} with a 128 MiB file, as measured by the origin (publish -> last peer holds
# every verified chunk); T1 = star with N = 1 (one origin -> peer transfer) in the same run.
# Then kills 2 of 8 peers (SIGKILL) at about T1/2 and times the 6 survivors. Then mixed links:
# 4 peers at RATE and 4 at RATE/10, against the capacity bound (8 files over the total upload),
# without and with the endgame (origin --endgame-ratio 0, and 3: the default), and with the slow peers declaring their
# rate (peer --upload-mbps). Then 2 of 8 peers behind NAT
# (--no-listen: they only dial out and never relay). Then deltas: a
# FILE_MIB safetensors file of bf16 weights (normal, std 0.02) and its next version with 2% of
# the elements moved by one bf16 step (what a small learning rate does to a bf16 model), sent
# to 8 peers whole and as deltas (origin --delta-from, peers --have; one transfer per upload slot,
# then the default of up to 8): time and bytes received.
# Prints a markdown table. Needs root. Everything it creates is named with a unique prefix
# and deleted by name on exit.
# Usage: sudo bench/broadcast_netns.sh [path/to/echelon]
#   env: FILE_MIB (128), NS_LIST ("1 2 4 8 16"), RATE (100mbit), CHUNK_MIB (0: the origin's
#        default, about 1024 chunks of 1 to 64 MiB: 1 MiB for 128 MiB),
#        SKIP_STAR=1 (peer-assisted only, for quick iterations), DELTA_FRACTION (0.02),
#        PARTS ("scale mixed nat delta compete": which parts run; ONLY_DELTA=1 means PARTS=delta),
#        LINK_QDISC (fifo: tbf as above; ackprio: the same rate and queue, but small packets,
#        TCP ACKs and HTTP/2 window updates, are sent first, so a host's ACKs do not wait
#        behind its own uploads),
#        DECLARE_ALL=1 (every peer declares its rate, --upload-mbps, in every run),
#        PACE=0 (no peer paces its uploads: --no-pace; by default each finds its uplink's rate
#        and queue from TCP_INFO, or paces to 95% of a declared rate; the origin is not paced),
#        QUEUE_MS (50: the FIFO queue of each tbf shaper, ms),
#        TRACE_DIR (keep each run's origin --trace there, as NN-MODE-N.jsonl: one line per transfer)
set -euo pipefail
ECHELON=$(realpath "${1:-$(dirname "$0")/../build/echelon}")
FILE_MIB=${FILE_MIB:-128}
NS_LIST=${NS_LIST:-"1 2 4 8 16"}
RATE=${RATE:-100mbit}
CHUNK_MIB=${CHUNK_MIB:-0}
MAXN=16
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc)" >&2; exit 2; }
command -v ip > /dev/null && command -v tc > /dev/null || apt-get install -y -q iproute2 > /dev/null
command -v python3 > /dev/null || { echo "needs python3 (parses the origin's JSON line)" >&2; exit 2; }
# Debian's Python with numpy (writes the bf16 files of the delta part)
/usr/bin/python3 -c "import numpy" 2> /dev/null || apt-get install -y -q python3-numpy > /dev/null

P="eb$$"            # unique prefix: interface names stay under 15 characters
BR_NS="${P}br"
NSES=("$BR_NS")
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill -9 "$p" 2> /dev/null; done
  wait 2> /dev/null
  for ns in "${NSES[@]}"; do ip netns del "$ns" 2> /dev/null; done  # deletes their veths too
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# Mbit/s of a tc rate (kbit/mbit/gbit)
mbps() { python3 -c "import re; n, u = re.match(r'([0-9.]+)([kmg]?)', '$1'.lower()).groups(); print('%g' % (float(n) * {'k': 1e-3, 'm': 1, 'g': 1e3}.get(u, 1e-6)))"; }
shape() {  # shape NAME INDEX RATE add|change: the host's egress, as LINK_QDISC says
  local ns="${P}$1" dev="${P}v$2" rate=$3
  if [ "${LINK_QDISC:-fifo}" = fifo ]; then
    ip netns exec "$ns" tc qdisc "$4" dev "$dev" root tbf rate "$rate" burst 1mbit latency "${QUEUE_MS:-50}ms"
    return
  fi
  # ackprio: the same rate and 50 ms of queue, but packets under 128 bytes (TCP ACKs, HTTP/2
  # window updates and pings) go first, as an SQM home router or a modem with ACK priority does.
  local queue
  queue=$(python3 -c "print(int($(mbps "$rate") * 1e6 / 8 * 0.05) + 125000)")  # 50 ms + the burst, bytes
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2> /dev/null || true
  ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 20
  ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" burst 125k cburst 125k
  ip netns exec "$ns" tc class add dev "$dev" parent 1:1 classid 1:10 htb rate 8kbit ceil "$rate" prio 0 quantum 1514
  ip netns exec "$ns" tc class add dev "$dev" parent 1:1 classid 1:20 htb rate 8kbit ceil "$rate" prio 1 quantum 1514
  ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:10 bfifo limit "$queue"
  ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:20 bfifo limit "$queue"
  ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff \
    match u16 0x0000 0xff80 at 2 classid 1:10
}
host() {  # host NAME INDEX: a namespace with one veth into the bridge, shaped on egress
  local ns="${P}$1" addr="10.77.0.$2"
  ip netns add "$ns"
  NSES+=("$ns")
  ip link add "${P}v$2" netns "$ns" type veth peer name "${P}b$2" netns "$BR_NS"
  ip -n "$ns" addr add "$addr/24" dev "${P}v$2"
  ip -n "$ns" link set "${P}v$2" up
  ip -n "$ns" link set lo up
  ip -n "$BR_NS" link set "${P}b$2" master "${P}br0" up
  shape "$1" "$2" "$RATE" add
}
ip netns add "$BR_NS"
ip -n "$BR_NS" link add "${P}br0" type bridge
ip -n "$BR_NS" link set "${P}br0" up
host o 1
for i in $(seq 1 $MAXN); do host "p$i" $((10 + i)); done

head -c $((FILE_MIB << 20)) /dev/urandom > "$WORK/snap.bin"
WANT=$(sha256sum "$WORK/snap.bin" | cut -d' ' -f1)

# run MODE N [KILL_AT_SECONDS]: prints the origin's completion seconds, live and dead peers,
# origin sends, the peers' mean bytes received and the endgame's duplicate sends; checks every
# survivor's file. The file is $FILE (expected SHA-256 $WANT); ORIGIN_ARGS / PEER_ARGS add flags
# (deltas, the endgame); the peers numbered in NAT_PEERS run with --no-listen.
FILE="$WORK/snap.bin"
ORIGIN_ARGS=()
PEER_ARGS=()
NAT_PEERS=""
declare -A DECLARE=()  # peer number -> the --upload-mbps it declares
if [ -n "${DECLARE_ALL:-}" ]; then for i in $(seq 1 $MAXN); do DECLARE[$i]=$(mbps "$RATE"); done; fi
run() {
  local mode=$1 n=$2 kill_at=${3:-}
  local dir="$WORK/$mode-$n${kill_at:+-kill}"
  rm -rf "$dir"  # a peer that fails must not find the previous run's file
  mkdir -p "$dir"
  ip netns exec "${P}o" timeout 900 "$ECHELON" broadcast origin --file "$FILE" "${ORIGIN_ARGS[@]}" --listen 10.77.0.1:7800 \
    --key "$WORK/origin.key" --mode "$mode" --chunk-mib "$CHUNK_MIB" --expect-peers "$n" --exit-when-done \
    --timeout 880 --trace "$dir/trace.jsonl" > "$dir/origin.out" 2> "$dir/origin.err" &
  local origin=$!
  PIDS+=("$origin")
  for _ in $(seq 1 100); do grep -q "listening on" "$dir/origin.err" 2> /dev/null && break; sleep 0.1; done
  local peers=()
  for i in $(seq 1 "$n"); do
    # no `timeout` wrapper: `ip netns exec` execs, so $! is the peer itself (SIGKILL reaches it);
    # --timeout bounds it instead.
    local listen=(--listen "10.77.0.$((10 + i)):7801")
    [[ " $NAT_PEERS " == *" $i "* ]] && listen=(--no-listen)
    [ -n "${DECLARE[$i]:-}" ] && listen+=(--upload-mbps "${DECLARE[$i]}")
    [ "${PACE:-1}" = 0 ] && listen+=(--no-pace)
    ip netns exec "${P}p$i" "$ECHELON" broadcast peer --origin 10.77.0.1:7800 \
      "${listen[@]}" --out "$dir/out$i.bin" --origin-key "$WORK/origin.key.pub" --name "p$i" "${PEER_ARGS[@]}" \
      --exit-when-done --timeout 880 > "$dir/peer$i.out" 2> "$dir/peer$i.err" &
    peers+=($!)
    PIDS+=($!)
  done
  local killed=()
  if [ -n "$kill_at" ]; then
    for _ in $(seq 1 600); do grep -q "published version" "$dir/origin.err" 2> /dev/null && break; sleep 0.05; done
    sleep "$kill_at"
    for i in 3 6; do kill -9 "${peers[$((i - 1))]}" 2> /dev/null; killed+=("$i"); done
  fi
  wait "$origin" || { echo "origin failed ($mode N=$n): $(tail -n3 "$dir/origin.err")" >&2; return 1; }
  for i in $(seq 1 "$n"); do
    wait "${peers[$((i - 1))]}" 2> /dev/null || true
    [[ " ${killed[*]} " == *" $i "* ]] && continue
    local got
    got=$(sha256sum "$dir/out$i.bin" 2> /dev/null | cut -d' ' -f1)
    [ "$got" = "$WANT" ] || { echo "peer $i of $mode N=$n has a wrong or missing file" >&2; return 1; }
  done
  if [ -n "${TRACE_DIR:-}" ]; then  # numbered in run order (run is called in subshells)
    cp "$dir/trace.jsonl" "$TRACE_DIR/$(printf %02d $(($(ls "$TRACE_DIR" | wc -l) + 1)))-$(basename "$dir").jsonl"
  fi
  python3 - "$dir" "$n" "$WORK/uplinks.txt" "$mode-$n${kill_at:+-kill}" <<'PY'
import glob, json, statistics, sys
d = json.loads(open(sys.argv[1] + "/origin.out").read().strip().splitlines()[-1])
ends = [json.loads(open(f).read().strip().splitlines()[-1]) for f in sorted(glob.glob(sys.argv[1] + "/peer*.out"))
        if open(f).read().strip()]
got = [e["bytes_received"] for e in ends]
print("%.2f %d %d %d %d %d" % (d["seconds"], d["peers"], d["dead"], d["origin_sends"], sum(got) / max(1, len(got)),
                              d["endgame"]))
# the nodes' uplinks as their pacers saw them: origin, then the median and the worst peer
ups = [e["uplink"] for e in ends if e.get("uplink") and e["uplink"]["delay_samples"]]
def fig(values, how):
    values = [v for v in values if v is not None]
    return "-" if not values else "%.1f" % how(values)
o = d.get("uplink") or {}
with open(sys.argv[3], "a") as f:
    f.write("| %s | %s / %s | %s / %s | %s / %s | %s / %s |\n" % (
        sys.argv[4], fig([o.get("estimated_mbps")], max), fig([o.get("queue_delay_ms", {}).get("p99")], max),
        fig([u["estimated_mbps"] for u in ups], statistics.median), fig([u["pace_mbps"] for u in ups], statistics.median),
        fig([u["queue_delay_ms"]["p50"] for u in ups], statistics.median), fig([u["queue_delay_ms"]["p50"] for u in ups], max),
        fig([u["queue_delay_ms"]["p99"] for u in ups], statistics.median), fig([u["queue_delay_ms"]["p99"] for u in ups], max)))
PY
}

# delta_files OUT_DIR: base.safetensors and next.safetensors (bf16, FILE_MIB) as described above.
delta_files() {
  /usr/bin/python3 - "$1" "$FILE_MIB" "${DELTA_FRACTION:-0.02}" <<'PY'
import json, struct, sys
import numpy as np
out, mib, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(1)
n = (mib << 20) // 2 - 64
w = (rng.standard_normal(n, dtype=np.float32) * 0.02).view(np.uint32)
base = (w >> 16).astype(np.uint16)  # bf16: the high half of the float32
nxt = base.copy()
idx = rng.choice(n, int(n * fraction), replace=False)
step = np.where(rng.random(idx.size) < 0.5, 1, -1).astype(np.int32)
nxt[idx] = (nxt[idx].astype(np.int32) + step).astype(np.uint16)  # one bf16 step up or down
header = json.dumps({"w": {"dtype": "BF16", "shape": [int(n)], "data_offsets": [0, int(n) * 2]}}).encode()
header += b" " * (-(8 + len(header)) % 8)
for name, data in (("base", base), ("next", nxt)):
    with open("%s/%s.safetensors" % (out, name), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data.tobytes())
PY
}

run_delta() {
  delta_files "$WORK"
  FILE="$WORK/next.safetensors"
  WANT=$(sha256sum "$FILE" | cut -d' ' -f1)
  ORIGIN_ARGS=()
  PEER_ARGS=()
  read -r FULL_S _ _ _ FULL_BYTES _ < <(run peer 8)
  PEER_ARGS=(--have "$WORK/base.safetensors")
  ORIGIN_ARGS=(--delta-from "$WORK/base.safetensors" --transfers-per-slot 1)
  read -r ONE_S _ _ _ ONE_BYTES _ < <(run peer 8)
  ORIGIN_ARGS=(--delta-from "$WORK/base.safetensors")
  read -r DELTA_S _ _ _ DELTA_BYTES _ < <(run peer 8)
  echo
  echo "Deltas: $FILE_MIB MiB of bf16 weights, $(python3 -c "print('%g%%' % (100 * ${DELTA_FRACTION:-0.02}))") of the elements moved by one bf16 step, 8 peers (peer-assisted), SHA-256 checked on every peer."
  echo
  echo "| sent as | seconds | bytes received per peer (mean) | of the file |"
  echo "|---|---|---|---|"
  echo "| whole | $FULL_S | $FULL_BYTES | $(python3 -c "print('%.1f%%' % (100 * $FULL_BYTES / ($FILE_MIB << 20)))") |"
  echo "| deltas, one transfer per slot (\`--transfers-per-slot 1\`) | $ONE_S | $ONE_BYTES | $(python3 -c "print('%.1f%%' % (100 * $ONE_BYTES / ($FILE_MIB << 20)))") |"
  echo "| deltas (default: up to 8 per slot) | $DELTA_S | $DELTA_BYTES | $(python3 -c "print('%.1f%%' % (100 * $DELTA_BYTES / ($FILE_MIB << 20)))") |"
  echo
  echo "Deltas take $(python3 -c "print('%.3f' % ($DELTA_S / $FULL_S))") x the time of whole chunks ($(python3 -c "print('%.3f' % ($ONE_S / $FULL_S))") with one transfer per slot)."
}
# compete: a household's bulk download into peer 1 (from a server namespace whose egress is
# shaped to RATE, as a download from the internet arrives) while peer 1 takes part in a
# broadcast to 8 peers; its throughput against the same download on an idle link. The
# download's acknowledgements leave through peer 1's shaped uplink, behind its broadcast
# uploads: what pacing keeps short.
compete_download() {  # compete_download SECONDS: Mbit/s of a bulk download from srv into p1
  ip netns exec "${P}p1" /usr/bin/python3 - "$1" <<'PY'
import socket, sys, time
s = socket.create_connection(("10.77.0.2", 9000), timeout=10)
end = time.monotonic() + float(sys.argv[1])
got = 0
first = None
while time.monotonic() < end:
    n = len(s.recv(1 << 20))
    if n == 0:
        break
    if first is None:
        first = time.monotonic()
    got += n
print("%.1f" % (got * 8e-6 / (time.monotonic() - first)))
PY
}
run_compete() {
  ip netns exec "${P}srv" /usr/bin/python3 -c '
import socket, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("10.77.0.2", 9000))
srv.listen(8)
def serve(c):
    block = b"\0" * (1 << 20)
    try:
        while True:
            c.sendall(block)
    except OSError:
        pass
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
' &
  PIDS+=($!)
  sleep 1
  local window
  window=$(python3 -c "print(round($T1 * 0.7, 1))")  # inside the broadcast, which takes about T1 or more
  IDLE=$(compete_download "$window")
  echo
  echo "Competing download into peer 1 (fed at $RATE; its ACKs leave through peer 1's shaped uplink), over ${window} s from the start of a broadcast to 8 peers; on an idle link $IDLE Mbit/s."
  echo
  echo "| peers | download, Mbit/s | of idle | broadcast (s) | / T1 |"
  echo "|---|---|---|---|---|"
  local saved=${PACE:-1} busy took
  for PACE in 1 0; do
    local dir="$WORK/peer-8"
    rm -f "$dir/origin.err"
    run peer 8 > "$WORK/compete-run.txt" &
    local bc=$!
    for _ in $(seq 1 600); do grep -q "published version" "$dir/origin.err" 2> /dev/null && break; sleep 0.05; done
    busy=$(compete_download "$window")
    wait "$bc"
    read -r took _ _ _ _ _ < "$WORK/compete-run.txt"
    echo "| $([ "$PACE" = 1 ] && echo "paced (default)" || echo "not paced (--no-pace)") | $busy | $(python3 -c "print('%.0f%%' % (100 * $busy / $IDLE))") | $took | $(ratio "$took") |"
  done
  PACE=$saved
}

PARTS=${PARTS:-"scale mixed nat delta compete"}
[ -n "${ONLY_DELTA:-}" ] && PARTS=delta
ratio() { [ "$1" = - ] && echo - || python3 -c "print('%.2f' % ($1 / $T1))"; }
if [[ " $PARTS " == *" scale "* || " $PARTS " == *" mixed "* || " $PARTS " == *" nat "* || " $PARTS " == *" compete "* ]]; then
  read -r T1 _ _ _ _ _ < <(run star 1)  # T1: one origin -> peer transfer, this run
  echo
  echo "$FILE_MIB MiB file, --chunk-mib $CHUNK_MIB (0: auto), every sender shaped to $RATE (LINK_QDISC ${LINK_QDISC:-fifo}) unless said; seconds from publish to the last peer holding every verified chunk. T1 = $T1 s (star, N = 1)."
fi

if [[ " $PARTS " == *" scale "* ]]; then
  declare -A STAR PEER
  STAR[1]=$T1
  for n in $NS_LIST; do
    if [ "$n" != 1 ]; then
      if [ -n "${SKIP_STAR:-}" ]; then STAR[$n]=-; else read -r s _ _ _ _ _ < <(run star "$n"); STAR[$n]=$s; fi
    fi
    read -r s _ _ _ _ _ < <(run peer "$n"); PEER[$n]=$s
  done
  KILL_AT=$(python3 -c "print(round($T1 / 2, 2))")
  read -r KILL_S KILL_LIVE KILL_DEAD _ _ _ < <(run peer 8 "$KILL_AT")
  echo
  echo "| N | star (s) | star / T1 | peer-assisted (s) | peer-assisted / T1 |"
  echo "|---|---|---|---|---|"
  for n in $NS_LIST; do
    echo "| $n | ${STAR[$n]} | $(ratio "${STAR[$n]}") | ${PEER[$n]} | $(ratio "${PEER[$n]}") |"
  done
  echo
  echo "Kill 2 of 8 peers (SIGKILL) ${KILL_AT} s after publishing: $KILL_LIVE survivors finished with the correct SHA-256 in $KILL_S s = $(ratio "$KILL_S") x T1 ($KILL_DEAD peers reported dead)."
  if [[ " $NS_LIST " == *" 4 "* && " $NS_LIST " == *" 16 "* ]]; then
    echo "Peer-assisted growth from N = 4 to N = 16: $(python3 -c "print('%.1f%%' % (100 * (${PEER[16]} / ${PEER[4]} - 1)))")."
  fi
fi

if [[ " $PARTS " == *" mixed "* ]]; then
  # a tenth of RATE, in Mbit/s (tc's kbit/mbit/gbit), for tc and for --upload-mbps
  SLOW_MBPS=$(python3 -c "print('%g' % ($(mbps "$RATE") / 10))")
  SLOW_RATE="${SLOW_MBPS}mbit"
  for i in 5 6 7 8; do shape "p$i" $((10 + i)) "$SLOW_RATE" change; done
  # with DECLARE_ALL every peer declares its own rate in every run; else only the slow ones, last
  if [ -n "${DECLARE_ALL:-}" ]; then for i in 5 6 7 8; do DECLARE[$i]=$SLOW_MBPS; done; fi
  ORIGIN_ARGS=(--endgame-ratio 0)
  read -r MIX0 _ _ _ _ _ < <(run peer 8)
  ORIGIN_ARGS=(--endgame-ratio 3)  # the default
  read -r MIX3 _ _ _ _ MIX3_COPIES < <(run peer 8)
  for i in 5 6 7 8; do DECLARE[$i]=$SLOW_MBPS; done
  read -r MIXD _ _ _ _ MIXD_COPIES < <(run peer 8)
  for i in 5 6 7 8; do
    if [ -n "${DECLARE_ALL:-}" ]; then DECLARE[$i]=$(mbps "$RATE"); else unset "DECLARE[$i]"; fi
  done
  ORIGIN_ARGS=()
  for i in 5 6 7 8; do shape "p$i" $((10 + i)) "$RATE" change; done
  BOUND=$(python3 -c "print('%.2f' % ($T1 * 8 / (1 + 4 + 0.4)))")
  echo
  echo "Mixed links, 8 peers: 4 at $RATE, 4 at $SLOW_RATE; capacity bound $BOUND s (8 files over the total upload)."
  echo
  echo "| endgame | seconds | / T1 | / capacity bound | duplicate sends |"
  echo "|---|---|---|---|---|"
  echo "| off | $MIX0 | $(ratio "$MIX0") | $(python3 -c "print('%.2f' % ($MIX0 / $BOUND))") | 0 |"
  echo "| ratio 3 | $MIX3 | $(ratio "$MIX3") | $(python3 -c "print('%.2f' % ($MIX3 / $BOUND))") | $MIX3_COPIES |"
  echo "| ratio 3, slow peers declare --upload-mbps $SLOW_MBPS | $MIXD | $(ratio "$MIXD") | $(python3 -c "print('%.2f' % ($MIXD / $BOUND))") | $MIXD_COPIES |"
fi

if [[ " $PARTS " == *" nat "* ]]; then
  ORIGIN_ARGS=(--endgame-ratio 3)
  read -r EQ8 _ _ _ _ EQ8_COPIES < <(run peer 8)
  ORIGIN_ARGS=()
  NAT_PEERS="7 8"
  read -r NAT_S NAT_LIVE _ _ _ _ < <(run peer 8)
  NAT_PEERS=""
  echo
  echo "Equal links, 8 peers, origin --endgame-ratio 3: $EQ8 s = $(ratio "$EQ8") x T1, $EQ8_COPIES duplicate sends."
  echo "2 of 8 peers behind NAT (--no-listen: they only dial out and never relay): $NAT_LIVE peers finished with the correct SHA-256 in $NAT_S s = $(ratio "$NAT_S") x T1."
fi

if [[ " $PARTS " == *" compete "* ]]; then
  host srv 2  # the household's download comes from here
  run_compete
fi

if [[ " $PARTS " == *" delta "* ]]; then
  run_delta
fi

if [ -s "$WORK/uplinks.txt" ]; then
  echo
  echo "Uplinks as each node's pacer saw them (Mbit/s, queueing delay in ms; peers: median / worst):"
  echo
  echo "| run | origin estimated / delay p99 | peers estimated / pace | peers delay p50 | peers delay p99 |"
  echo "|---|---|---|---|---|"
  cat "$WORK/uplinks.txt"
fi
