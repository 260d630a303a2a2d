#!/usr/bin/env bash
# System test of TLS between learner and actors: a self-signed certificate for localhost;
# an actor that trusts it completes a short run, receiving its snapshots by the broadcast,
# which then runs over TLS too; a plaintext actor cannot join.
# Usage: tests/tls_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir
command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout learner.key -out learner.crt 2>/dev/null
check "certificate made" test -s learner.crt
echo "tls-token-0123456789" > token
timeout 300 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file token --tls-cert learner.crt \
  --tls-key learner.key --out run --set warmstart.steps=5 --set rl.steps=10 --set rl.groups_per_step=4 \
  --set task.eval_size=20 --set eval.every=0 --set model.num_hidden_layers=1 > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
port=$(learner_port learner.out)
check "learner listens" test -n "$port"
# A plaintext actor cannot register with a TLS learner (it keeps retrying; bounded here).
timeout 5 "$ECHELON" actor --learner "localhost:$port" --token-file token --name plain > plain.out 2> plain.err
check "plaintext actor never registers" sh -c "! grep -q 'registered with learner' plain.err"
"$ECHELON" actor --learner "localhost:$port" --token-file token --tls-ca learner.crt --name secure \
  > secure.out 2> secure.err &
ACTOR=$!
PIDS+=("$ACTOR")
wait "$LEARNER"
check "learner completes over TLS" test $? -eq 0
check "all steps ran" test "$(grep -c '^step ' learner.out)" -eq 10
for _ in $(seq 1 100); do kill -0 "$ACTOR" 2>/dev/null || break; sleep 0.1; done
check "TLS actor registered" grep -q "registered with learner" secure.err
check "TLS actor joined the broadcast (over TLS)" grep -q "joined the snapshot broadcast" secure.err
check "snapshots went by the broadcast" test "$(grep -c '"broadcast_version"' run/metrics.jsonl)" -ge 5
check "no broadcast fell back to a direct fetch" sh -c "! grep -q 'fetching snapshots directly' secure.err"
[ "$fails" -eq 0 ] || { tail -n 5 learner.err secure.err plain.err; }
finish
