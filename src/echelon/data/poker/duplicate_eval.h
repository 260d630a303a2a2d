// Duplicate-deal evaluation: each deal is played twice, once from each seat, against the same
// opponent, so the luck of the cards cancels between the two hands and what is left is skill.
// The unit of measurement is milli-big-blinds per hand (mbb/hand); the 95% interval is the
// normal one over deals: mean +- 1.96 * sd(deal means) / sqrt(deals).
//
//   DuplicateOptions o;  o.opponent = OpponentKind::kTag;  o.hands = 2000;  o.seed = 1;
//   DuplicateResult r = EvaluateDuplicate(greedy_policy, o).value();
//
// Thread contract: uses `policy` from the calling thread only.
#pragma once

#include <cstdint>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/data/poker/hand_runner.h"
#include "echelon/data/poker/opponents.h"

namespace echelon::data::poker {

struct DuplicateOptions {
  OpponentKind opponent = OpponentKind::kCallingStation;
  int64_t hands = 2000;  // hands played: an even number, deals = hands / 2
  uint64_t seed = 0;     // deal seeds; disjoint from the adapter's training and held-out deals
  IllegalAction illegal = IllegalAction::kFold;
  size_t max_batch = 512;  // prompts per Sample call
};

struct DuplicateResult {
  int64_t hands = 0;
  int64_t deals = 0;
  double mbb_per_hand = 0;
  double ci95_lo = 0;
  double ci95_hi = 0;
  int64_t decisions = 0;  // policy answers
  int64_t illegal = 0;    // of which illegal or unparsable
};

// InvalidArgument when hands is odd or below 2.
Result<DuplicateResult> EvaluateDuplicate(Policy& policy, const DuplicateOptions& options);

// Deal seed of evaluation deal `index` (exposed for tests).
uint64_t EvalDealSeed(uint64_t seed, int64_t index);

}  // namespace echelon::data::poker
