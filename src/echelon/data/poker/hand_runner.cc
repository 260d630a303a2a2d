#include "echelon/data/poker/hand_runner.h"

#include <algorithm>

#include "echelon/data/poker/observation.h"

namespace echelon::data::poker {

void AdvanceOpponent(HandState& hand, const TableSpec& table) {
  while (!hand.finished() && hand.to_act() != table.policy_seat) {
    const Action a = OpponentAction(table.opponent, hand, OpponentRandom(table.deal_seed, hand));
    (void)hand.Apply(a);  // opponents only return legal actions
  }
}

bool ApplyAnswer(HandState& hand, const std::string& answer, IllegalAction illegal) {
  const std::optional<Action> a = ParseAnswer(answer);
  if (a && hand.IsLegal(*a)) {
    (void)hand.Apply(*a);
    return true;
  }
  if (illegal == IllegalAction::kFold) {
    (void)hand.Forfeit();
  } else {
    (void)hand.Apply(Action::kCall);
  }
  return false;
}

ReplayedHand ReplayHand(const TableSpec& table, const std::vector<std::string>& answers, IllegalAction illegal) {
  ReplayedHand out;
  HandState hand(DealFromSeed(table.deal_seed));
  AdvanceOpponent(hand, table);
  for (size_t i = 0; i < answers.size() && !hand.finished(); ++i) {
    out.prompts.push_back(PromptText(hand, table.policy_seat));
    (void)ApplyAnswer(hand, answers[i], illegal);
    AdvanceOpponent(hand, table);
  }
  while (!hand.finished()) {
    (void)hand.Apply(Action::kCall);
    AdvanceOpponent(hand, table);
  }
  out.chips = hand.Payoff(table.policy_seat);
  return out;
}

Result<std::vector<PlayedHand>> PlayHands(const std::vector<TableSpec>& tables, Policy& policy, uint64_t seed,
                                  const RunnerOptions& options) {
  std::vector<HandState> hands;
  hands.reserve(tables.size());
  for (const TableSpec& t : tables) {
    hands.emplace_back(DealFromSeed(t.deal_seed));
    AdvanceOpponent(hands.back(), t);
  }
  std::vector<PlayedHand> out(tables.size());
  for (uint64_t round = 0;; ++round) {
    std::vector<size_t> waiting;
    for (size_t i = 0; i < hands.size(); ++i)
      if (!hands[i].finished()) waiting.push_back(i);
    if (waiting.empty()) break;
    const size_t batch = options.max_batch == 0 ? waiting.size() : options.max_batch;
    for (size_t start = 0; start < waiting.size(); start += batch) {
      const size_t end = std::min(waiting.size(), start + batch);
      std::vector<PolicyPrompt> prompts;
      for (size_t k = start; k < end; ++k)
        prompts.push_back(PromptText(hands[waiting[k]], tables[waiting[k]].policy_seat));
      ECHELON_ASSIGN_OR_RETURN(std::vector<Turn> turns,
                               policy.Sample(prompts, HashCombine(seed, round * 1000003 + start)));
      if (turns.size() != prompts.size())
        return Internal("poker: policy returned " + std::to_string(turns.size()) + " answers for " +
                        std::to_string(prompts.size()) + " prompts");
      for (size_t k = start; k < end; ++k) {
        const size_t i = waiting[k];
        Turn& turn = turns[k - start];
        if (!ApplyAnswer(hands[i], turn.text, options.illegal)) ++out[i].illegal;
        out[i].episode.turns.push_back(std::move(turn));
        AdvanceOpponent(hands[i], tables[i]);
      }
    }
  }
  for (size_t i = 0; i < hands.size(); ++i) {
    out[i].chips = hands[i].Payoff(tables[i].policy_seat);
    out[i].episode.reward = ChipsToBigBlinds(out[i].chips);
    out[i].episode.success = out[i].chips > 0;
  }
  return out;
}

}  // namespace echelon::data::poker
