#include "echelon/data/poker/game_state.h"

#include <gtest/gtest.h>

#include "echelon/data/poker/hand_evaluator.h"

namespace echelon::data::poker {
namespace {

using A = Action;
const std::vector<Action> kFCR = {A::kFold, A::kCall, A::kRaise};
const std::vector<Action> kCR = {A::kCall, A::kRaise};
const std::vector<Action> kFC = {A::kFold, A::kCall};

void Play(HandState& h, const std::string& actions) {
  for (char c : actions) {
    const Action a = c == 'f' ? A::kFold : c == 'c' ? A::kCall : A::kRaise;
    ASSERT_TRUE(h.Apply(a).ok()) << "action " << c << " of " << actions;
  }
}

// A deal with given hole cards and board ("AsKd" "QhQc" "2c3d4h5s9c").
Deal MakeDeal(const std::string& h0, const std::string& h1, const std::string& board) {
  Deal d;
  d.hole[0] = {ParseCard(h0.substr(0, 2)).value(), ParseCard(h0.substr(2, 2)).value()};
  d.hole[1] = {ParseCard(h1.substr(0, 2)).value(), ParseCard(h1.substr(2, 2)).value()};
  for (int i = 0; i < 5; ++i) d.board[i] = ParseCard(board.substr(2 * i, 2)).value();
  return d;
}

TEST(PokerGame, BlindsAndFirstDecision) {
  HandState h(DealFromSeed(1));
  EXPECT_EQ(h.contributed(0), 1);
  EXPECT_EQ(h.contributed(1), 2);
  EXPECT_EQ(h.pot(), 3);
  EXPECT_EQ(h.stack(0), 199);
  EXPECT_EQ(h.to_act(), 0);  // the button (small blind) acts first preflop
  EXPECT_EQ(h.to_call(), 1);
  EXPECT_EQ(h.street(), 0);
  EXPECT_EQ(h.bets_this_round(), 1);
  EXPECT_EQ(h.LegalActions(), kFCR);
}

TEST(PokerGame, BigBlindOptionAfterALimp) {
  HandState h(DealFromSeed(1));
  Play(h, "c");
  EXPECT_EQ(h.street(), 0);
  EXPECT_EQ(h.to_act(), 1);
  EXPECT_EQ(h.to_call(), 0);
  EXPECT_EQ(h.LegalActions(), kCR);  // no fold when a check is free
  EXPECT_FALSE(h.IsLegal(A::kFold));
  EXPECT_EQ(h.Apply(A::kFold).code(), StatusCode::kInvalidArgument);
  Play(h, "c");
  EXPECT_EQ(h.street(), 1);
  EXPECT_EQ(h.to_act(), 1);  // the big blind acts first after the flop
  EXPECT_EQ(h.board_cards_visible(), 3);
  EXPECT_EQ(h.pot(), 4);
  EXPECT_EQ(h.bets_this_round(), 0);
}

TEST(PokerGame, PreflopCapIsFourBetsBlindIncluded) {
  HandState h(DealFromSeed(1));
  Play(h, "rrr");  // SB raise to 4, BB 6, SB caps at 8
  EXPECT_EQ(h.contributed(0), 8);
  EXPECT_EQ(h.contributed(1), 6);
  EXPECT_EQ(h.bets_this_round(), 4);
  EXPECT_EQ(h.LegalActions(), kFC);
  EXPECT_EQ(h.Apply(A::kRaise).code(), StatusCode::kInvalidArgument);
  Play(h, "c");
  EXPECT_EQ(h.street(), 1);
  EXPECT_EQ(h.pot(), 16);
}

TEST(PokerGame, PostflopCapAndBetSizes) {
  HandState h(DealFromSeed(1));
  Play(h, "cc");       // flop, pot 4
  Play(h, "rrrr");     // bet 2, raise, raise, cap: 8 each
  EXPECT_EQ(h.LegalActions(), kFC);
  EXPECT_EQ(h.contributed(0), 10);  // blind 2 + raises to 10
  EXPECT_EQ(h.contributed(1), 8);
  EXPECT_EQ(h.to_call(), 2);
  Play(h, "c");
  EXPECT_EQ(h.street(), 2);
  EXPECT_EQ(h.pot(), 20);
  EXPECT_EQ(h.raise_size(), 4);
  Play(h, "r");        // turn bet is a big bet
  EXPECT_EQ(h.contributed(1), 14);
  EXPECT_EQ(h.to_call(), 4);
  Play(h, "c");
  EXPECT_EQ(h.street(), 3);
  EXPECT_EQ(h.board_cards_visible(), 5);
  Play(h, "cr");       // check, bet 4
  EXPECT_EQ(h.LegalActions(), kFCR);
  Play(h, "c");
  EXPECT_TRUE(h.finished());
  EXPECT_EQ(h.to_act(), -1);
  EXPECT_EQ(h.contributed(0), 18);
  EXPECT_EQ(h.contributed(1), 18);
  EXPECT_EQ(h.history()[0], "cc");
  EXPECT_EQ(h.history()[1], "rrrrc");
  EXPECT_EQ(h.history()[2], "rc");
  EXPECT_EQ(h.history()[3], "crc");
  EXPECT_EQ(h.Apply(A::kCall).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(h.LegalActions().empty());
}

TEST(PokerGame, MaximumCostIs48Chips) {
  HandState h(DealFromSeed(3));
  Play(h, "rrrc");   // 8
  Play(h, "rrrrc");  // +8
  Play(h, "rrrrc");  // +16
  Play(h, "rrrrc");  // +16
  EXPECT_TRUE(h.finished());
  EXPECT_EQ(h.contributed(0), 48);
  EXPECT_EQ(h.contributed(1), 48);
}

TEST(PokerGame, FoldPayoffs) {
  HandState sb_folds(DealFromSeed(1));
  Play(sb_folds, "f");
  EXPECT_TRUE(sb_folds.finished());
  EXPECT_EQ(sb_folds.folder(), 0);
  EXPECT_EQ(sb_folds.Payoff(0), -1);
  EXPECT_EQ(sb_folds.Payoff(1), 1);

  HandState bb_folds(DealFromSeed(1));
  Play(bb_folds, "rf");
  EXPECT_EQ(bb_folds.Payoff(0), 2);
  EXPECT_EQ(bb_folds.Payoff(1), -2);

  HandState river_fold(DealFromSeed(1));
  Play(river_fold, "rc" "cc" "rc" "rf");
  EXPECT_EQ(river_fold.folder(), 0);  // the button folds to the river bet
  EXPECT_EQ(river_fold.Payoff(0), -(4 + 4));
  EXPECT_EQ(river_fold.Payoff(1), 8);
}

TEST(PokerGame, ForfeitEndsTheHandEvenWhenACheckIsFree) {
  HandState h(DealFromSeed(1));
  Play(h, "cc");
  ASSERT_EQ(h.to_call(), 0);
  ASSERT_TRUE(h.Forfeit().ok());
  EXPECT_TRUE(h.finished());
  EXPECT_EQ(h.folder(), 1);
  EXPECT_EQ(h.Payoff(1), -2);
  EXPECT_EQ(h.Payoff(0), 2);
  EXPECT_EQ(h.history()[1], "f");
}

TEST(PokerGame, ShowdownPaysTheBestHand) {
  // Seat 1 makes a flush on the river; seat 0 has top pair.
  HandState h(MakeDeal("AsKd", "7h2h", "AhTh9c3h4s"));
  Play(h, "rc" "cc" "cc" "rc");
  ASSERT_TRUE(h.finished());
  EXPECT_EQ(h.folder(), -1);
  EXPECT_EQ(h.Payoff(1), 4 + 4);
  EXPECT_EQ(h.Payoff(0), -8);
}

TEST(PokerGame, SplitPotWhenTheBoardPlays) {
  HandState h(MakeDeal("2c3d", "4c5d", "AhKhQhJhTh"));
  Play(h, "rrrc" "rc" "cc" "cc");
  ASSERT_TRUE(h.finished());
  EXPECT_EQ(h.Payoff(0), 0);
  EXPECT_EQ(h.Payoff(1), 0);
  // Equal two pair with equal kicker splits too; a better kicker wins.
  HandState tie(MakeDeal("Ac2d", "Ad3c", "KsKh9s9h5c"));
  Play(tie, "cc" "cc" "cc" "cc");
  EXPECT_EQ(tie.Payoff(0), 0);
  HandState kicker(MakeDeal("Ac2d", "Qd3c", "KsKh9s9h5c"));
  Play(kicker, "cc" "cc" "cc" "cc");
  EXPECT_EQ(kicker.Payoff(0), 2);
  EXPECT_EQ(kicker.Payoff(1), -2);
}

// Random legal play: every hand ends within the action bound, chips are conserved and the
// pot matches the contributions.
TEST(PokerGame, RandomPlayEndsAndConservesChips) {
  int showdowns = 0, folds = 0;
  for (uint64_t seed = 0; seed < 20000; ++seed) {
    HandState h(DealFromSeed(seed));
    int steps = 0;
    while (!h.finished()) {
      const std::vector<Action> legal = h.LegalActions();
      ASSERT_FALSE(legal.empty());
      ASSERT_TRUE(h.Apply(legal[HashCombine(seed, steps) % legal.size()]).ok());
      ASSERT_LE(++steps, 4 * 6);  // at most 6 actions a round: check, bet, 3 raises, call
    }
    EXPECT_EQ(h.Payoff(0) + h.Payoff(1), 0);
    EXPECT_LE(h.contributed(0), 48);
    EXPECT_EQ(h.stack(0) + h.stack(1) + h.pot(), 2 * kStartingStack);
    (h.folder() >= 0 ? folds : showdowns)++;
  }
  EXPECT_GT(showdowns, 0);
  EXPECT_GT(folds, 0);
}

}  // namespace
}  // namespace echelon::data::poker
