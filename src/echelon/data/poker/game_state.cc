#include "echelon/data/poker/game_state.h"

#include "echelon/data/poker/hand_evaluator.h"

namespace echelon::data::poker {

char ActionChar(Action a) {
  switch (a) {
    case Action::kFold: return 'f';
    case Action::kCall: return 'c';
    case Action::kRaise: return 'r';
  }
  return '?';
}

HandState::HandState(const Deal& deal) : deal_(deal) {}

int HandState::to_call() const {
  if (finished_) return 0;
  return contributed_[1 - to_act_] - contributed_[to_act_];
}

int HandState::board_cards_visible() const {
  static constexpr int kVisible[kNumStreets] = {0, 3, 4, 5};
  return kVisible[street_ < kNumStreets ? street_ : kNumStreets - 1];
}

std::vector<Action> HandState::LegalActions() const {
  std::vector<Action> out;
  if (finished_) return out;
  if (to_call() > 0) out.push_back(Action::kFold);
  out.push_back(Action::kCall);
  if (bets_ < kMaxBetsPerRound) out.push_back(Action::kRaise);
  return out;
}

bool HandState::IsLegal(Action a) const {
  if (finished_) return false;
  switch (a) {
    case Action::kFold: return to_call() > 0;
    case Action::kCall: return true;
    case Action::kRaise: return bets_ < kMaxBetsPerRound;
  }
  return false;
}

Status HandState::Apply(Action a) {
  if (finished_) return FailedPrecondition("the hand is over; no action can be applied");
  if (!IsLegal(a)) {
    return InvalidArgument(std::string("action '") + ActionChar(a) + "' is not legal here (to call " +
                           std::to_string(to_call()) + ", bets this round " + std::to_string(bets_) + ")");
  }
  history_[street_].push_back(ActionChar(a));
  ++acted_;
  const int seat = to_act_;
  switch (a) {
    case Action::kFold:
      folder_ = seat;
      finished_ = true;
      return Status::Ok();
    case Action::kCall:
      contributed_[seat] = contributed_[1 - seat];
      if (acted_ >= 2) {
        EndRound();
        return Status::Ok();
      }
      break;
    case Action::kRaise:
      contributed_[seat] = contributed_[1 - seat] + raise_size();
      ++bets_;
      break;
  }
  to_act_ = 1 - seat;
  return Status::Ok();
}

Status HandState::Forfeit() {
  if (finished_) return FailedPrecondition("the hand is over; no action can be applied");
  history_[street_].push_back(ActionChar(Action::kFold));
  folder_ = to_act_;
  finished_ = true;
  return Status::Ok();
}

void HandState::EndRound() {
  ++street_;
  if (street_ == kNumStreets) {
    street_ = kNumStreets - 1;  // stays "river" for display
    finished_ = true;
    return;
  }
  bets_ = 0;
  acted_ = 0;
  to_act_ = FirstToAct(street_);
}

int HandState::Payoff(int seat) const {
  if (!finished_) return 0;
  if (folder_ >= 0) return folder_ == seat ? -contributed_[seat] : contributed_[1 - seat];
  std::vector<Card> a(deal_.board.begin(), deal_.board.end());
  std::vector<Card> b = a;
  a.insert(a.end(), deal_.hole[seat].begin(), deal_.hole[seat].end());
  b.insert(b.end(), deal_.hole[1 - seat].begin(), deal_.hole[1 - seat].end());
  const HandValue mine = EvaluateHand(a);
  const HandValue theirs = EvaluateHand(b);
  // Bets are equal at showdown, so the pot splits evenly with no odd chip.
  if (mine == theirs) return 0;
  return mine > theirs ? contributed_[1 - seat] : -contributed_[seat];
}

}  // namespace echelon::data::poker
