// Exact 5-to-7-card poker hand evaluation: the best five-card hand a set of cards makes.
//
// The value orders hands exactly: higher wins, equal values tie (split pot). It packs the
// category in bits 20..23 and up to five tie-breaking ranks (0 = deuce .. 12 = ace) in four
// bits each below it, most significant first, so values compare as plain integers.
//
//   HandValue v = EvaluateHand({c0, c1, c2, c3, c4, c5, c6});
//   if (CategoryOf(v) == HandCategory::kFlush) ...
//
// Checked against an independent evaluator (npm `phe`) by tests/poker_evaluator_test.sh.
// Thread contract: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "echelon/data/poker/cards.h"

namespace echelon::data::poker {

enum class HandCategory : int {
  kHighCard = 0,
  kPair = 1,
  kTwoPair = 2,
  kTrips = 3,
  kStraight = 4,
  kFlush = 5,
  kFullHouse = 6,
  kQuads = 7,
  kStraightFlush = 8,
};

using HandValue = uint32_t;

// `cards` holds 5 to 7 distinct cards; the caller guarantees it (the game never deals duplicates).
HandValue EvaluateHand(const std::vector<Card>& cards);
HandCategory CategoryOf(HandValue v);
const char* CategoryName(HandCategory c);  // "straight flush", "two pair", ...

}  // namespace echelon::data::poker
