#include "echelon/data/poker/opponents.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "echelon/data/poker/hand_evaluator.h"

namespace echelon::data::poker {
namespace {

// A uniform double in [0, 1) from the i-th draw of a random stream.
double Uniform(uint64_t random, uint64_t i) {
  return static_cast<double>(HashCombine(random, i) >> 11) * (1.0 / 9007199254740992.0);
}

Action TagPreflop(const HandState& hand, const TagRules& rules, uint64_t random) {
  const int seat = hand.to_act();
  const double chen = ChenScore(hand.deal().hole[seat][0], hand.deal().hole[seat][1]);
  const bool facing_raise = hand.bets_this_round() >= 2;
  if (chen >= rules.preflop_reraise_chen || (chen >= rules.preflop_raise_chen && !facing_raise)) {
    return hand.IsLegal(Action::kRaise) ? Action::kRaise : Action::kCall;
  }
  if (chen >= rules.preflop_call_chen || hand.to_call() == 0) return Action::kCall;
  return Uniform(random, 3) < rules.loose_call_probability ? Action::kCall : Action::kFold;
}

Action TagPostflop(const HandState& hand, const TagRules& rules, uint64_t random) {
  const int seat = hand.to_act();
  const double equity = EstimateEquity(hand, seat, rules.equity_samples, HashCombine(random, 7));
  if (equity >= rules.raise_equity[hand.street()] && hand.IsLegal(Action::kRaise)) return Action::kRaise;
  const int to_call = hand.to_call();
  if (to_call == 0) return Action::kCall;
  const double pot_odds = static_cast<double>(to_call) / (hand.pot() + to_call);
  if (equity >= pot_odds + rules.call_margin) return Action::kCall;
  return Uniform(random, 3) < rules.loose_call_probability ? Action::kCall : Action::kFold;
}

}  // namespace

Result<OpponentKind> ParseOpponent(const std::string& name) {
  if (name == "random") return OpponentKind::kRandom;
  if (name == "calling-station") return OpponentKind::kCallingStation;
  if (name == "tag") return OpponentKind::kTag;
  return InvalidArgument("unknown poker opponent \"" + name + "\"; known opponents: random, calling-station, tag");
}

const char* OpponentName(OpponentKind kind) {
  switch (kind) {
    case OpponentKind::kRandom: return "random";
    case OpponentKind::kCallingStation: return "calling-station";
    case OpponentKind::kTag: return "tag";
  }
  return "unknown";
}

Action OpponentAction(OpponentKind kind, const HandState& hand, uint64_t random, const TagRules& rules) {
  const std::vector<Action> legal = hand.LegalActions();
  switch (kind) {
    case OpponentKind::kRandom:
      return legal[HashCombine(random, 1) % legal.size()];
    case OpponentKind::kCallingStation:
      return Action::kCall;
    case OpponentKind::kTag:
      break;
  }
  if (hand.IsLegal(Action::kRaise) && Uniform(random, 2) < rules.bluff_probability) return Action::kRaise;
  return hand.street() == 0 ? TagPreflop(hand, rules, random) : TagPostflop(hand, rules, random);
}

uint64_t OpponentRandom(uint64_t deal_seed, const HandState& hand) {
  uint64_t h = HashCombine(deal_seed, 0x6f70706f6e656e74ULL + static_cast<uint64_t>(hand.to_act()));
  for (int s = 0; s < kNumStreets; ++s) {
    for (char c : hand.history()[s]) h = HashCombine(h, static_cast<uint64_t>(c));
    h = HashCombine(h, '/');
  }
  return h;
}

double ChenScore(Card a, Card b) {
  static constexpr double kHighCardPoints[13] = {1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 10};
  const int hi = std::max(RankOf(a), RankOf(b));
  const int lo = std::min(RankOf(a), RankOf(b));
  if (hi == lo) return std::max(5.0, 2 * kHighCardPoints[hi]);
  double score = kHighCardPoints[hi];
  if (SuitOf(a) == SuitOf(b)) score += 2;
  const int gap = hi - lo - 1;
  static constexpr double kGapPenalty[5] = {0, 1, 2, 4, 5};
  score -= kGapPenalty[std::min(gap, 4)];
  if (gap <= 1 && hi < 10) score += 1;  // both below a queen: straight potential
  return std::ceil(score);
}

double EstimateEquity(const HandState& hand, int seat, int samples, uint64_t random) {
  const Deal& d = hand.deal();
  const int visible = hand.board_cards_visible();
  std::vector<Card> known(d.hole[seat].begin(), d.hole[seat].end());
  known.insert(known.end(), d.board.begin(), d.board.begin() + visible);
  std::vector<Card> deck;
  for (Card c = 0; c < kNumCards; ++c)
    if (std::find(known.begin(), known.end(), c) == known.end()) deck.push_back(c);
  const int need = 2 + (5 - visible);
  double wins = 0;
  std::vector<Card> mine, theirs;
  for (int s = 0; s < samples; ++s) {
    for (int i = 0; i < need; ++i) {
      const uint64_t r = HashCombine(random, static_cast<uint64_t>(s) * 16 + i);
      std::swap(deck[i], deck[i + r % (deck.size() - i)]);
    }
    mine.assign(d.board.begin(), d.board.begin() + visible);
    mine.insert(mine.end(), deck.begin() + 2, deck.begin() + need);
    theirs = mine;
    mine.insert(mine.end(), d.hole[seat].begin(), d.hole[seat].end());
    theirs.insert(theirs.end(), deck.begin(), deck.begin() + 2);
    const HandValue a = EvaluateHand(mine), b = EvaluateHand(theirs);
    wins += a > b ? 1.0 : (a == b ? 0.5 : 0.0);
  }
  return samples > 0 ? wins / samples : 0.5;
}

}  // namespace echelon::data::poker
