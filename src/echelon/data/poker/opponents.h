// The fixed opponents the policy plays against, selectable by name:
//   random           uniform over the legal actions
//   calling-station  always checks or calls, never folds or raises
//   tag              tight-aggressive rules: preflop by the Chen score of its hole cards,
//                    postflop by Monte Carlo equity against a random hand, with thresholds
//                    by street (TagRules); it bluffs and calls light with small probabilities,
//                    so that groups of the same deal keep some reward spread.
//
// Every opponent decision is a pure function of (kind, state, random): callers derive
// `random` from the deal seed and the action history (OpponentRandom), so the same history
// of the same deal always meets the same answer. This is what lets TaskAdapter::Reward
// replay a one-decision hand exactly, and it gives the duplicate copies of a deal common
// random numbers: reward differences inside a group come from the policy's own choices.
//
//   Action a = OpponentAction(OpponentKind::kTag, hand, OpponentRandom(deal_seed, hand));
//
// Thread contract: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "echelon/common/status.h"
#include "echelon/data/poker/game_state.h"

namespace echelon::data::poker {

enum class OpponentKind { kRandom, kCallingStation, kTag };

// "random", "calling-station", "tag"; errors list the known names.
Result<OpponentKind> ParseOpponent(const std::string& name);
const char* OpponentName(OpponentKind kind);

// Tunables of the rule-based tight-aggressive bot, with why.
struct TagRules {
  double preflop_raise_chen = 8;     // e.g. 88+, AJo+, KQo, A9s+: raise
  double preflop_call_chen = 5;      // call below the raise line; below this fold unless free
  double preflop_reraise_chen = 10;  // facing a raise, re-raise only with TT+, AK, AJs+, KQs
  double raise_equity[4] = {0, 0.66, 0.70, 0.75};  // bet/raise above this equity vs a random hand
  double call_margin = 0.05;         // call when equity exceeds pot odds by this much
  double bluff_probability = 0.08;   // bet/raise anyway (when legal)
  double loose_call_probability = 0.05;  // call where the rules would fold
  int equity_samples = 100;          // Monte Carlo rollouts: +-0.05 standard error at most
};

// The opponent's action for the player to act in `hand` (not finished); always legal.
Action OpponentAction(OpponentKind kind, const HandState& hand, uint64_t random,
                      const TagRules& rules = TagRules());

// The random input of a decision: a hash of the deal seed, the seat to act, and the history.
uint64_t OpponentRandom(uint64_t deal_seed, const HandState& hand);

// Chen formula score of two hole cards (-1 .. 20).
double ChenScore(Card a, Card b);
// Probability of winning (ties count half) against one uniformly random hand, with the
// board completed at random; `samples` rollouts driven by `random`.
double EstimateEquity(const HandState& hand, int seat, int samples, uint64_t random);

}  // namespace echelon::data::poker
