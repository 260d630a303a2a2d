#include "echelon/sched/completion_forecast.h"

#include <gtest/gtest.h>

#include <cmath>

namespace echelon::sched {
namespace {

TEST(CompletionForecast, PredictsTokensOverRateAgainstStalenessTimesUpdateSeconds) {
  CompletionForecast f;
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 2, 0)));  // nothing known: it fits
  f.ObserveGroup("w", 1, 4000, 40, 0);             // 100 tokens/s; prompt 1 is 4,000 tokens
  EXPECT_EQ(*f.GroupSeconds("w", 1), 40);
  // An unseen prompt: the upper edge of the histogram bin holding the quantile, 4,000 here.
  EXPECT_EQ(f.PromptTokens(2), f.TokensQuantile(kUnseenPromptQuantile));
  EXPECT_GE(f.PromptTokens(2), 4000);
  EXPECT_LT(f.PromptTokens(2), 4000 * std::exp2(0.25));
  EXPECT_FALSE(f.GroupSeconds("v", 1));  // an unseen worker
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 2, 0)));  // no update seen yet
  f.ObserveVersion(1, 100);
  f.ObserveVersion(2, 115);
  EXPECT_EQ(*f.UpdateSeconds(), 15);
  EXPECT_DOUBLE_EQ(f.Slack("w", 1, 2, 115), kForecastSafety * 2 * 15 - 40);  // late
  EXPECT_FALSE(f.Fits("w", 1, 2, 115));
  EXPECT_TRUE(f.Fits("w", 1, 4, 115));    // 0.8 x 60 = 48 s for 40
  EXPECT_FALSE(f.Fits("w", 1, 4, 126));   // 11 s into the update: 0.8 x 49 = 39.2 s
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 0, 115)));  // synchronous: the learner waits for every group
  // A worker whose groups come from older snapshots has fewer updates to spare: one group
  // sampled one version behind moves its lag from 0 by the weight.
  f.ObserveGroup("w", 1, 4000, 40, 1);
  EXPECT_DOUBLE_EQ(f.WorkerLag("w"), kForecastWeight);
  EXPECT_DOUBLE_EQ(f.Slack("w", 1, 4, 115), kForecastSafety * (4 - kForecastWeight) * 15 - 40);
}

// A group passed over often enough goes only to a worker at least half as fast as the fastest.
TEST(CompletionForecast, AmongTheFastestIsWithinAFactorOfTheFastestRate) {
  CompletionForecast f;
  EXPECT_TRUE(f.AmongTheFastest("new"));
  f.ObserveGroup("fast", 1, 1000, 10, 0);  // 100 tokens/s
  f.ObserveGroup("half", 1, 1000, 20, 0);  // 50
  f.ObserveGroup("slow", 1, 1000, 40, 0);  // 25
  EXPECT_TRUE(f.AmongTheFastest("fast"));
  EXPECT_TRUE(f.AmongTheFastest("half"));
  EXPECT_FALSE(f.AmongTheFastest("slow"));
  EXPECT_TRUE(f.AmongTheFastest("unknown"));
}

TEST(CompletionForecast, RunningMeansMoveByTheirWeightAndIgnoreNonsense) {
  CompletionForecast f;
  f.ObserveGroup("w", 1, 1000, 10, 0);
  f.ObserveGroup("w", 1, 2000, 10, 0);
  EXPECT_DOUBLE_EQ(f.PromptTokens(1), 1000 + kForecastWeight * 1000);
  EXPECT_DOUBLE_EQ(*f.WorkerRate("w"), 100 + kForecastWeight * 100);
  f.ObserveGroup("w", 1, -5, 10, 0);
  f.ObserveGroup("w", 1, NAN, 10, 0);
  f.ObserveGroup("w", 1, 1000, 0, 0);  // a length, but no rate
  EXPECT_DOUBLE_EQ(*f.WorkerRate("w"), 100 + kForecastWeight * 100);
  f.ObserveVersion(3, 10);
  f.ObserveVersion(2, 50);  // not newer: ignored
  f.ObserveVersion(5, 30);  // two updates in 20 s
  EXPECT_EQ(*f.UpdateSeconds(), 10);
}

}  // namespace
}  // namespace echelon::sched
