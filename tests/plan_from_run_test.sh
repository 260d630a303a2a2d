#!/usr/bin/env bash
# System test of `echelon plan --from-run`: three short real runs of configs/math-tiny.yaml
# that load the learner differently (two actors at S = 2: learner-bound, with room to stay so
# when other tests share the cores; one actor slowed 3x
# at S = 2: rollout-bound; two actors at S = 0: lock-step). For each, the capacity model
# fitted to the run must predict its measured learner utilisation within 10% (relative).
# Then the CONFIG form (the plan takes the run's measured numbers) and one clear error per
# kind of bad run directory. First, the config key table: `plan --help` and `simulate --help`
# list each key of `plan --config-keys markdown` once; and `plan --learner-memory`.
# Usage: tests/plan_from_run_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir
contains() { grep -q -- "$2" "$1"; }
jqok() { jq -e "$@" > /dev/null; }

"$ECHELON" plan --config-keys markdown | sed -n 's/^| `\([^`]*\)` |.*/\1/p' > keys.txt
check "the key table has the plan config's keys" test "$(wc -l < keys.txt)" -gt 40
"$ECHELON" plan --help > plan.help
"$ECHELON" simulate --help > simulate.help
once() { local k; while read -r k; do [ "$(grep -cF -- "  $k (" "$1")" -eq 1 ] || { echo "$1: $k"; return 1; }; done < keys.txt; }
check "plan --help lists every config key once" once plan.help
check "simulate --help lists every config key once" once simulate.help

# The learner memory table: Qwen3-30B-A3B fits 8 sharded H200s, not 4, and one error per bad input.
DATA=$(realpath "$(dirname "$0")/../data")
"$ECHELON" plan --learner-memory "$DATA/models/qwen3-30b-a3b.json" --prices "$DATA/prices.yaml" > memory.out 2>&1
check "plan --learner-memory exits 0" test $? -eq 0
check "30.53B parameters named" contains memory.out "30.53B parameters (48 layers)"
check "8 ranks, shard params, 4k tokens: fits an H200" grep -Eq '^ +8 bf16 +params +yes +- +4096 .*\| +67\.2 \| fits' memory.out
check "... and at 32k tokens" grep -Eq '^ +8 bf16 +params +yes +- +32768 .*\| +84\.3 \| fits' memory.out
check "4 ranks, shard params: does not" grep -Eq '^ +4 bf16 +params +yes +- +4096 .*\| +124\.0 \| no' memory.out
check "LoRA 16 with checkpointing at 32k tokens: one H200" grep -Eq '^ +1 bf16 +none +yes +16 +32768 .*\| +77\.0 \| fits' memory.out
"$ECHELON" plan --learner-memory "$DATA/models/missing.json" --prices "$DATA/prices.yaml" > missing.out 2>&1
check "a missing model file: exit 2" test $? -eq 2
check "... naming it" contains missing.out "missing.json"
echo '{"model_type": "qwen3", "hidden_size": 64}' > partial.json
"$ECHELON" plan --learner-memory partial.json --prices "$DATA/prices.yaml" > partial.out 2>&1
check "a config.json without vocab_size: exit 2 naming the field" contains partial.out "vocab_size"

SHORT=(--set warmstart.steps=5 --set rl.steps=50 --set task.eval_size=20 --set eval.every=0)
declare -A RUNS=(
  [learner_bound]="--set rl.staleness=2 --set rollout.actors=2"
  # One actor 10x slowed: with the slot engine's throughput a 3x slowdown still kept the learner
  # ~94% busy, and the run was no longer rollout-bound.
  [rollout_bound]="--set rl.staleness=2 --set rollout.actors=1 --set rollout.slow_actors=1 --set rollout.slowdown=10"
  [lock_step]="--set rl.staleness=0 --set rollout.actors=2"
)
for name in learner_bound rollout_bound lock_step; do
  # shellcheck disable=SC2086
  timeout 300 "$ECHELON" train "$CONFIG" --out "$name" "${SHORT[@]}" ${RUNS[$name]} > "$name.train.out" 2>&1
  check "train $name exits 0" test $? -eq 0
  "$ECHELON" plan --from-run "$name" --json > "$name.plan.out" 2> "$name.plan.err"
  check "plan --from-run $name exits 0" test $? -eq 0
  tail -1 "$name.plan.out" | jq -c .from_run > "$name.fit.json"
  jq -r '"\(input_filename): predicted \(.predicted_utilization) measured \(.measured_utilization) error \(.relative_error) window full \(.window_full_fraction)"' \
    "$name.fit.json"
  check "$name: predicted utilisation within 10% of measured" \
    jqok '(.predicted_utilization / .measured_utilization - 1) | fabs <= 0.10' "$name.fit.json"
  check "$name: the table prints both" contains "$name.plan.out" "learner utilisation (run)"
done
check "learner-bound run is flagged" jqok '.learner_bound == true' learner_bound.fit.json
check "rollout-bound run is not" jqok '.learner_bound == false' rollout_bound.fit.json
check "two actors measured in the lock-step run" jqok '(.actors | length) == 2 and .max_staleness == 0' lock_step.fit.json
# The runs exercise different regimes: their utilisations differ clearly.
check "measured utilisations differ" jqok -n --slurpfile a learner_bound.fit.json --slurpfile b rollout_bound.fit.json \
  --slurpfile c lock_step.fit.json \
  '($a[0].measured_utilization - $b[0].measured_utilization) > 0.15 and ($a[0].measured_utilization - $c[0].measured_utilization) > 0.15'

# CONFIG --from-run: the plan uses the run's step time, overhead, shape and actor throughput.
cp "$(dirname "$CONFIG")/../data/prices.yaml" prices.yaml
cat > local.yaml <<'EOF'
prices: prices.yaml
model: {name: math-tiny, params_billion: 0.0006, bytes_per_param: 4, kv_bytes_per_token: 1536}
rollout: {groups_per_step: 16, group_size: 4, prompt_tokens: 8, completion_tokens: 6}
learner: {gpu: a100, count: 1}
baseline: {gpu: a100, count: 1}
rl: {max_staleness: 2, publish_period: 1, target_utilization: 0.9}
workers:
  - {name: local, gpu: a100, available: 4}
EOF
"$ECHELON" plan local.yaml --from-run rollout_bound --json > config_form.out 2> config_form.err
check "plan CONFIG --from-run exits 0" test $? -eq 0
tail -1 config_form.out > config_form.json
check "plan takes the measured step time" jqok '(.train_seconds - .from_run.train_seconds) | fabs < 1e-9' config_form.json
check "plan takes the measured actor throughput" \
  jqok '((.workers[0].tokens_per_s - ([.from_run.actors[].tokens_per_s] | add / length)) | fabs < 1e-6) and .workers[0].concurrent_groups == 1' \
  config_form.json
check "plan says what it took from the run" contains config_form.out "measured in rollout_bound"

# Bad run directories: exit 2 and one line naming what and where.
"$ECHELON" plan --from-run nowhere > /dev/null 2> missing.err
check "missing dir exits 2" test $? -eq 2
check "missing dir is named" contains missing.err "nowhere: no such run directory"
mkdir empty && cp learner_bound/config.yaml empty/ && : > empty/metrics.jsonl
"$ECHELON" plan --from-run empty > /dev/null 2> empty.err
check "empty metrics exits 2" test $? -eq 2
check "empty metrics is named" contains empty.err "empty/metrics.jsonl: empty"
mkdir corrupt && cp learner_bound/config.yaml corrupt/ && head -5 learner_bound/metrics.jsonl > corrupt/metrics.jsonl
printf '{"step": 4, "wall_s": oops}\n' >> corrupt/metrics.jsonl
"$ECHELON" plan --from-run corrupt > /dev/null 2> corrupt.err
check "corrupt line exits 2" test $? -eq 2
check "corrupt line names file and line" contains corrupt.err "corrupt/metrics.jsonl:6: not a JSON object"
mkdir noconfig && cp learner_bound/metrics.jsonl noconfig/
"$ECHELON" plan --from-run noconfig > /dev/null 2> noconfig.err
check "missing config exits 2" test $? -eq 2
check "missing config is named" contains noconfig.err "noconfig/config.yaml: missing"
for f in missing empty corrupt noconfig; do check "$f: one line" test "$(wc -l < $f.err)" -eq 1; done
finish
