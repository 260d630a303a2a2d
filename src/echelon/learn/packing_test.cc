#include "echelon/learn/packing.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

namespace echelon::learn {
namespace {

TEST(PackingTest, FirstFitDecreasingFillsTheFirstRowWithRoom) {
  using Rows = std::vector<std::vector<size_t>>;
  EXPECT_EQ(PackFirstFitDecreasing({9, 3, 6, 1}, 10), (Rows{{0, 3}, {2, 1}}));
  EXPECT_EQ(PackFirstFitDecreasing({6, 5, 4, 3, 2}, 10), (Rows{{0, 2}, {1, 3, 4}}));
  EXPECT_EQ(PackFirstFitDecreasing({4, 4, 4}, 4), (Rows{{0}, {1}, {2}}));
  EXPECT_EQ(PackFirstFitDecreasing({}, 4), Rows{});
}

TEST(PackingTest, EverySequenceOnceNoRowOverfullAtMostOneRowUnderHalf) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t width = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<int64_t> lengths(rng() % 100);
    int64_t total = 0;
    for (int64_t& len : lengths) total += len = 1 + static_cast<int64_t>(rng() % width);
    const auto rows = PackFirstFitDecreasing(lengths, width);
    std::vector<int> seen(lengths.size(), 0);
    int under_half = 0;
    for (const auto& row : rows) {
      int64_t used = 0;
      for (size_t i : row) {
        ++seen.at(i);
        used += lengths[i];
      }
      EXPECT_LE(used, width);
      EXPECT_GT(used, 0);
      under_half += 2 * used <= width;
    }
    for (int s : seen) EXPECT_EQ(s, 1);
    EXPECT_LE(under_half, 1);
    EXPECT_LE(static_cast<int64_t>(rows.size()), 2 * total / width + 1);
  }
}

TEST(PackingTest, ALengthOutsideTheWidthIsRefused) {
  EXPECT_THROW(PackFirstFitDecreasing({3, 11}, 10), std::invalid_argument);
  EXPECT_THROW(PackFirstFitDecreasing({0}, 10), std::invalid_argument);
}

TEST(PackingTest, PackingPaysOnlyWhenItRemovesAnEighthOfTheRows) {
  EXPECT_FALSE(PackingPays(16, 16));  // equal rows: nothing saved
  EXPECT_FALSE(PackingPays(16, 15));
  EXPECT_TRUE(PackingPays(16, 14));
  EXPECT_TRUE(PackingPays(8, 7));
  EXPECT_FALSE(PackingPays(1, 1));
  EXPECT_TRUE(PackingPays(2, 1));
}

}  // namespace
}  // namespace echelon::learn
