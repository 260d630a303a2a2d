#!/usr/bin/env bash
# System test of TLS between learner and actors: a self-signed certificate for localhost;
# an actor that trusts it and a two-stage pipeline actor complete a short run, receiving
# their snapshots by the broadcast, which then runs over TLS too, and the pipeline's stages
# talk over TLS with the certificate the learner handed on (a plaintext client gets no
# answer from the stage); a plaintext actor cannot join.
# Usage: tests/tls_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir
command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
need_jq
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout learner.key -out learner.crt 2>/dev/null
check "certificate made" test -s learner.crt
echo "tls-token-0123456789" > token
timeout 300 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file token --tls-cert learner.crt \
  --tls-key learner.key --out run --set warmstart.steps=5 --set rl.steps=30 --set rl.groups_per_step=4 \
  --set task.eval_size=20 --set eval.every=0 --set model.num_hidden_layers=2 --set rollout.wait_for_actors=3 \
  > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
port=$(learner_port learner.out)
check "learner listens" test -n "$port"
# A plaintext actor cannot register with a TLS learner (it keeps retrying; bounded here).
timeout 5 "$ECHELON" actor --learner "localhost:$port" --token-file token --name plain > plain.out 2> plain.err
check "plaintext actor never registers" sh -c "! grep -q 'registered with learner' plain.err"
"$ECHELON" actor --learner "localhost:$port" --token-file token --tls-ca learner.crt --name secure --slowdown 10 \
  > secure.out 2> secure.err &
ACTOR=$!
PIDS+=("$ACTOR")
# A pipeline of two stages, the later one serving on loopback.
"$ECHELON" actor --learner "localhost:$port" --token-file token --tls-ca learner.crt --name pipe-1 \
  --pipeline tls --stage 1/2 --stage-listen 127.0.0.1:0 > s1.out 2> s1.err &
PIDS+=("$!")
for _ in $(seq 1 100); do grep -q "serving on" s1.out 2>/dev/null && break; sleep 0.1; done
stage_port=$(sed -n 's/.*serving on 127.0.0.1:\([0-9]*\).*/\1/p' s1.out | head -1)
check "the later stage serves" test -n "$stage_port"
# It speaks TLS only, with the certificate it made (named for the broadcast's peers).
echo | timeout 10 openssl s_client -connect "127.0.0.1:$stage_port" 2> /dev/null | grep -a "subject=" > stage-cert.txt
check "the stage answers TLS with its own certificate" grep -q "echelon-broadcast-peer" stage-cert.txt
"$ECHELON" actor --learner "localhost:$port" --token-file token --tls-ca learner.crt --name pipe-0 \
  --pipeline tls --stage 0/2 > s0.out 2> s0.err &
PIDS+=("$!")
wait "$LEARNER"
check "learner completes over TLS" test $? -eq 0
check "all steps ran" test "$(grep -c '^step ' learner.out)" -eq 30
for _ in $(seq 1 100); do kill -0 "$ACTOR" 2>/dev/null || break; sleep 0.1; done
check "TLS actor registered" grep -q "registered with learner" secure.err
check "TLS actor joined the broadcast (over TLS)" grep -q "joined the snapshot broadcast" secure.err
check "snapshots went by the broadcast" test "$(grep -c '"broadcast_version"' run/metrics.jsonl)" -ge 5
check "no broadcast fell back to a direct fetch" sh -c "! grep -q 'fetching snapshots directly' secure.err"
check "the pipeline's groups went through its TLS stage" \
  test "$(grep '"event":"final"' run/metrics.jsonl | jq '.actor_groups["pipe-0"] // 0')" -ge 1
[ "$fails" -eq 0 ] || { tail -n 5 learner.err secure.err plain.err s0.err s1.err; }
finish
