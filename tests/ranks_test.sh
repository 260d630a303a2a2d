#!/usr/bin/env bash
# Data-parallel learner ranks from the command line: `learner.ranks=2` (with and without a
# sharded optimizer) trains and every metrics line says so; a rank SIGKILLed in the middle of a
# run stops it within 60 s with one clear error, and --resume continues it from its last
# checkpoint with one rank; bad rank, device and micro-batch settings are one line each.
# Usage: tests/ranks_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
enter_workdir
contains() { grep -q -- "$2" "$1"; }
TINY=(--set model.hidden_size=32 --set model.num_hidden_layers=1 --set model.num_attention_heads=2
      --set model.num_key_value_heads=1 --set model.head_dim=16 --set model.intermediate_size=64
      --set warmstart.steps=5 --set rl.groups_per_step=4 --set task.eval_size=30 --set eval.every=0)
ranks_per_line() {  # FILE: the learner_ranks of every update line, one per line
  python3 -c "import json,sys; [print(json.loads(l).get('learner_ranks')) for l in open(sys.argv[1]) if '\"step\"' in l]" "$1"
}

for shard in none optimizer params; do
  # shard params with the KL term: its reference sharded too
  extra=()
  [ "$shard" = params ] && extra=(--set rl.kl_coef=0.05)
  timeout 300 "$ECHELON" train "$CONFIG" --out "two-$shard" --set rl.steps=6 --set learner.ranks=2 \
    --set learner.shard=$shard --set learner.micro_batch_tokens=64 "${TINY[@]}" "${extra[@]}" > "two-$shard.out" 2>&1
  check "two ranks (shard=$shard) exit 0" test $? -eq 0
  check "every update line has learner_ranks 2 ($shard)" test "$(ranks_per_line two-$shard/metrics.jsonl | sort -u)" = 2
  check "6 update lines ($shard)" test "$(ranks_per_line two-$shard/metrics.jsonl | wc -l)" -eq 6
  check "rank 1 ran to the end ($shard)" contains "two-$shard/ranks/rank-1.log" "learner rank 1 done"
  [ "$shard" = params ] && check "rank 1 holds sharded parameters" contains "two-$shard/ranks/rank-1.log" "sharded parameters"
done

# Sharded parameters resumed: rank 0 maps its checkpoint and the warm start (the KL reference) and
# cuts them unit by unit; snapshots, evaluation and checkpoints gather the weights unit by unit.
timeout 300 "$ECHELON" train --resume two-params --set rl.steps=9 --set checkpoint.shard_mb=0.02 \
  > two-params-resumed.out 2>&1
RC=$?
check "sharded parameters with the KL term resume to the end (exit $RC)" test "$RC" -eq 0
[ "$RC" -eq 0 ] || tail -n 30 two-params-resumed.out >&2
check "9 update lines after the resume" test "$(ranks_per_line two-params/metrics.jsonl | wc -l)" -eq 9
check "the resumed updates ran on 2 ranks" test "$(ranks_per_line two-params/metrics.jsonl | tail -3 | sort -u)" = 2
# checkpoints/final as Hugging Face's sharded files (checkpoint.shard_mb 0.02: 20 kB each), each
# gathered unit by unit: `echelon eval` reads it through the index to the final evaluation's accuracy.
check "its final checkpoint holds the gathered weights in shards" \
  test -s two-params/checkpoints/final/model.safetensors.index.json -a -s two-params/checkpoints/final/model-00001-of-*.safetensors
check "... and no single weights file" test ! -e two-params/checkpoints/final/model.safetensors
timeout 120 "$ECHELON" eval --checkpoint two-params/checkpoints/final --data two-params/heldout.jsonl --max-new-tokens 6 \
  > final-eval.json 2> final-eval.err
check "echelon eval reads the sharded final checkpoint" test $? -eq 0
check "... to the accuracy the run's final evaluation gave" python3 -c '
import json, sys
final = [json.loads(l) for l in open("two-params/metrics.jsonl") if "\"final\"" in l][-1]
got = json.load(open("final-eval.json"))
assert abs(got["accuracy"] - final["heldout_accuracy"]) < 1e-12 and got["n"] == final["heldout_n"], (got, final)'

# A rank killed mid-run: the run stops, names what happened, and leaves a checkpoint.
"$ECHELON" train "$CONFIG" --out killed --set rl.steps=400 --set learner.ranks=2 --set checkpoint.every=5 \
  "${TINY[@]}" > killed.out 2> killed.err &
PID=$!
PIDS+=("$PID")
for _ in $(seq 1 600); do
  [ "$(cat killed/metrics.jsonl 2>/dev/null | grep -c '"step"')" -ge 10 ] && break
  sleep 0.1
done
RANK_PID=$(pgrep -P "$PID" -f "learner-rank" | head -1)
check "found the rank process" test -n "$RANK_PID"
kill -9 "$RANK_PID"
T0=$(date +%s)
wait_exit "$PID" 60
RC=$?
check "run stops with exit 1 after the rank died (got $RC)" test "$RC" -eq 1
check "within 60 s" test $(($(date +%s) - T0)) -le 60
check "one clear error naming the ranks" grep -qE "learner rank 0: (all-reduce|broadcast) across 2 ranks failed \(a rank died" killed.err
LAST=$(ls killed/checkpoints | sed -n 's/^step-//p' | sort -n | tail -1)
check "a checkpoint to resume from" test "${LAST:-0}" -ge 5
timeout 300 "$ECHELON" train --resume killed --set learner.ranks=1 --set rl.steps=$((LAST + 4)) > resumed.out 2>&1
RC=$?
check "resumed with one rank to the end (exit $RC)" test "$RC" -eq 0
[ "$RC" -eq 0 ] || { echo "--- resumed.out (last 30 lines):"; tail -n 30 resumed.out; ls killed/checkpoints; } >&2
check "resumed lines say one rank" test "$(ranks_per_line killed/metrics.jsonl | tail -4 | sort -u)" = 1

# Bad settings: one line each, exit 2.
bad() {  # NAME EXPECTED [ENV=...] -- ARGS...
  local name=$1 expected=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout 60 "$ECHELON" train "$CONFIG" --out "bad-$name" "${TINY[@]}" "$@" > "bad-$name.out" 2>&1
  local rc=$?
  check "$name: exit 2 (got $rc)" test "$rc" -eq 2
  check "$name: says '$expected'" contains "bad-$name.out" "$expected"
}
bad ranks "learner.ranks (99) exceeds this machine's" -- --set learner.ranks=99
bad device "learner.device: \"cuda:0\": this LibTorch was built without CUDA" -- --set learner.device=cuda:0
bad devname "\"gpu\" is not a device name" -- --set learner.device=gpu
bad micro "learner.micro_batch_tokens (3) is smaller than one sequence" -- --set learner.micro_batch_tokens=3
bad rank_var "RANK=5 is not an integer in \[0, 1\]" WORLD_SIZE=2 RANK=5 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 --
bad port_var "MASTER_PORT is not set" WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 --
bad disagree "learner.ranks (2) and WORLD_SIZE (3) disagree" WORLD_SIZE=3 RANK=0 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=29999 -- --set learner.ranks=2
finish
