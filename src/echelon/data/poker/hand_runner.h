// Plays many hands against one policy in lockstep: every round, the decisions of all hands
// waiting on the policy go to one Policy::Sample call (so a GRPO group of G copies of a deal,
// or an evaluation of thousands of deals, costs one batched generation per decision depth,
// not one per decision). The opponent's moves are computed in between.
//
// Credit assignment: an episode is a whole hand; its reward is the policy's net chips at the
// end of the hand in big blinds (chips / 2), and that one reward is the episode's, so every
// decision (Turn) of the hand receives the same group-normalised advantage. There is no
// per-decision shaping and no discount: a fold on the river and the raise that built the
// pot share the outcome.
//
//   std::vector<TableSpec> tables(8, TableSpec{deal_seed, /*policy_seat=*/1, OpponentKind::kTag});
//   ECHELON_ASSIGN_OR_RETURN(std::vector<PlayedHand> hands, PlayHands(tables, policy, seed, RunnerOptions()));
//
// Thread contract: uses `policy` from the calling thread only; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/data/adapter.h"
#include "echelon/data/poker/game_state.h"
#include "echelon/data/poker/opponents.h"

namespace echelon::data::poker {

// What an illegal or unparsable answer does (adapter option illegal_action).
enum class IllegalAction {
  kFold,  // "fold": the hand is forfeited, even where a check was free (loses the chips in)
  kCall,  // "call": the answer is taken as check/call
};

struct TableSpec {
  uint64_t deal_seed = 0;
  int policy_seat = 0;  // 0 small blind / button, 1 big blind
  OpponentKind opponent = OpponentKind::kCallingStation;
};

struct PlayedHand {
  Episode episode;   // the policy's decisions; reward = chips / 2; success = chips > 0
  int chips = 0;     // net chips won by the policy (the opponent won -chips)
  int illegal = 0;   // answers that were unparsable or illegal
};

struct RunnerOptions {
  IllegalAction illegal = IllegalAction::kFold;
  size_t max_batch = 0;  // prompts per Sample call; 0 = all waiting decisions at once
};

// Fails with the policy's error, or when the policy returns a different number of turns than
// prompts.
Result<std::vector<PlayedHand>> PlayHands(const std::vector<TableSpec>& tables, Policy& policy, uint64_t seed,
                                  const RunnerOptions& options);

// A hand replayed from its deal and the policy's answers: the prompt before each answer the
// hand took (answers after its end are not taken), and the policy's net chips. A hand the
// answers leave unfinished is finished by check/call.
struct ReplayedHand {
  std::vector<std::string> prompts;
  int chips = 0;
};
ReplayedHand ReplayHand(const TableSpec& table, const std::vector<std::string>& answers, IllegalAction illegal);

// The opponent acts until the policy is to act or the hand is over.
void AdvanceOpponent(HandState& hand, const TableSpec& table);
// Applies the policy's answer; returns false when it was illegal or unparsable (and the
// consequence was applied instead).
bool ApplyAnswer(HandState& hand, const std::string& answer, IllegalAction illegal);

// Big blinds won by the policy for `chips` net chips.
inline double ChipsToBigBlinds(int chips) { return static_cast<double>(chips) / kBigBlind; }

}  // namespace echelon::data::poker
