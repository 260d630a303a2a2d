#include "echelon/common/log.h"

#include <gtest/gtest.h>

namespace echelon {
namespace {

// Every refused submission and every call without a token wrote a log line: a caller could
// fill the learner's disk at will. A budget writes at most `lines` per period and key.
TEST(LogBudgetTest, AFloodWritesABoundedNumberOfLinesPerKeyAndPeriod) {
  SimulatedClock clock;
  LogBudget budget(3, 60, &clock);
  int written = 0;
  for (int i = 0; i < 1000; ++i) written += budget.Allow("not_lease_holder");
  EXPECT_EQ(written, 3);
  EXPECT_TRUE(budget.Allow("unauthenticated")) << "each key has its own budget";
  EXPECT_EQ(budget.left_out(), 997);
  clock.Advance(30);
  EXPECT_FALSE(budget.Allow("not_lease_holder")) << "still the same period";
  clock.Advance(31);
  written = 0;
  for (int i = 0; i < 10; ++i) written += budget.Allow("not_lease_holder");
  EXPECT_EQ(written, 3) << "a new period, a new budget";
  EXPECT_EQ(budget.left_out(), 998 + 7);
}

}  // namespace
}  // namespace echelon
