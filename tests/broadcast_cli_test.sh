#!/usr/bin/env bash
# System test of `echelon broadcast`: an origin and 3 peer processes on 127.0.0.1 move a 12 MiB
# file in 1 MiB chunks; every peer writes it with the right SHA-256 and prints its JSON line,
# the origin reports each chunk delivered once per peer; a pinned wrong key and a missing file
# are refused with one clear line. Deltas: the next version (1% of bytes changed) published
# with --delta-from the first reaches two peers started with --have the first as deltas (a few
# percent of the bytes) and a third, without it, whole; all three write it bit-exactly. Every process is started under `timeout` and killed on exit.
# Usage: tests/broadcast_cli_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
HERE=$(realpath "$(dirname "$0")")
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK"
fails=0
pass=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
contains() { grep -q -- "$2" "$1"; }
wait_for() {  # wait_for FILE PATTERN SECONDS
  for _ in $(seq 1 $(($3 * 10))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# Every process listens on port 0 (the kernel picks a free one): a fixed or random port can be
# taken by another test or an outgoing connection. origin_port FILE prints the origin's port.
origin_port() { sed -n 's/.*listening on .* (port \([0-9]*\)).*/\1/p' "$1" | head -n1; }
head -c $((12 << 20)) /dev/urandom > snap.bin
WANT=$(sha256sum snap.bin | cut -d' ' -f1)

timeout 60 "$ECHELON" broadcast origin --file snap.bin --listen 127.0.0.1:0 --key origin.key \
  --expect-peers 3 --exit-when-done --timeout 50 --trace trace.jsonl > origin.out 2> origin.err &
ORIGIN=$!
PIDS+=("$ORIGIN")
check "origin generates its key and listens" wait_for origin.err "listening on" 15
check "public key written beside the private key" test -s origin.key.pub
check "private key is 0600" test "$(stat -c %a origin.key)" = 600
PORT=$(origin_port origin.err)
PEERS=()
for i in 1 2 3; do
  PIN=(--origin-key origin.key.pub)
  [ "$i" = 3 ] && PIN=()  # peer 3 trusts on first use
  timeout 60 "$ECHELON" broadcast peer --origin 127.0.0.1:$PORT --listen 127.0.0.1:0 --out out$i.bin \
    --name p$i "${PIN[@]}" --exit-when-done --timeout 50 > peer$i.out 2> peer$i.err &
  PEERS+=($!)
  PIDS+=($!)
done
for i in 1 2 3; do
  wait "${PEERS[$((i - 1))]}"
  check "peer $i exits 0" test $? -eq 0
  check "peer $i wrote the file" test "$(sha256sum out$i.bin 2>/dev/null | cut -d' ' -f1)" = "$WANT"
  check "peer $i prints bytes, seconds, sha256" sh -c \
    "head -n1 peer$i.out | grep -Eq '^\{\"bytes\":12582912,\"bytes_received\":12582912,\"peer\":\"p$i#[0-9]+\",\"seconds\":[0-9.e-]+,\"sha256\":\"$WANT\",\"version\":1\}$'"
  check "peer $i's exit line reports its uplink (estimate, pace, queueing delay)" sh -c \
    "tail -n1 peer$i.out | jq -e '.event == \"exit\" and .bytes_received == 12582912 and (.uplink | has(\"estimated_mbps\") and has(\"pace_mbps\") and has(\"declared_mbps\") and (.queue_delay_ms | has(\"p50\") and has(\"p99\")))' > /dev/null"
done
check "unpinned peer warns about trust on first use" contains peer3.err "trusting origin key id"
check "pinned peer does not warn" sh -c "! grep -q 'trusting origin key' peer1.err"
wait "$ORIGIN"
check "origin exits 0 when done" test $? -eq 0
check "the origin's completion line reports its uplink" sh -c \
  "tail -n1 origin.out | jq -e '.uplink | has(\"estimated_mbps\") and .pace_mbps == null' > /dev/null"
check "origin reports 3 live peers, none dead" sh -c "tail -n1 origin.out | grep -q '\"dead\":0' && tail -n1 origin.out | grep -q '\"peers\":3'"
check "no --chunk-mib: 12 MiB is cut into 1 MiB chunks" contains origin.out '"chunks":12,'
check "each chunk reached each peer exactly once" contains origin.out '"transfers":36'
check "origin reports the file hash" contains origin.out "\"sha256\":\"$WANT\""
check "origin reports the bytes pulled (3 peers, each chunk once)" contains origin.out '"bytes_pulled":37748736'
check "--trace holds one line per transfer, each peer getting each of the 12 chunks once" python3 -c "
import json, sys
rs = [json.loads(l) for l in open('trace.jsonl')]
got = sorted((r['to'].split('#')[0], r['chunk']) for r in rs)
ok = len(rs) == 36 and got == sorted((p, c) for p in ('p1', 'p2', 'p3') for c in range(12))
ok = ok and all(r['result'] == 'verified' and r['bytes'] == 1 << 20 and 0 <= r['ordered_s'] <= r['reported_s'] for r in rs)
sys.exit(0 if ok else 1)"
python3 "$HERE/../bench/broadcast_trace_summary.py" trace.jsonl > summary.txt
check "the trace summary reads it" grep -q '^36 transfers' summary.txt

# ---- Deltas: version 2 (1% of the bytes changed in their low bit) against version 1 ----
python3 "$HERE/small_update.py" snap.bin snap2.bin 7
WANT2=$(sha256sum snap2.bin | cut -d' ' -f1)
timeout 60 "$ECHELON" broadcast origin --file snap2.bin --delta-from snap.bin --version 2 --listen 127.0.0.1:0 \
  --key origin.key --chunk-mib 1 --expect-peers 3 --exit-when-done --timeout 50 > origin2.out 2> origin2.err &
ORIGIN=$!
PIDS+=("$ORIGIN")
check "delta origin listens" wait_for origin2.err "listening on" 15
PORT2=$(origin_port origin2.err)
PEERS=()
for i in 1 2 3; do
  HAVE=(--have out$i.bin)  # version 1, as this peer wrote it above
  [ "$i" = 3 ] && HAVE=()  # peer 3 lacks the base: it pulls the file whole
  timeout 60 "$ECHELON" broadcast peer --origin 127.0.0.1:$PORT2 --listen 127.0.0.1:0 \
    --out delta$i.bin --name d$i --origin-key origin.key.pub "${HAVE[@]}" --exit-when-done --timeout 50 \
    > dpeer$i.out 2> dpeer$i.err &
  PEERS+=($!)
  PIDS+=($!)
done
SIZE=12582912
for i in 1 2 3; do
  wait "${PEERS[$((i - 1))]}"
  check "delta peer $i exits 0" test $? -eq 0
  check "delta peer $i wrote version 2 bit-exactly" test "$(sha256sum delta$i.bin 2>/dev/null | cut -d' ' -f1)" = "$WANT2"
done
received() { tail -n1 "$1" | jq -r .bytes_received; }
for i in 1 2; do
  check "peer $i with --have pulled under 10% of the file ($(received dpeer$i.out) bytes)" \
    test "$(received dpeer$i.out)" -lt $((SIZE / 10))
done
check "peer 3 without --have pulled the file whole ($(received dpeer3.out) bytes)" test "$(received dpeer3.out)" -ge "$SIZE"
wait "$ORIGIN"
check "delta origin exits 0 when done" test $? -eq 0
PULLED=$(tail -n1 origin2.out | jq -r .bytes_pulled)
check "origin's bytes_pulled is what the peers said they pulled" \
  test "$PULLED" -eq $(($(received dpeer1.out) + $(received dpeer2.out) + $(received dpeer3.out)))
"$ECHELON" broadcast peer --origin 127.0.0.1:$PORT2 --listen 127.0.0.1:0 --out x.bin \
  --have nothere.bin > /dev/null 2> nohave.err
check "missing --have file exits 2 naming it" sh -c "test $? -eq 2 && grep -q 'nothere.bin' nohave.err"
"$ECHELON" broadcast origin --file snap2.bin --delta-from nothere.bin --listen 127.0.0.1:0 \
  > /dev/null 2> nodelta.err
check "missing --delta-from file exits 2 naming it" sh -c "test $? -eq 2 && grep -q 'nothere.bin' nodelta.err"
timeout 10 "$ECHELON" broadcast origin --file snap.bin --endgame-ratio 0.5 --listen 127.0.0.1:0 \
  > /dev/null 2> endgame.err
check "--endgame-ratio 0.5 exits 2 naming the flag" sh -c "test $? -eq 2 && grep -q 'endgame-ratio 0.5 is invalid' endgame.err"
timeout 10 "$ECHELON" broadcast origin --file snap.bin --start-latency-ms -5 --listen 127.0.0.1:0 \
  > /dev/null 2> latency.err
check "--start-latency-ms -5 exits 2 naming the flag" sh -c "test $? -eq 2 && grep -q 'start-latency-ms -5 is invalid' latency.err"
timeout 10 "$ECHELON" broadcast origin --file snap.bin --chunk-mib 0.0001 --listen 127.0.0.1:0 \
  > /dev/null 2> chunk.err
check "--chunk-mib 0.0001 exits 2 naming the flag and auto" sh -c "test $? -eq 2 && grep -q 'chunk-mib 0.0001 is invalid; expected 0 (auto)' chunk.err"
timeout 10 "$ECHELON" broadcast peer --origin 127.0.0.1:$PORT2 --listen 127.0.0.1:0 --out x.bin \
  --upload-mbps -3 > /dev/null 2> upload.err
check "--upload-mbps -3 exits 2 naming the flag" sh -c "test $? -eq 2 && grep -q 'upload-mbps -3 is invalid' upload.err"

# A peer pinned to another origin's key is refused at join, naming both key ids.
"$ECHELON" broadcast origin --file snap.bin --listen 127.0.0.1:0 --key other.key --expect-peers 5 \
  --timeout 20 > /dev/null 2> other.err &
OTHER=$!
PIDS+=("$OTHER")
wait_for other.err "listening on" 15
timeout 20 "$ECHELON" broadcast peer --origin 127.0.0.1:$(origin_port other.err) --listen 127.0.0.1:0 \
  --out wrong.bin --origin-key origin.key.pub > /dev/null 2> wrongkey.err
check "wrong pinned key exits 2" test $? -eq 2
check "wrong pinned key names the pinned key" contains wrongkey.err "pinned --origin-key"
check "nothing written for a wrong key" test ! -e wrong.bin
kill "$OTHER" 2>/dev/null

# Bad input: one line naming the file or the flag.
"$ECHELON" broadcast origin --file missing.bin --listen 127.0.0.1:0 > /dev/null 2> missing.err
check "missing file exits 2" test $? -eq 2
check "missing file is named" contains missing.err "missing.bin"
"$ECHELON" broadcast origin --file snap.bin --listen 127.0.0.1:0 --mode ring > /dev/null 2> mode.err
check "bad mode exits 2" test $? -eq 2
check "bad mode names the choices" contains mode.err "expected peer or star"
# Port 1 on loopback: nothing listens there (a privileged port no test binds).
timeout 30 "$ECHELON" broadcast peer --origin 127.0.0.1:1 --listen 127.0.0.1:0 \
  --out x.bin > /dev/null 2> noorigin.err
check "unreachable origin exits 1" test $? -eq 1
check "unreachable origin is named" contains noorigin.err "127.0.0.1:1"

if [ "$fails" -gt 0 ]; then  # what the processes said, for the failure's cause
  for f in *.err; do echo "--- $f"; tail -n 5 "$f"; done
fi
echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
