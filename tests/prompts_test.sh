#!/usr/bin/env bash
# System test of the prompts task (bring your own dataset): a dataset in verl's JSONL layout
# (chat-message and plain-string prompts, reward_model.ground_truth and answer fields), the
# built-in math verifier, a learner with two actor processes; then evaluation of the run's
# held-out rows, and the one-line errors for bad rows, bad Parquet files and bad reward specs.
# Usage: tests/prompts_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
enter_workdir
contains() { grep -q -- "$2" "$1"; }

# 300 rows "What is A+B?" -> A+B: even rows as chat messages with reward_model (every fourth
# after a system message), odd rows as a plain string with answer (a number).
for i in $(seq 0 299); do
  a=$((i % 20)); b=$((i / 20))
  if [ $((i % 4)) -eq 0 ]; then
    printf '{"data_source": "toy", "prompt": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is %d+%d?"}], "reward_model": {"style": "rule", "ground_truth": "%d"}, "extra_info": {"index": %d}}\n' $a $b $((a + b)) $i
  elif [ $((i % 2)) -eq 0 ]; then
    printf '{"data_source": "toy", "prompt": [{"role": "user", "content": "What is %d+%d?"}], "reward_model": {"style": "rule", "ground_truth": "%d"}, "extra_info": {"index": %d}}\n' $a $b $((a + b)) $i
  else
    printf '{"prompt": "What is %d+%d?", "answer": %d}\n' $a $b $((a + b))
  fi
done > train.jsonl

cat > prompts.yaml <<YAML
task:
  name: prompts
  train_file: $WORK/train.jsonl
  reward: math
$TINY_MODEL_YAML
warmstart: {steps: 150}   # a few right answers, so the verifier's 1s show up
rl: {steps: 12, groups_per_step: 4, group_size: 8}
rollout: {actors: 2, max_new_tokens: 4, wait_for_actors: 2}  # both actors take part, even on a loaded machine
eval: {every: 3}
YAML

timeout 300 "$ECHELON" train prompts.yaml --out run > train.out 2> train.err
check "train on the prompts dataset exits 0" test $? -eq 0
check "a progress line per step" test "$(grep -c '^step ' train.out)" -eq 12
check "two actor processes served it" test "$(grep -c 'registered from' train.err)" -ge 2
check "held-out rows: 10% of 300" test "$(wc -l < run/heldout.jsonl)" -eq 30
check "held-out rows are dataset rows as written" sh -c "grep -vxFf train.jsonl run/heldout.jsonl | wc -l | grep -qx 0"
check "rewards in [0, 1]" sh -c "grep -o '\"reward_mean\":[-0-9.e]*' run/metrics.jsonl | cut -d: -f2 |
  awk '\$1 < 0 || \$1 > 1 { bad = 1 } END { exit bad }'"
check "some completions were right (reward 1)" sh -c "grep -q '\"reward_mean\":0\.[0-9]*[1-9]' run/metrics.jsonl"
# The learner re-scores every consumed group: the actors' rewards agreed, no submission was
# refused for its content. Regression (of the test): it demanded an empty refusal map, which also
# counts liveness (an actor silent past the eviction time on a loaded machine, and the calls it
# made before registering again); those say nothing about rewards and are allowed here.
check "no group refused for its content or re-scored" python3 -c '
import json, sys
final = [json.loads(l) for l in open("run/metrics.jsonl") if "\"event\":\"final\"" in l][-1]
liveness = {"evicted", "unknown_actor", "not_lease_holder", "unknown_group", "already_settled"}
bad = {k: v for k, v in final["refused"].items() if k not in liveness}
sys.exit("refused: %s" % bad if bad else 0)'

timeout 120 "$ECHELON" eval --checkpoint run/checkpoints/final --task prompts --data run/heldout.jsonl \
  --task-option reward=math > eval.out 2> eval.err
check "eval of the held-out rows exits 0" test $? -eq 0
check "eval prints accuracy over the 30 rows" sh -c "tail -n1 eval.out | grep -Eq '^\{\"accuracy\":[0-9.e-]+,\"n\":30\}$'"

# Errors: one line naming file:line and field; nothing trained.
{ head -6 train.jsonl; echo '{"prompt": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "answer": "1"}'; } > bad.jsonl
"$ECHELON" train prompts.yaml --out bad --set task.train_file="$WORK/bad.jsonl" > /dev/null 2> bad.err
check "a bad row fails the run" test $? -ne 0
check "a bad row is named by file:line and field" contains bad.err "bad.jsonl:7: field \"prompt\[0\].role\": \"user\", expected \"system\""
check "a bad row trains nothing" test ! -e bad/checkpoints/final
cp train.jsonl data.parquet
"$ECHELON" train prompts.yaml --out pq --set task.train_file="$WORK/data.parquet" > /dev/null 2> pq.err
check "a .parquet file that is not Parquet is one error naming it" contains pq.err "data.parquet: not a Parquet file"
"$ECHELON" train prompts.yaml --out rw --set task.reward="math+0.1*fmt" > /dev/null 2> rw.err
check "an unknown verifier is named" contains rw.err "term \"0.1\*fmt\": unknown verifier \"fmt\""
grep -v train_file prompts.yaml > nofile.yaml
"$ECHELON" train nofile.yaml --out nf > /dev/null 2> nf.err
check "no train_file says what to set" contains nf.err "set task.train_file"
finish
