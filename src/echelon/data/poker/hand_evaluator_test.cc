#include "echelon/data/poker/hand_evaluator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace echelon::data::poker {
namespace {

std::vector<Card> Cards(const std::string& text) {
  std::vector<Card> out;
  std::istringstream in(text);
  std::string c;
  while (in >> c) out.push_back(ParseCard(c).value());
  return out;
}

HandValue Eval(const std::string& text) { return EvaluateHand(Cards(text)); }

TEST(PokerCards, RoundTripsEveryCard) {
  for (Card c = 0; c < kNumCards; ++c) EXPECT_EQ(ParseCard(CardString(c)).value(), c);
  EXPECT_EQ(CardString(ParseCard("As").value()), "As");
  EXPECT_EQ(RankOf(ParseCard("Td").value()), 8);
  EXPECT_FALSE(ParseCard("1s").ok());
  EXPECT_FALSE(ParseCard("Ax").ok());
  EXPECT_FALSE(ParseCard("A").ok());
}

TEST(PokerCards, DealIsDeterministicAndDistinct) {
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const Deal a = DealFromSeed(seed), b = DealFromSeed(seed);
    std::vector<Card> all = {a.hole[0][0], a.hole[0][1], a.hole[1][0], a.hole[1][1]};
    all.insert(all.end(), a.board.begin(), a.board.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::unique(all.begin(), all.end()), all.end()) << seed;
    EXPECT_EQ(a.board, b.board);
    EXPECT_EQ(a.hole, b.hole);
  }
  EXPECT_NE(DealFromSeed(1).board, DealFromSeed(2).board);
}

TEST(PokerEvaluator, Categories) {
  EXPECT_EQ(CategoryOf(Eval("As Ks Qs Js Ts 2c 3d")), HandCategory::kStraightFlush);
  EXPECT_EQ(CategoryOf(Eval("Ah 2h 3h 4h 5h Kc Kd")), HandCategory::kStraightFlush);  // steel wheel
  EXPECT_EQ(CategoryOf(Eval("9c 9d 9h 9s 2c 3d 4h")), HandCategory::kQuads);
  EXPECT_EQ(CategoryOf(Eval("9c 9d 9h 8s 8c 3d 4h")), HandCategory::kFullHouse);
  EXPECT_EQ(CategoryOf(Eval("9c 9d 9h 8s 8c 8d 4h")), HandCategory::kFullHouse);  // two trips
  EXPECT_EQ(CategoryOf(Eval("2c 7c 9c Jc Kc Ad Ah")), HandCategory::kFlush);
  EXPECT_EQ(CategoryOf(Eval("Ac 2d 3h 4s 5c 9d Jh")), HandCategory::kStraight);  // wheel
  EXPECT_EQ(CategoryOf(Eval("7c 7d 7h Ks 2c 3d 9h")), HandCategory::kTrips);
  EXPECT_EQ(CategoryOf(Eval("7c 7d 2h 2s Kc 3d 9h")), HandCategory::kTwoPair);
  EXPECT_EQ(CategoryOf(Eval("7c 7d 2h 5s Kc 3d 9h")), HandCategory::kPair);
  EXPECT_EQ(CategoryOf(Eval("7c Jd 2h 5s Kc 3d 9h")), HandCategory::kHighCard);
  EXPECT_STREQ(CategoryName(HandCategory::kFullHouse), "full house");
}

TEST(PokerEvaluator, OrdersWithinCategories) {
  EXPECT_GT(Eval("6c 2d 3h 4s 5c 9d Jh"), Eval("Ac 2d 3h 4s 5c 9d Jh"));  // six-high beats the wheel
  EXPECT_GT(Eval("Ac Kd Qh Js Tc 2d 3h"), Eval("9c Kd Qh Js Tc 2d 3h"));  // broadway beats king-high
  EXPECT_LT(Eval("9c 9d 9h 8s 8c 8d 4h"), Eval("9c 9d 9h 7s 7c Ad Ah"));  // nines full of aces beat nines full of eights
}

TEST(PokerEvaluator, KickersAndTies) {
  // Three pairs: the best two plus the best remaining card (the third pair's rank counts).
  EXPECT_EQ(Eval("Kc Kd Qh Qs 5c 5d 2h"), Eval("Kc Kd Qh Qs 5c 4d 2h"));
  EXPECT_LT(Eval("Kc Kd Qh Qs 5c 5d 2h"), Eval("Kc Kd Qh Qs 6c 5d 2h"));
  // Board plays: both players have the same best five.
  EXPECT_EQ(Eval("Ah Kh Qh Jh Th 2c 3d"), Eval("Ah Kh Qh Jh Th 4s 5s"));
  // Only five cards count: the sixth and seventh kickers do not break ties.
  EXPECT_EQ(Eval("Ac Kd 9h 7s 5c 3d 2h"), Eval("Ac Kd 9h 7s 5c 4d 3h"));
  EXPECT_LT(Eval("Ac Kd 9h 7s 4c 3d 2h"), Eval("Ac Kd 9h 7s 5c 4d 3h"));
  // Quads kicker: best card outside the quads.
  EXPECT_LT(Eval("9c 9d 9h 9s Qc Qd 4h"), Eval("9c 9d 9h 9s Kc 2d 4h"));
  // Flush compares all five cards.
  EXPECT_LT(Eval("Ac Kc 9c 7c 4c 3d 2h"), Eval("Ac Kc 9c 7c 5c 3d 2h"));
  // Full house: trips first, then the best pair.
  EXPECT_GT(Eval("9c 9d 9h As Ac 8d 8h"), Eval("9c 9d 9h 8s 8c 8d 4h"));
  // Five cards are accepted too.
  EXPECT_EQ(CategoryOf(Eval("Ac 2d 3h 4s 5c")), HandCategory::kStraight);
}

// Writes random showdowns for tests/poker_evaluator_test.sh to compare with an independent
// evaluator under Node: one line per deal, "board(5) holeA(2) holeB(2) valueA valueB".
// Runs only when ECHELON_POKER_HANDS_OUT names the file to write.
TEST(PokerEvaluatorDump, WritesRandomShowdowns) {
  const char* path = std::getenv("ECHELON_POKER_HANDS_OUT");
  if (path == nullptr) GTEST_SKIP() << "set ECHELON_POKER_HANDS_OUT to write hands (tests/poker_evaluator_test.sh)";
  const char* n_text = std::getenv("ECHELON_POKER_HANDS_N");
  const int64_t n = n_text ? std::atoll(n_text) : 100000;
  std::ofstream out(path);
  ASSERT_TRUE(out.good()) << path;
  for (int64_t i = 0; i < n; ++i) {
    const Deal d = DealFromSeed(0x65766131ULL + static_cast<uint64_t>(i));
    std::vector<Card> a(d.board.begin(), d.board.end()), b = a;
    a.insert(a.end(), d.hole[0].begin(), d.hole[0].end());
    b.insert(b.end(), d.hole[1].begin(), d.hole[1].end());
    for (Card c : d.board) out << CardString(c) << ' ';
    out << CardString(d.hole[0][0]) << ' ' << CardString(d.hole[0][1]) << ' ' << CardString(d.hole[1][0]) << ' '
        << CardString(d.hole[1][1]) << ' ' << EvaluateHand(a) << ' ' << EvaluateHand(b) << '\n';
  }
  ASSERT_TRUE(out.good());
}

}  // namespace
}  // namespace echelon::data::poker
