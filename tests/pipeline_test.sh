#!/usr/bin/env bash
# System test of pipelined generation (`echelon stage`, `echelon generate --next`): stage
# processes holding layer ranges of a committed checkpoint generate exactly the whole model's
# tokens and log-probs (3 stages of a Qwen3-MoE, 2 of a dense Qwen3), micro-batches keep the
# tokens, a wrong token is refused, a killed stage fails the call with one line within its
# timeout, and the pipeline works again once the stage is back on its address.
# Usage: tests/pipeline_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
DATA=$(realpath "$(dirname "$0")/data/model")
enter_workdir
contains() { grep -q -- "$2" "$1"; }

# start_stage NAME ARGS...: runs `echelon stage ARGS` (stdout NAME.out, stderr NAME.err), waits
# for its "listening" line; sets STAGE (pid) and STAGE_PORT.
start_stage() {
  local name=$1
  shift
  "$ECHELON" stage "$@" > "$name.out" 2> "$name.err" &
  STAGE=$!
  PIDS+=("$STAGE")
  STAGE_PORT=$(_wait_for "$name.out" 's/^stage layers .* listening on [^:]*:\([0-9]*\).*$/\1/p')
}
same_tokens() {  # same_tokens A B: every row's tokens equal, log-probs within 1e-5
  python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"], (x["row"], x["tokens"], y["tokens"])
    assert max(abs(p - q) for p, q in zip(x["logprobs"], y["logprobs"])) <= 1e-5, x["row"]
PY
}

printf '%s\n' '{"ids": [5, 17, 200, 3]}' '{"ids": [9]}' '{"ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}' '{"ids": [250, 42]}' > prompts.jsonl
GEN=(--prompts prompts.jsonl --group-size 2 --max-new-tokens 12 --slots 4 --seed 3)
MOE=$DATA/qwen3_moe_f32  # 3 layers

timeout 120 "$ECHELON" generate --model "$MOE" "${GEN[@]}" > whole.jsonl 2> whole.err
check "the whole model generates 8 rows" test "$(wc -l < whole.jsonl)" -eq 8

start_stage last --model "$MOE" --layers 2:3
LAST=$STAGE LAST_PORT=$STAGE_PORT
start_stage middle --model "$MOE" --layers 1:2 --next "127.0.0.1:$LAST_PORT"
MIDDLE_PORT=$STAGE_PORT
check "two stage processes listen" test -n "$LAST_PORT" -a -n "$MIDDLE_PORT"
timeout 120 "$ECHELON" generate --model "$MOE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$MIDDLE_PORT" \
  > three.jsonl 2> three.err
check "3 stages: exactly the whole model's tokens and log-probs" cmp -s whole.jsonl three.jsonl
check "the summary names the pipeline" contains three.err '"stages":"pipeline"'
timeout 120 "$ECHELON" generate --model "$MOE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$MIDDLE_PORT" \
  --micro-batches 4 > four.jsonl 2> four.err
check "4 micro-batches: the whole model's tokens" same_tokens whole.jsonl four.jsonl

DENSE=$DATA/qwen3_tied  # 2 layers
timeout 120 "$ECHELON" generate --model "$DENSE" "${GEN[@]}" > dense_whole.jsonl 2> /dev/null
start_stage dense --model "$DENSE" --layers 1:2
timeout 120 "$ECHELON" generate --model "$DENSE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$STAGE_PORT" \
  > dense_two.jsonl 2> dense_two.err
check "2 stages: exactly the whole model's tokens and log-probs" cmp -s dense_whole.jsonl dense_two.jsonl

openssl rand -hex 16 > token
start_stage guarded --model "$DENSE" --layers 1:2 --token-file token
timeout 60 "$ECHELON" generate --model "$DENSE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$STAGE_PORT" \
  > /dev/null 2> notoken.err
check "no token: refused (exit 1)" test $? -eq 1
check "no token: the refusal is named" contains notoken.err "bearer token"
timeout 60 "$ECHELON" generate --model "$DENSE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$STAGE_PORT" \
  --token-file token > guarded.jsonl 2> /dev/null
check "with the token: the whole model's output" cmp -s dense_whole.jsonl guarded.jsonl

# A stage that dies: the call fails within its timeout, with the stage named; back on its
# address, the pipeline works again (the middle stage redials it).
kill -9 "$LAST"
wait "$LAST" 2>/dev/null
start=$(date +%s)
timeout 60 "$ECHELON" generate --model "$MOE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$MIDDLE_PORT" \
  --timeout 5 > /dev/null 2> dead.err
code=$?
check "a dead stage fails the call (exit 1)" test "$code" -eq 1
check "a dead stage fails it within the timeout" test $(($(date +%s) - start)) -le 30
check "the failing stage is named" contains dead.err "pipeline stage 127.0.0.1:$LAST_PORT"
start_stage last2 --model "$MOE" --layers 2:3 --listen "127.0.0.1:$LAST_PORT"
check "the stage is back on its address" test "$STAGE_PORT" = "$LAST_PORT"
ok=1
for _ in 1 2 3 4 5; do  # the middle stage's channel redials with backoff
  timeout 120 "$ECHELON" generate --model "$MOE" "${GEN[@]}" --layers 0:1 --next "127.0.0.1:$MIDDLE_PORT" \
    --timeout 10 > again.jsonl 2> again.err && { ok=0; break; }
  sleep 1
done
check "the pipeline re-forms: the whole model's output again" sh -c "[ $ok -eq 0 ] && cmp -s whole.jsonl again.jsonl"

"$ECHELON" stage --model "$MOE" --layers 0:2 > /dev/null 2> first.err
check "a later stage cannot hold layer 0 (exit 2)" test $? -eq 2
check "and says which command does" contains first.err "first stage's"
"$ECHELON" stage --model "$MOE" --layers 2:4 > /dev/null 2> range.err
check "a range beyond the model is named" contains range.err "the model has layers 0..2"
"$ECHELON" generate --model "$MOE" --prompts prompts.jsonl --next 127.0.0.1:1 > /dev/null 2> pair.err
check "--next without --layers is refused" contains pair.err "go together"
echo '{"ids": [5, 300]}' > bad.jsonl
"$ECHELON" generate --model "$MOE" --prompts bad.jsonl > /dev/null 2> bad.err
check "a token id beyond the vocabulary is named by file:line" contains bad.err "bad.jsonl:1: \"ids\" must hold token ids in 0..299"
finish
