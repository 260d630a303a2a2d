// Cards, decks and the deterministic deal of one heads-up hold'em hand.
//
// A card is an int 0..51: rank = card / 4 (0 = deuce .. 12 = ace), suit = card % 4
// (s, h, d, c). Text form is rank char + suit char ("As", "Td", "2c").
//
//   Deal d = DealFromSeed(42);            // same seed -> same cards on every machine
//   std::string s = CardString(d.hole[0][0]);
//
// Thread contract: plain values and pure functions; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "echelon/common/status.h"

namespace echelon::data::poker {

using Card = int;

inline constexpr int kNumCards = 52;
inline constexpr char kRankChars[] = "23456789TJQKA";
inline constexpr char kSuitChars[] = "shdc";

inline int RankOf(Card c) { return c / 4; }
inline int SuitOf(Card c) { return c % 4; }

std::string CardString(Card c);
// "As" -> 48 + 0; errors name the bad text.
Result<Card> ParseCard(const std::string& text);

// Fixed 64-bit mixing (splitmix64) rather than <random> distributions, whose outputs differ
// between standard libraries: a deal must be the same on every actor and after a restart.
uint64_t Mix64(uint64_t x);
uint64_t HashCombine(uint64_t a, uint64_t b);

// The cards of one hand: each seat's two hole cards and the five board cards, all distinct.
struct Deal {
  std::array<std::array<Card, 2>, 2> hole{};
  std::array<Card, 5> board{};
};

// Fisher-Yates shuffle driven by Mix64 of the seed; the first nine cards are dealt.
Deal DealFromSeed(uint64_t seed);

}  // namespace echelon::data::poker
