#!/usr/bin/env bash
# System test of multi-turn environments over HTTP (task.name: http-env) with the example game
# examples/guess_env.py, a learner and two actor processes at S = 0. Checks: the run trains end
# to end; every consumed group's seed was played G times by the actors and replayed G times by
# the learner with the same actions and rewards (the game's own log), and is the one the run's
# secret gives its group (`secret: seed`, recomputed here with Python's hmac); each update's reward_mean
# and reward_metrics.guesses are the means over its groups' logged episodes; nothing was
# refused or corrected; an environment that is down stops the run with one line naming its URL;
# the warm-start is refused for a task without demonstrations.
# Usage: tests/http_env_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
EXAMPLE=$(realpath "$(dirname "$0")/../examples/guess_env.py")
enter_workdir
contains() { grep -q -- "$2" "$1"; }
extra_cleanup() { [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null; }

start_server python3 "$EXAMPLE" --port 0 --log episodes.jsonl
check "the example environment started" test -n "$PORT"
B=4; G=4; STEPS=8; H=6
cat > run.yaml <<YAML
seed: 1
secret: seed
task: {name: http-env, server: "http://127.0.0.1:$PORT", max_turns: 3, eval_size: $H}
$TINY_MODEL_YAML
warmstart: {steps: 0}
rl: {steps: $STEPS, groups_per_step: $B, group_size: $G, staleness: 0}
rollout: {actors: 2, max_new_tokens: 3, wait_for_actors: 2}  # both actors take part, even on a loaded machine
eval: {every: 0}
YAML
timeout 300 "$ECHELON" train run.yaml --out run > train.out 2> train.err
check "train against the example environment exits 0" test $? -eq 0
check "two actor processes served it" test "$(grep -c 'registered from' train.err)" -ge 2
check "no group dropped or re-issued (S = 0)" contains run/metrics.jsonl '"event":"final".*"groups_dropped_stale":0,.*"groups_reissued":0'
check "nothing refused, no reward corrected by the replay" contains run/metrics.jsonl '"event":"final".*"refused":{}'
python3 - "$B" "$G" "$STEPS" > log.out 2>&1 <<'PY'
import collections, hashlib, hmac, json, struct, sys
b, g, steps_wanted = map(int, sys.argv[1:])
# The run's secret under `secret: seed` (common/run_secret.h), and a group's episode seed from it.
secret = hashlib.sha256(b"echelon run secret of seed 1").digest()
def episode_seed(group):
    mac = hmac.new(secret, b"environment seed\0" + struct.pack("<Q", group), hashlib.sha256).digest()
    return struct.unpack("<Q", mac[:8])[0] % 2**50
episodes = [json.loads(l) for l in open("episodes.jsonl")]
train = [e for e in episodes if e["seed"] < 2**50]
group_of = {episode_seed(gid): gid for gid in range(steps_wanted * b)}
by_group = collections.defaultdict(list)
for e in train:
    by_group[group_of.get(e["seed"], -1)].append(e)
assert sorted(by_group) == list(range(steps_wanted * b)), sorted(by_group)
for group, es in by_group.items():
    # G plays by the actors, G replays by the learner: every (actions, rewards) comes in pairs.
    assert len(es) == 2 * g, (group, len(es))
    counts = collections.Counter(json.dumps([e["actions"], e["rewards"]]) for e in es)
    assert all(c % 2 == 0 for c in counts.values()), (group, counts)
assert any(len(e["actions"]) > 1 for e in train), "no episode took a second turn"
steps = [json.loads(l) for l in open("run/metrics.jsonl") if '"step"' in l]
assert len(steps) == steps_wanted, len(steps)
for i, s in enumerate(steps):
    es = [e for group in range(i * b, (i + 1) * b) for e in by_group[group]]
    for key, got, want in (("reward", s["reward_mean"], sum(e["reward"] for e in es) / len(es)),
                           ("guesses", s["reward_metrics"]["guesses"], sum(len(e["actions"]) for e in es) / len(es))):
        assert abs(got - want) < 1e-9, (i, key, got, want)
print("ok", len(steps))
PY
check "the game's log: each group played and replayed alike, each update's means are its groups' episodes" grep -qx "ok $STEPS" log.out
check "the environment raised no error (server.err is empty)" test ! -s server.err
check "held-out episodes were played on held-out seeds" sh -c "grep -c '\"seed\": 1125899906842' episodes.jsonl | grep -qv '^0$'"

sed 's/steps: 0}/steps: 5}/' run.yaml > warm.yaml
timeout 120 "$ECHELON" train warm.yaml --out warm > warm.out 2> warm.err
check "a warm-start is refused" test $? -ne 0
check "the refusal says why and what to set" contains warm.err "the http-env task has no demonstrations to warm-start from; set warmstart.steps: 0"

kill "$SERVER"; wait "$SERVER" 2>/dev/null
timeout 300 "$ECHELON" train run.yaml --out down > down.out 2> down.err
check "an environment that is down fails the run" test $? -ne 0
check "the error names the URL and the attempts" contains down.err "environment POST http://127.0.0.1:$PORT/reset: .* after 3 attempts"
cat log.out | grep -v '^ok' | head -5
finish
