// One hand of heads-up fixed-limit Texas Hold'em, as a state machine driven by actions.
//
// Rules: seat 0 is the button and posts the small blind (1 chip), seat 1 the big blind
// (2 chips). Bets and raises are fixed: 2 chips preflop and on the flop (small bet), 4 on
// the turn and river (big bet). At most four bets per round (preflop the big blind counts as
// the first, so three raises). The button acts first preflop and second on later streets.
// A round ends when both players have acted and the bets are equal; after the river both
// hands are shown and the best five-card hand (EvaluateHand) wins; equal hands split the
// pot. Each seat starts with 200 chips (100 big blinds); a hand can cost at most
// 48 chips (8 + 8 + 16 + 16) so stacks never bind, and there are no all-ins.
//
// Actions are three: fold, check-or-call, bet-or-raise. Fold is legal only when facing a
// bet (folding when a check is free is not an action of this game); raise only below the cap.
//
//   HandState h(DealFromSeed(7));
//   while (!h.finished()) h.Apply(h.LegalActions().back());   // raise while allowed
//   int won = h.Payoff(0);                                     // net chips, seat 0
//
// Thread contract: a plain value; not synchronised.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/poker/cards.h"

namespace echelon::data::poker {

// Rules constants, in chips.
inline constexpr int kSmallBlind = 1;
inline constexpr int kBigBlind = 2;
inline constexpr int kSmallBet = 2;      // preflop and flop
inline constexpr int kBigBet = 4;        // turn and river
inline constexpr int kMaxBetsPerRound = 4;
inline constexpr int kStartingStack = 200;
inline constexpr int kNumStreets = 4;    // preflop, flop, turn, river

enum class Action { kFold, kCall, kRaise };  // kCall = check or call; kRaise = bet or raise

// 'f', 'c', 'r': the policy's answer vocabulary and the prompt's history letters.
char ActionChar(Action a);

class HandState {
 public:
  explicit HandState(const Deal& deal);

  bool finished() const { return finished_; }
  int to_act() const { return finished_ ? -1 : to_act_; }  // seat, -1 when finished
  int street() const { return street_; }                    // 0 preflop .. 3 river
  int pot() const { return contributed_[0] + contributed_[1]; }
  int contributed(int seat) const { return contributed_[seat]; }
  int stack(int seat) const { return kStartingStack - contributed_[seat]; }
  int to_call() const;            // chips the player to act must add to call
  int bets_this_round() const { return bets_; }
  int raise_size() const { return street_ < 2 ? kSmallBet : kBigBet; }
  int board_cards_visible() const;  // 0, 3, 4, 5
  const Deal& deal() const { return deal_; }

  std::vector<Action> LegalActions() const;  // in the order fold, call, raise
  bool IsLegal(Action a) const;
  // FailedPrecondition when the hand is over, InvalidArgument for an illegal action.
  Status Apply(Action a);
  // Ends the hand as a fold by the player to act even where a check was free (the penalty
  // for an illegal answer; see PokerAdapter's illegal_action). Recorded as 'f'.
  Status Forfeit();

  // Actions of each street so far, as 'f'/'c'/'r'; players alternate within a street, the
  // button first preflop and the big blind first after.
  const std::array<std::string, kNumStreets>& history() const { return history_; }
  static int FirstToAct(int street) { return street == 0 ? 0 : 1; }

  // Once finished: the seat that folded (-1 at showdown), and net chips won by `seat`.
  int folder() const { return folder_; }
  int Payoff(int seat) const;

 private:
  void EndRound();

  Deal deal_;
  std::array<int, 2> contributed_{kSmallBlind, kBigBlind};
  std::array<std::string, kNumStreets> history_;
  int street_ = 0;
  int to_act_ = 0;
  int bets_ = 1;          // the big blind is the first bet preflop
  int acted_ = 0;         // actions taken this round
  int folder_ = -1;
  bool finished_ = false;
};

}  // namespace echelon::data::poker
