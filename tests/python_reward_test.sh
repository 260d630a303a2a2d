#!/usr/bin/env bash
# System test of Python reward functions (task.python_file): a prompts dataset in verl's layout,
# the user's compute_score in a .py file that logs every call, a learner with two actor
# processes at S = 0. Checks: the function scored every rollout of the run exactly once, on the
# learner (actors have no copy of the file); each update's reward_mean is the mean of the scores
# logged for its groups, and the dict's extra key reaches the metrics the same way; a function
# that raises stops the run with one line naming file:line and the sample, keeps a resumable
# checkpoint, and the fixed function continues the run to its end.
# Usage: tests/python_reward_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
enter_workdir
contains() { grep -q -- "$2" "$1"; }

for i in $(seq 0 199); do
  printf '{"data_source": "toy", "prompt": [{"role": "user", "content": "What is %d+%d?"}], "reward_model": {"style": "rule", "ground_truth": "%d"}, "extra_info": {"index": %d}}\n' \
    $((i % 20)) $((i / 20)) $((i % 20 + i / 20)) $i
done > train.jsonl
# Scores vary with the completion, so the means below pin down which calls each update used.
cat > reward.py <<'PY'
import json, os
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "toy" and isinstance(extra_info["index"], int)
    score = 1.0 if solution_str.strip() == ground_truth else (len(solution_str) % 4) / 8
    if os.environ.get("REWARD_FAIL_AFTER") and sum(1 for _ in open("calls.log")) >= int(os.environ["REWARD_FAIL_AFTER"]):
        raise ValueError("reward server fell over")
    with open("calls.log", "a") as f:
        f.write(json.dumps({"score": score, "length": len(solution_str)}) + "\n")
    return {"score": score, "length": len(solution_str)}
PY
B=4; G=4; STEPS=8
cat > run.yaml <<YAML
task: {name: prompts, train_file: $WORK/train.jsonl, python_file: $WORK/reward.py, reward: python}
$TINY_MODEL_YAML
warmstart: {steps: 20}
rl: {steps: $STEPS, groups_per_step: $B, group_size: $G, staleness: 0}
rollout: {actors: 2, max_new_tokens: 4, wait_for_actors: 2}  # both actors take part, even on a loaded machine
eval: {every: 0}
checkpoint: {every: 2}
YAML
H=20  # held-out rows: 10% of 200, scored at the warm-start and at the end
touch calls.log
timeout 300 "$ECHELON" train run.yaml --out run > train.out 2> train.err
check "train with a Python reward exits 0" test $? -eq 0
check "two actor processes served it" test "$(grep -c 'registered from' train.err)" -ge 2
final=$(grep '"event":"final"' run/metrics.jsonl)
check "no group dropped or re-issued (S = 0)" sh -c "echo '$final' | grep -q '\"groups_dropped_stale\":0,.*\"groups_reissued\":0'"
check "every rollout scored exactly once: 2 x $H held-out + $STEPS x $B x $G" test "$(wc -l < calls.log)" -eq $((2 * H + STEPS * B * G))
check "actors took no group of their own making" contains run/metrics.jsonl '"event":"final".*"refused":{}'
python3 - "$B" "$G" "$H" > means.out 2>&1 <<'PY'
import json, sys
b, g, h = map(int, sys.argv[1:])
calls = [json.loads(l) for l in open("calls.log")][h:-h]
steps = [json.loads(l) for l in open("run/metrics.jsonl") if '"step"' in l]
assert len(steps) * b * g == len(calls), (len(steps), len(calls))
for i, s in enumerate(steps):
    chunk = calls[i * b * g:(i + 1) * b * g]
    for key, got in (("score", s["reward_mean"]), ("length", s["reward_metrics"]["length"])):
        want = sum(c[key] for c in chunk) / len(chunk)
        assert abs(got - want) < 1e-9, (i, key, got, want)
print("ok", len(steps))
PY
check "each update's reward_mean and reward_metrics.length are the means of its logged calls" grep -qx "ok $STEPS" means.out

# A function that raises stops the run with one line; the run resumes once it is fixed.
rm -f calls.log; touch calls.log
REWARD_FAIL_AFTER=$((H + 3 * B * G + 5)) timeout 300 "$ECHELON" train run.yaml --out run2 > fail.out 2> fail.err
check "a raising reward fails the run" test $? -ne 0
check "the error names file:line, exception and sample" \
  grep -q "reward.py:6: ValueError: reward server fell over.*data_source \"toy\", ground_truth \"[0-9]*\", solution_str" fail.err
check "a resumable checkpoint was kept" test -n "$(compgen -G 'run2/checkpoints/step-*')"
timeout 300 "$ECHELON" train --resume run2 > resume.out 2> resume.err
check "the resumed run with the fixed function finishes" test $? -eq 0
check "the resumed run's final line says $STEPS" contains run2/metrics.jsonl "\"event\":\"final\".*\"version\":$STEPS"
finish
