#include "echelon/data/poker/hand_evaluator.h"

#include <array>

namespace echelon::data::poker {
namespace {

constexpr int kRanks = 13;
constexpr int kAce = 12;

// The high rank of the best straight in a 13-bit rank mask, or -1. The wheel (A-2-3-4-5)
// is a five-high straight.
int StraightHigh(uint32_t mask) {
  for (int high = kAce; high >= 4; --high) {
    const uint32_t run = 0x1Fu << (high - 4);
    if ((mask & run) == run) return high;
  }
  const uint32_t wheel = (1u << kAce) | 0xFu;
  return (mask & wheel) == wheel ? 3 : -1;
}

// Packs category and up to five ranks (most significant first).
HandValue Pack(HandCategory category, std::initializer_list<int> ranks) {
  HandValue v = static_cast<HandValue>(category) << 20;
  int shift = 16;
  for (int r : ranks) {
    v |= static_cast<HandValue>(r) << shift;
    shift -= 4;
  }
  return v;
}

// The highest `n` ranks of `mask`, skipping `skip_a` and `skip_b` (-1: none); missing ones are 0.
std::array<int, 5> TopRanks(uint32_t mask, int n, int skip_a = -1, int skip_b = -1) {
  std::array<int, 5> out{0, 0, 0, 0, 0};
  int k = 0;
  for (int r = kAce; r >= 0 && k < n; --r) {
    if (!(mask & (1u << r)) || r == skip_a || r == skip_b) continue;
    out[k++] = r;
  }
  return out;
}

}  // namespace

HandValue EvaluateHand(const std::vector<Card>& cards) {
  std::array<int, kRanks> count{};
  std::array<uint32_t, 4> suit_mask{};
  uint32_t all = 0;
  for (Card c : cards) {
    ++count[RankOf(c)];
    suit_mask[SuitOf(c)] |= 1u << RankOf(c);
    all |= 1u << RankOf(c);
  }
  for (uint32_t m : suit_mask) {
    if (__builtin_popcount(m) < 5) continue;
    const int sf = StraightHigh(m);
    if (sf >= 0) return Pack(HandCategory::kStraightFlush, {sf});
  }
  // Highest quads, trips, and the two highest pairs (a second trips counts as a pair).
  int quads = -1, trips = -1, pair1 = -1, pair2 = -1;
  for (int r = kAce; r >= 0; --r) {
    if (count[r] == 4 && quads < 0) {
      quads = r;
    } else if (count[r] == 3 && trips < 0) {
      trips = r;
    } else if (count[r] >= 2) {
      if (pair1 < 0) pair1 = r;
      else if (pair2 < 0) pair2 = r;
    }
  }
  if (quads >= 0) return Pack(HandCategory::kQuads, {quads, TopRanks(all, 1, quads)[0]});
  if (trips >= 0 && pair1 >= 0) return Pack(HandCategory::kFullHouse, {trips, pair1});
  for (uint32_t m : suit_mask) {
    if (__builtin_popcount(m) < 5) continue;
    const std::array<int, 5> t = TopRanks(m, 5);
    return Pack(HandCategory::kFlush, {t[0], t[1], t[2], t[3], t[4]});
  }
  const int straight = StraightHigh(all);
  if (straight >= 0) return Pack(HandCategory::kStraight, {straight});
  if (trips >= 0) {
    const std::array<int, 5> k = TopRanks(all, 2, trips);
    return Pack(HandCategory::kTrips, {trips, k[0], k[1]});
  }
  if (pair2 >= 0) return Pack(HandCategory::kTwoPair, {pair1, pair2, TopRanks(all, 1, pair1, pair2)[0]});
  if (pair1 >= 0) {
    const std::array<int, 5> k = TopRanks(all, 3, pair1);
    return Pack(HandCategory::kPair, {pair1, k[0], k[1], k[2]});
  }
  const std::array<int, 5> t = TopRanks(all, 5);
  return Pack(HandCategory::kHighCard, {t[0], t[1], t[2], t[3], t[4]});
}

HandCategory CategoryOf(HandValue v) { return static_cast<HandCategory>(v >> 20); }

const char* CategoryName(HandCategory c) {
  switch (c) {
    case HandCategory::kHighCard: return "high card";
    case HandCategory::kPair: return "pair";
    case HandCategory::kTwoPair: return "two pair";
    case HandCategory::kTrips: return "three of a kind";
    case HandCategory::kStraight: return "straight";
    case HandCategory::kFlush: return "flush";
    case HandCategory::kFullHouse: return "full house";
    case HandCategory::kQuads: return "four of a kind";
    case HandCategory::kStraightFlush: return "straight flush";
  }
  return "unknown";
}

}  // namespace echelon::data::poker
