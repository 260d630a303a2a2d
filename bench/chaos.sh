#!/usr/bin/env bash
# Chaos run: one learner, four honest actors and one authenticated attacker on loopback for
# DURATION seconds (default 600). Every few seconds an honest actor (each one a broadcast
# relay too) is SIGKILLed and restarted a few seconds later, or SIGSTOPped for a few seconds
# (long enough to be evicted) and continued; the learner is SIGKILLed at a third and at two
# thirds of the run and resumed from its newest checkpoint; `echelon_testkit hostile-actor`
# forges throughout (restarted with each learner), hoards leases with one token and, with
# REWARD_CRASH=1 (the default), submits completions that make the run's Python reward raise:
# the task is then the same addition problems as a prompts dataset scored by a Python
# function that raises on "666". At the end the learner is interrupted (SIGINT: a final
# checkpoint and line). Checks, over metrics.jsonl: every step exactly once and in order
# across the resumes, no group consumed twice, staleness within S on every line, and on every
# line groups_issued = consumed + dropped_stale + reissued + in_flight; no structural forgery
# accepted, no update with a token gradient weight above c = 3, every crashing completion
# refused (reward_error) without stopping the run, no hoard above 8 leases, no honest worker
# quarantined. Prints the figures for docs/RESULTS.md.
# Usage: bench/chaos.sh [path/to/echelon [path/to/echelon_testkit [seed]]]
#   env: DURATION (600), REWARD_CRASH (1)
set -uo pipefail
ECHELON=$(realpath "${1:-$(dirname "$0")/../build/echelon}")
TESTKIT=$(realpath "${2:-$(dirname "$0")/../build/echelon_testkit}")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
INVARIANTS=$(realpath "$(dirname "$0")/../tests/run_invariants.py")
RANDOM=${3:-$$}
DURATION=${DURATION:-600}
REWARD_CRASH=${REWARD_CRASH:-1}
S=2
source "$(dirname "$0")/../tests/lib.sh"
enter_workdir
command -v jq > /dev/null || apt-get install -y -q jq > /dev/null
echo "chaos: ${DURATION} s, random seed ${3:-$$}"
token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
for i in 0 1 2 3; do echo "honest-$i $(token)"; done > honest
for i in $(seq 0 11); do echo "hostile-$i $(token)"; done > hostile
cat honest hostile > workers
for i in 0 1 2 3; do awk -v w=honest-$i '$1 == w {print $2}' honest > honest-$i.token; done

start_learner() {  # OUT ARGS...
  local out=$1
  shift
  "$ECHELON" learner "$@" --token-file workers > "$out" 2> "${out%.out}.err" &
  LEARNER=$!
  PIDS+=("$LEARNER")
}
declare -A ACTOR
start_actor() {  # I
  "$ECHELON" actor --learner "127.0.0.1:$port" --name honest-$1 --token-file honest-$1.token \
    >> honest-$1.out 2>> honest-$1.err &
  ACTOR[$1]=$!
  PIDS+=("$!")
}
crash=()
task_sets=(--set task.eval_size=50)
if [ "$REWARD_CRASH" = 1 ]; then
  # The default job's problems (operands 0..99) as a prompts dataset, scored by Python.
  /usr/bin/python3 - > train.jsonl <<'PY'
import json, random
rng = random.Random(7)
for i in range(20000):
    a, b = rng.randrange(100), rng.randrange(100)
    op = rng.choice("+-")
    print(json.dumps({"prompt": f"{a}{op}{b}=", "reward_model": {"ground_truth": str(a + b if op == "+" else a - b)}}))
PY
  cat > reward.py <<'PY'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "666" in solution_str:
        raise ValueError("this reward cannot score " + repr(solution_str))
    return 1.0 if solution_str.strip() == ground_truth else 0.0
PY
  sed -e '/^task:/,/^model:/{/^task:/!{/^model:/!d}}' -e "s|^task:.*|task: {name: prompts, train_file: $PWD/train.jsonl, python_file: $PWD/reward.py, reward: python, eval_fraction: 0.0025}|" \
    "$CONFIG" > chaos.yaml
  CONFIG=$PWD/chaos.yaml
  crash=(666)
  task_sets=()
fi
start_hostile() {  # N: the attacker's Nth life
  "$TESTKIT" hostile-actor "127.0.0.1:$port" hostile hostile-$1.jsonl "$DURATION" 3 1 "${crash[@]}" > /dev/null \
    2> hostile-$1.err &
  PIDS+=("$!")
}

start_learner l1.out "$CONFIG" --listen 127.0.0.1:0 --out run --set rl.steps=1000000 --set rl.staleness=$S \
  --set checkpoint.every=10 --set eval.every=0 "${task_sets[@]}"
port=$(learner_port l1.out)
[ -n "$port" ] || { echo "learner did not start"; tail l1.err; exit 1; }
for i in 0 1 2 3; do start_actor $i; done
start_hostile 1
kills=0 stops=0 learner_kills=0
start=$SECONDS
next_learner_kill=$((DURATION / 3))
while [ $((SECONDS - start)) -lt "$DURATION" ]; do
  sleep $((2 + RANDOM % 4))
  i=$((RANDOM % 4))
  if [ $((RANDOM % 2)) = 0 ]; then
    kill -9 "${ACTOR[$i]}" 2> /dev/null
    wait "${ACTOR[$i]}" 2> /dev/null
    kills=$((kills + 1))
    (sleep $((1 + RANDOM % 4))) && start_actor $i
  else
    kill -STOP "${ACTOR[$i]}" 2> /dev/null
    stops=$((stops + 1))
    sleep $((4 + RANDOM % 4))  # past eviction (3 heartbeats)
    kill -CONT "${ACTOR[$i]}" 2> /dev/null
  fi
  if [ $((SECONDS - start)) -ge "$next_learner_kill" ] && [ "$learner_kills" -lt 2 ]; then
    kill -9 "$LEARNER"
    wait "$LEARNER" 2> /dev/null
    learner_kills=$((learner_kills + 1))
    echo "learner SIGKILLed at $((SECONDS - start)) s after $(grep -c '^step ' l$learner_kills.out) steps of its life"
    start_learner l$((learner_kills + 1)).out --resume run --listen "127.0.0.1:$port"
    start_hostile $((learner_kills + 1))
    next_learner_kill=$((next_learner_kill + DURATION / 3))
  fi
done
kill -INT "$LEARNER"
wait_exit "$LEARNER" 60
echo "learner interrupted at $((SECONDS - start)) s (exit $?)"
last=l$((learner_kills + 1))
/usr/bin/python3 "$INVARIANTS" run/metrics.jsonl --staleness $S --end interrupted \
  --resumes 2 --discarded run/metrics.discarded.jsonl > check.out 2>&1
final=$(tail -1 run/metrics.jsonl)
cat check.out
echo "final counts: $(echo "$final" | jq -c '{groups_issued, groups_consumed, groups_dropped_stale, groups_reissued, groups_in_flight}')"
echo "refused by reason (last learner life): $(echo "$final" | jq -c .refused)"
# Lies told before any strike pass when not drawn for verification: they count as accepted,
# and the loss bounds them (max_token_weight, group_share_max below).
fresh='.kind == "in_clamp" or .kind == "fresh_version" or .kind == "cherry_pick" or .kind == "teacher_forced" or .kind == "sparse_liar" or .kind == "length"'
forged_accepted=$(cat hostile-*.jsonl | jq -c "select(.kind != \"honest\" and .kind != \"hoard\" and .accepted and ($fresh | not))" | wc -l)
fresh_accepted=$(cat hostile-*.jsonl | jq -c "select(.accepted and ($fresh))" | wc -l)
forged=$(cat hostile-*.jsonl | jq -c 'select(.kind != "honest" and .kind != "hoard")' | wc -l)
crashes=$(cat hostile-*.jsonl | jq -c 'select(.kind == "reward_crash")' | wc -l)
crashes_refused=$(cat hostile-*.jsonl | jq -c 'select(.kind == "reward_crash" and (.accepted | not) and .reason == "reward_error")' | wc -l)
burst=$(cat hostile-*.jsonl | jq -c 'select(.kind == "reward_burst")' | wc -l)
burst_refused=$(cat hostile-*.jsonl | jq -c 'select(.kind == "reward_burst" and (.accepted | not) and .reason == "reward_error")' | wc -l)
for kind in in_clamp fresh_version cherry_pick teacher_forced sparse_liar length; do
  echo "$kind: refused $(cat hostile-*.jsonl | jq -c "select(.kind == \"$kind\" and (.accepted | not))" | wc -l) of $(cat hostile-*.jsonl | jq -c "select(.kind == \"$kind\")" | wc -l)"
done
echo "largest group share of an update $(grep '"step"' run/metrics.jsonl | jq -s 'map(.group_share_max // 0) | max'); learner peak resident set $(grep '"step"' run/metrics.jsonl | jq -s 'map(.learner_peak_rss_mb // .learner_rss_mb // 0) | max') MB"
hoard_max=$(cat hostile-*.jsonl | jq -s '[.[] | select(.kind == "hoard") | .leases] | max')
weight_max=$(grep '"step"' run/metrics.jsonl | jq -s 'map(.max_token_weight) | max')
echo "actors SIGKILLed $kills, SIGSTOPped $stops, learner SIGKILLed $learner_kills; forgeries sent $forged, structural accepted $forged_accepted, fresh lies accepted $fresh_accepted"
echo "reward-crashing groups sent $crashes, refused as reward_error $crashes_refused; largest hoard $hoard_max leases; largest token gradient weight $weight_max"
check "metrics across the chaos" grep -q '^ok' check.out
check "no structural forgery accepted" test "$forged_accepted" -eq 0
check "no token's gradient weight above c = 3" jq -ne "$weight_max <= 3.000001"
check "no hoard above 8 leases" test "$hoard_max" -le 8
if [ "$REWARD_CRASH" = 1 ]; then
  check "reward-crashing groups were sent" test "$crashes" -ge 1
  check "every one refused as reward_error, the run going on" test "$crashes_refused" -eq "$crashes"
  echo "reward-failure bursts: $burst groups sent, $burst_refused refused as reward_error"
  check "bursts of reward failures were sent" test "$burst" -ge 16
  check "every burst group refused as reward_error, the run going on" test "$burst_refused" -eq "$burst"
fi
check "no honest worker quarantined" test "$(cat l*.err | grep -c 'quarantined worker honest-')" -eq 0
check "the learner was killed twice" test "$learner_kills" -eq 2
[ "$fails" -eq 0 ] || { tail -n 5 "$last.out"; tail -n 20 "$last.err"; }
finish
