#!/usr/bin/env bash
# The poker hand evaluator (src/echelon/data/poker/hand_evaluator.h) against an independent
# one: the npm package `phe` (a port of the Cactus Kev / 2+2 evaluator) under Node.
#
#   bash tests/poker_evaluator_test.sh build/echelon_tests [WORK_DIR] [HANDS]
#
# Deals HANDS random showdowns (5 board cards, two 2-card hands: 2 x HANDS seven-card hands,
# default 100,000 deals) with the echelon side's dump test, then checks with Node:
#   1. every hand's category equals phe's;
#   2. every showdown has the same winner or the same tie in both evaluators;
#   3. over all hands together, echelon's values order them exactly as phe's ranks do
#      (equal values <=> equal ranks), so ties are exact too.
# Installs phe with npm into WORK_DIR/poker_npm (never into the source tree); exits 77
# (CTest "skipped") with a message only when Node/npm are missing or npm cannot install, and
# fails then under CI=true.
set -euo pipefail

TESTS_BIN=${1:?usage: poker_evaluator_test.sh ECHELON_TESTS_BINARY [WORK_DIR] [HANDS]}
WORK=${2:-$(mktemp -d /tmp/poker_eval.XXXXXX)}
HANDS=${3:-100000}
NPM_DIR="$WORK/poker_npm"
PHE_VERSION=0.6.0

source "$(dirname "$0")/npm.sh"
npm_install_or_skip "$NPM_DIR" "compare with the phe evaluator" "phe@$PHE_VERSION"

HANDS_FILE="$WORK/poker_showdowns.txt"
ECHELON_POKER_HANDS_OUT="$HANDS_FILE" ECHELON_POKER_HANDS_N="$HANDS" \
  "$TESTS_BIN" --gtest_filter=PokerEvaluatorDump.WritesRandomShowdowns >/dev/null
test "$(wc -l < "$HANDS_FILE")" -eq "$HANDS"

NODE_PATH="$NPM_DIR/node_modules" node - "$HANDS_FILE" <<'JS'
const fs = require('fs');
const phe = require('phe');
const lines = fs.readFileSync(process.argv[2], 'utf8').trim().split('\n');
// echelon categories: 0 high card .. 8 straight flush; phe.rankCards: 0 straight flush .. 8 high card.
let errors = 0, ties = 0, showdowns = 0;
const hands = [];  // [echelon value, phe rank]
const fail = (msg) => { if (errors++ < 10) console.error(msg); };
for (const line of lines) {
  const f = line.split(' ');
  const board = f.slice(0, 5), a = board.concat(f.slice(5, 7)), b = board.concat(f.slice(7, 9));
  const va = Number(f[9]), vb = Number(f[10]);
  const ra = phe.evaluateCards(a), rb = phe.evaluateCards(b);  // lower is better
  for (const [cards, v, r] of [[a, va, ra], [b, vb, rb]]) {
    if ((v >> 20) !== 8 - phe.rankCards(cards)) fail(`category differs: ${cards.join(' ')} echelon ${v >> 20} phe ${phe.rankDescription[phe.rankCards(cards)]}`);
    hands.push([v, r]);
  }
  const mine = Math.sign(va - vb), theirs = Math.sign(rb - ra);
  if (mine !== theirs) fail(`winner differs: board ${board.join(' ')} | ${f[5]} ${f[6]} vs ${f[7]} ${f[8]}: echelon ${mine} phe ${theirs}`);
  if (theirs === 0) ties++;
  showdowns++;
}
hands.sort((x, y) => x[0] - y[0]);
for (let i = 1; i < hands.length; i++) {
  const [v0, r0] = hands[i - 1], [v1, r1] = hands[i];
  if ((v0 === v1) !== (r0 === r1) || (v1 > v0 && !(r1 < r0))) {
    fail(`order differs: echelon ${v0} < ${v1} but phe ${r0} vs ${r1}`);
  }
}
const distinct = new Set(hands.map((h) => h[1])).size;
console.log(`poker evaluator vs phe: ${showdowns} showdowns (${hands.length} seven-card hands, ${ties} ties, ${distinct} distinct phe ranks), ${errors} disagreements`);
process.exit(errors === 0 ? 0 : 1);
JS
