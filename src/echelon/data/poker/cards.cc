#include "echelon/data/poker/cards.h"

#include <cstring>
#include <utility>

namespace echelon::data::poker {

std::string CardString(Card c) {
  return std::string{kRankChars[RankOf(c)], kSuitChars[SuitOf(c)]};
}

Result<Card> ParseCard(const std::string& text) {
  const char* rank = text.size() == 2 ? std::strchr(kRankChars, text[0]) : nullptr;
  const char* suit = text.size() == 2 ? std::strchr(kSuitChars, text[1]) : nullptr;
  if (rank == nullptr || suit == nullptr || text[0] == '\0' || text[1] == '\0') {
    return InvalidArgument("bad card \"" + text + "\": expected rank (23456789TJQKA) then suit (shdc)");
  }
  return static_cast<Card>((rank - kRankChars) * 4 + (suit - kSuitChars));
}

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t HashCombine(uint64_t a, uint64_t b) { return Mix64(Mix64(a) ^ b); }

Deal DealFromSeed(uint64_t seed) {
  std::array<Card, kNumCards> deck;
  for (int i = 0; i < kNumCards; ++i) deck[i] = i;
  // Only the first nine positions are needed: a partial Fisher-Yates.
  for (int i = 0; i < 9; ++i) {
    const uint64_t r = HashCombine(seed, static_cast<uint64_t>(i));
    const int j = i + static_cast<int>(r % static_cast<uint64_t>(kNumCards - i));
    std::swap(deck[i], deck[j]);
  }
  Deal d;
  d.hole[0] = {deck[0], deck[1]};
  d.hole[1] = {deck[2], deck[3]};
  for (int i = 0; i < 5; ++i) d.board[i] = deck[4 + i];
  return d;
}

}  // namespace echelon::data::poker
