// What the policy sees and says: the text prompt of a decision and the parsing of its answer.
//
// Prompt (one line, no spaces inside a field):
//   <P><hole> <board> <pot> <my stack> <their stack> <history>>
//   P        'S' small blind / button (acts first preflop), 'B' big blind
//   hole     the player's two cards, e.g. "AhKd"
//   board    the visible board cards ("Ts9c2h", 3 to 5 cards) or "-" preflop
//   pot      chips in the pot, blinds included
//   stacks   chips behind (200 at the start; a hand never costs more than 48)
//   history  the streets so far joined by '/', one letter per action in order: lower case
//            for the player's own actions, upper case for the opponent's (f/F fold,
//            c/C check or call, r/R bet or raise); "-" before any action
// e.g. "BAhKd Ts9c2h 8 196 196 Rc/>" : big blind, opponent raised, player called preflop,
// the player is first to act on the flop.
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

// The prompt for `seat`, which must be the player to act.
std::string PromptText(const HandState& hand, int seat);

// The action of an answer, or nullopt when it is not exactly "f", "c" or "r".
std::optional<Action> ParseAnswer(const std::string& answer);

}  // namespace echelon::data::poker
