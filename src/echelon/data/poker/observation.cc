#include "echelon/data/poker/observation.h"

#include <algorithm>
#include <cctype>

#include "echelon/data/poker/opponents.h"

namespace echelon::data::poker {

std::string PokerAlphabet() {
  std::string chars = std::string(kRankChars) + kSuitChars + "SB -/>0123456789fcrFCR";
  std::string out;
  for (char c : chars)
    if (out.find(c) == std::string::npos) out.push_back(c);
  return out;
}

int StrengthDigit(const HandState& hand, int seat) {
  const Deal& d = hand.deal();
  const Card lo = std::min(d.hole[seat][0], d.hole[seat][1]);
  const Card hi = std::max(d.hole[seat][0], d.hole[seat][1]);
  uint64_t random = HashCombine(HashCombine(0x737472656e677468ULL, static_cast<uint64_t>(lo)), static_cast<uint64_t>(hi));
  for (int i = 0; i < hand.board_cards_visible(); ++i) random = HashCombine(random, static_cast<uint64_t>(d.board[i]));
  const double equity = EstimateEquity(hand, seat, kStrengthSamples, random);
  return std::clamp(static_cast<int>(equity * 10), 0, 9);
}

std::string PromptText(const HandState& hand, int seat) {
  const Deal& d = hand.deal();
  std::string s(1, seat == 0 ? 'S' : 'B');
  s += static_cast<char>('0' + StrengthDigit(hand, seat));
  s += CardString(d.hole[seat][0]) + CardString(d.hole[seat][1]) + ' ';
  const int visible = hand.board_cards_visible();
  if (visible == 0) s += '-';
  for (int i = 0; i < visible; ++i) s += CardString(d.board[i]);
  s += ' ' + std::to_string(hand.pot()) + ' ';
  std::string history;
  for (int street = 0; street <= hand.street(); ++street) {
    if (street > 0) history += '/';
    const std::string& acts = hand.history()[street];
    for (size_t i = 0; i < acts.size(); ++i) {
      const int actor = (HandState::FirstToAct(street) + static_cast<int>(i)) % 2;
      history += actor == seat ? acts[i] : static_cast<char>(std::toupper(static_cast<unsigned char>(acts[i])));
    }
  }
  s += history.empty() ? "-" : history;
  s += '>';
  return s;
}

std::optional<Action> ParseAnswer(const std::string& answer) {
  if (answer == "f") return Action::kFold;
  if (answer == "c") return Action::kCall;
  if (answer == "r") return Action::kRaise;
  return std::nullopt;
}

}  // namespace echelon::data::poker
