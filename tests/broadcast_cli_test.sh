#!/usr/bin/env bash
# System test of `echelon broadcast`: an origin and 3 peer processes on 127.0.0.1 move a 12 MiB
# file in 1 MiB chunks; every peer writes it with the right SHA-256 and prints its JSON line,
# the origin reports each chunk delivered once per peer; a pinned wrong key and a missing file
# are refused with one clear line. Every process is started under `timeout` and killed on exit.
# Usage: tests/broadcast_cli_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
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

BASE=$((20000 + RANDOM % 30000))
head -c $((12 << 20)) /dev/urandom > snap.bin
WANT=$(sha256sum snap.bin | cut -d' ' -f1)

timeout 60 "$ECHELON" broadcast origin --file snap.bin --listen 127.0.0.1:$BASE --key origin.key --chunk-mib 1 \
  --expect-peers 3 --exit-when-done --timeout 50 > origin.out 2> origin.err &
ORIGIN=$!
PIDS+=("$ORIGIN")
check "origin generates its key and listens" wait_for origin.err "listening on" 15
check "public key written beside the private key" test -s origin.key.pub
check "private key is 0600" test "$(stat -c %a origin.key)" = 600
PEERS=()
for i in 1 2 3; do
  PIN=(--origin-key origin.key.pub)
  [ "$i" = 3 ] && PIN=()  # peer 3 trusts on first use
  timeout 60 "$ECHELON" broadcast peer --origin 127.0.0.1:$BASE --listen 127.0.0.1:$((BASE + i)) --out out$i.bin \
    --name p$i "${PIN[@]}" --exit-when-done --timeout 50 > peer$i.out 2> peer$i.err &
  PEERS+=($!)
  PIDS+=($!)
done
for i in 1 2 3; do
  wait "${PEERS[$((i - 1))]}"
  check "peer $i exits 0" test $? -eq 0
  check "peer $i wrote the file" test "$(sha256sum out$i.bin 2>/dev/null | cut -d' ' -f1)" = "$WANT"
  check "peer $i prints bytes, seconds, sha256" sh -c \
    "tail -n1 peer$i.out | grep -Eq '^\{\"bytes\":12582912,\"peer\":\"p$i#[0-9]+\",\"seconds\":[0-9.e-]+,\"sha256\":\"$WANT\",\"version\":1\}$'"
done
check "unpinned peer warns about trust on first use" contains peer3.err "trusting origin key id"
check "pinned peer does not warn" sh -c "! grep -q 'trusting origin key' peer1.err"
wait "$ORIGIN"
check "origin exits 0 when done" test $? -eq 0
check "origin reports 3 live peers, none dead" sh -c "tail -n1 origin.out | grep -q '\"dead\":0' && tail -n1 origin.out | grep -q '\"peers\":3'"
check "each chunk reached each peer exactly once" contains origin.out '"transfers":36'
check "origin reports the file hash" contains origin.out "\"sha256\":\"$WANT\""

# A peer pinned to another origin's key is refused at join, naming both key ids.
"$ECHELON" broadcast origin --file snap.bin --listen 127.0.0.1:$((BASE + 10)) --key other.key --expect-peers 5 \
  --timeout 20 > /dev/null 2> other.err &
OTHER=$!
PIDS+=("$OTHER")
wait_for other.err "listening on" 15
timeout 20 "$ECHELON" broadcast peer --origin 127.0.0.1:$((BASE + 10)) --listen 127.0.0.1:$((BASE + 11)) \
  --out wrong.bin --origin-key origin.key.pub > /dev/null 2> wrongkey.err
check "wrong pinned key exits 2" test $? -eq 2
check "wrong pinned key names the pinned key" contains wrongkey.err "pinned --origin-key"
check "nothing written for a wrong key" test ! -e wrong.bin
kill "$OTHER" 2>/dev/null

# Bad input: one line naming the file or the flag.
"$ECHELON" broadcast origin --file missing.bin --listen 127.0.0.1:$((BASE + 12)) > /dev/null 2> missing.err
check "missing file exits 2" test $? -eq 2
check "missing file is named" contains missing.err "missing.bin"
"$ECHELON" broadcast origin --file snap.bin --listen 127.0.0.1:$((BASE + 12)) --mode ring > /dev/null 2> mode.err
check "bad mode exits 2" test $? -eq 2
check "bad mode names the choices" contains mode.err "expected peer or star"
timeout 30 "$ECHELON" broadcast peer --origin 127.0.0.1:$((BASE + 13)) --listen 127.0.0.1:$((BASE + 14)) \
  --out x.bin > /dev/null 2> noorigin.err
check "unreachable origin exits 1" test $? -eq 1
check "unreachable origin is named" contains noorigin.err "127.0.0.1:$((BASE + 13))"

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
