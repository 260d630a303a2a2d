#include "echelon/data/poker/opponents.h"

#include <gtest/gtest.h>

namespace echelon::data::poker {
namespace {

Card C(const char* text) { return ParseCard(text).value(); }

Deal WithHole(int seat, const char* a, const char* b, uint64_t seed) {
  Deal d = DealFromSeed(seed);
  // Swap the wanted cards into place wherever they were dealt.
  auto place = [&](Card want, Card& slot) {
    for (auto& h : d.hole)
      for (Card& c : h)
        if (c == want) c = slot;
    for (Card& c : d.board)
      if (c == want) c = slot;
    slot = want;
  };
  place(C(a), d.hole[seat][0]);
  place(C(b), d.hole[seat][1]);
  return d;
}

TEST(PokerOpponents, ParsesNames) {
  EXPECT_EQ(ParseOpponent("tag").value(), OpponentKind::kTag);
  EXPECT_EQ(ParseOpponent("calling-station").value(), OpponentKind::kCallingStation);
  EXPECT_EQ(ParseOpponent("random").value(), OpponentKind::kRandom);
  Result<OpponentKind> bad = ParseOpponent("station");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("known opponents: random, calling-station, tag"), std::string::npos);
  EXPECT_STREQ(OpponentName(OpponentKind::kTag), "tag");
}

TEST(PokerOpponents, ChenScores) {
  EXPECT_EQ(ChenScore(C("As"), C("Ad")), 20);
  EXPECT_EQ(ChenScore(C("Ks"), C("Kd")), 16);
  EXPECT_EQ(ChenScore(C("2s"), C("2d")), 5);
  EXPECT_EQ(ChenScore(C("As"), C("Ks")), 12);
  EXPECT_EQ(ChenScore(C("Ts"), C("9s")), 8);   // 5 + 2 suited + 1 connected below a queen
  EXPECT_EQ(ChenScore(C("7s"), C("2d")), -1);  // 3.5 - 5 (gap 4) rounds up to -1
}

// Plays every opponent against itself from random states: answers are always legal, and
// the same state and random input give the same answer.
TEST(PokerOpponents, AlwaysLegalAndDeterministic) {
  for (OpponentKind kind : {OpponentKind::kRandom, OpponentKind::kCallingStation, OpponentKind::kTag}) {
    for (uint64_t seed = 0; seed < 300; ++seed) {
      HandState h(DealFromSeed(seed));
      while (!h.finished()) {
        const uint64_t r = OpponentRandom(seed, h);
        const Action a = OpponentAction(kind, h, r);
        ASSERT_TRUE(h.IsLegal(a)) << OpponentName(kind) << " seed " << seed;
        ASSERT_EQ(a, OpponentAction(kind, h, r));
        ASSERT_TRUE(h.Apply(a).ok());
      }
    }
  }
}

TEST(PokerOpponents, CallingStationOnlyChecksAndCalls) {
  for (uint64_t seed = 0; seed < 100; ++seed) {
    HandState h(DealFromSeed(seed));
    ASSERT_TRUE(h.Apply(Action::kRaise).ok());
    EXPECT_EQ(OpponentAction(OpponentKind::kCallingStation, h, seed), Action::kCall);
  }
}

TEST(PokerOpponents, TagRaisesStrongFoldsWeakPreflop) {
  int aa_raises = 0, trash_folds = 0;
  const int n = 1000;
  for (uint64_t seed = 0; seed < n; ++seed) {
    HandState aa(WithHole(0, "As", "Ad", seed));
    aa_raises += OpponentAction(OpponentKind::kTag, aa, OpponentRandom(seed, aa)) == Action::kRaise;
    HandState trash(WithHole(1, "7s", "2d", seed));
    ASSERT_TRUE(trash.Apply(Action::kRaise).ok());  // the button raises; 72o in the big blind
    trash_folds += OpponentAction(OpponentKind::kTag, trash, OpponentRandom(seed, trash)) == Action::kFold;
  }
  EXPECT_EQ(aa_raises, n);
  // Folds unless it bluffs (8%) or calls light (5% of the rest): ~87%.
  EXPECT_GT(trash_folds, 0.80 * n);
  EXPECT_LT(trash_folds, 0.95 * n);
}

TEST(PokerOpponents, EquityEstimates) {
  // AA against a random hand preflop: 85.2%. 72o: 34.6%.
  HandState aa(WithHole(0, "As", "Ad", 5));
  EXPECT_NEAR(EstimateEquity(aa, 0, 4000, 1), 0.852, 0.02);
  HandState trash(WithHole(0, "7s", "2d", 5));
  EXPECT_NEAR(EstimateEquity(trash, 0, 4000, 1), 0.346, 0.02);
}

}  // namespace
}  // namespace echelon::data::poker
