// What the policy sees and says: the text prompt of a decision and the parsing of its answer.
//
// Prompt (one line, no spaces inside a field):
//   <P><E><hole> <board> <pot> <history>>
//   P        'S' small blind / button (acts first preflop), 'B' big blind
//   E        the player's hand strength, one digit 0..9: floor(10 x equity) of the player's
//            two cards and the visible board against one uniformly random hand, the rest of
//            the board completed at random (StrengthDigit). It is computed from the visible
//            cards only (never the opponent's cards or board cards still to come), the way a
//            player reads their own hand: a tiny character model cannot learn hand strength
//            from raw card characters in the hands a short run plays.
//   hole     the player's two cards, e.g. "AhKd"
//   board    the visible board cards ("Ts9c2h", 3 to 5 cards) or "-" preflop
//   pot      chips in the pot, blinds included (stacks are left out: every hand starts at
//            200 chips each and costs at most 48, so they carry nothing the pot and the
//            history do not)
//   history  the streets so far joined by '/', one letter per action in order: lower case
//            for the player's own actions, upper case for the opponent's (f/F fold,
//            c/C check or call, r/R bet or raise); "-" before any action
// e.g. "B4AhKd Ts9c2h 8 Rc/>" : big blind, strength 4 (ace high on this flop), opponent
// raised, player called preflop, the player is first to act on the flop.
//
// Answer: exactly one letter, "f" (fold), "c" (check/call) or "r" (bet/raise). One character
// is the shortest answer a character-level model can learn and it cannot be half right;
// anything else ("", "cc", "call", "x") is unparsable.
//
// Thread contract: pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string>

#include "echelon/data/poker/game_state.h"

namespace echelon::data::poker {

// Every character a prompt or a parsable answer contains.
std::string PokerAlphabet();

// Equity samples behind the strength digit: standard error at most 0.025.
inline constexpr int kStrengthSamples = 400;

// The strength digit of `seat`'s hand (0..9) from its hole cards and the visible board only;
// deterministic: the Monte Carlo stream is seeded by those visible cards.
int StrengthDigit(const HandState& hand, int seat);

// The prompt for `seat`, which must be the player to act.
std::string PromptText(const HandState& hand, int seat);

// The action of an answer, or nullopt when it is not exactly "f", "c" or "r".
std::optional<Action> ParseAnswer(const std::string& answer);

}  // namespace echelon::data::poker
