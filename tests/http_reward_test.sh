#!/usr/bin/env bash
# System test of rewards from a scoring service over HTTP (task.reward_url): a scoring server
# written with Python's standard library, a prompts dataset, a learner with two actor
# processes at S = 0. Checks: one POST per accepted group (G samples) and one per held-out
# row, every rollout scored exactly once and only by the learner, each update's reward_mean
# equals the mean of the scores the service returned for it; a service that is down stops the
# run with one line naming the URL.
# Usage: tests/http_reward_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
enter_workdir
contains() { grep -q -- "$2" "$1"; }
extra_cleanup() { [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null; }

for i in $(seq 0 199); do
  printf '{"data_source": "toy", "prompt": "What is %d+%d?", "answer": "%d", "extra_info": {"index": %d}}\n' \
    $((i % 20)) $((i / 20)) $((i % 20 + i / 20)) $i
done > train.jsonl
cat > server.py <<'PY'
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Scorer(BaseHTTPRequestHandler):
    def do_POST(self):
        samples = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["samples"]
        scores = []
        for s in samples:
            assert s["data_source"] == "toy" and isinstance(s["extra_info"]["index"], int)
            score = 1.0 if s["solution_str"].strip() == s["ground_truth"] else (len(s["solution_str"]) % 4) / 8
            scores.append({"score": score, "length": len(s["solution_str"])})
        with open("requests.log", "a") as f:
            f.write(json.dumps([x["score"] for x in scores]) + "\n")
        body = json.dumps({"scores": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = HTTPServer(("127.0.0.1", 0), Scorer)
print(server.server_address[1], flush=True)
server.serve_forever()
PY
start_server python3 server.py
check "the scoring service started" test -n "$PORT"
B=4; G=4; STEPS=8; H=20
cat > run.yaml <<YAML
task: {name: prompts, train_file: $WORK/train.jsonl, reward_url: "http://127.0.0.1:$PORT/score", reward: http}
$TINY_MODEL_YAML
warmstart: {steps: 20}
rl: {steps: $STEPS, groups_per_step: $B, group_size: $G, staleness: 0}
rollout: {actors: 2, max_new_tokens: 4, wait_for_actors: 2}  # both actors take part, even on a loaded machine
eval: {every: 0}
YAML
timeout 300 "$ECHELON" train run.yaml --out run > train.out 2> train.err
check "train with a scoring service exits 0" test $? -eq 0
check "two actor processes served it" test "$(grep -c 'registered from' train.err)" -ge 2
check "no group dropped or re-issued (S = 0)" contains run/metrics.jsonl '"event":"final".*"groups_dropped_stale":0,.*"groups_reissued":0'
check "one POST per held-out row and per group" test "$(wc -l < requests.log)" -eq $((2 * H + STEPS * B))
check "every rollout scored exactly once" sh -c "python3 -c \"import json; print(sum(len(json.loads(l)) for l in open('requests.log')))\" | grep -qx $((2 * H + STEPS * B * G))"
python3 - "$B" "$G" "$H" > means.out 2>&1 <<'PY'
import json, sys
b, g, h = map(int, sys.argv[1:])
groups = [json.loads(l) for l in open("requests.log")][h:-h]
steps = [json.loads(l) for l in open("run/metrics.jsonl") if '"step"' in l]
assert len(groups) == len(steps) * b and all(len(x) == g for x in groups), (len(groups), len(steps))
for i, s in enumerate(steps):
    scores = [v for grp in groups[i * b:(i + 1) * b] for v in grp]
    assert abs(s["reward_mean"] - sum(scores) / len(scores)) < 1e-9, (i, s["reward_mean"], scores)
    assert "length" in s["reward_metrics"], s
print("ok", len(steps))
PY
check "each update's reward_mean is the mean of the service's scores for its groups" grep -qx "ok $STEPS" means.out

kill "$SERVER"; wait "$SERVER" 2>/dev/null
timeout 300 "$ECHELON" train run.yaml --out down > down.out 2> down.err
check "a service that is down fails the run" test $? -ne 0
check "the error names the URL and the attempts" contains down.err "reward service POST http://127.0.0.1:$PORT/score: .* after 3 attempts"
finish
