#include "echelon/sched/completion_forecast.h"

#include <gtest/gtest.h>

#include <cmath>

namespace echelon::sched {
namespace {

TEST(CompletionForecast, PredictsTokensOverRateAgainstStalenessTimesUpdateSeconds) {
  CompletionForecast f;
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 2)));  // nothing known: it fits
  f.ObserveGroup("w", 1, 4000, 40);             // 100 tokens/s; prompt 1 is 4,000 tokens
  EXPECT_EQ(*f.GroupSeconds("w", 1), 40);
  EXPECT_EQ(*f.GroupSeconds("w", 2), 40);  // an unseen prompt: the mean of every group so far
  EXPECT_FALSE(f.GroupSeconds("v", 1));    // an unseen worker
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 2)));  // no update seen yet
  f.ObserveVersion(1, 100);
  f.ObserveVersion(2, 115);
  EXPECT_EQ(*f.UpdateSeconds(), 15);
  EXPECT_EQ(f.Slack("w", 1, 2), 2 * 15 - 40);  // late by 10 s
  EXPECT_FALSE(f.Fits("w", 1, 2));
  EXPECT_TRUE(f.Fits("w", 1, 3));
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 0)));  // synchronous: the learner waits for every group
}

TEST(CompletionForecast, RunningMeansMoveByTheirWeightAndIgnoreNonsense) {
  CompletionForecast f;
  f.ObserveGroup("w", 1, 1000, 10);
  f.ObserveGroup("w", 1, 2000, 10);
  EXPECT_DOUBLE_EQ(f.PromptTokens(1), 1000 + kForecastWeight * 1000);
  EXPECT_DOUBLE_EQ(*f.WorkerRate("w"), 100 + kForecastWeight * 100);
  f.ObserveGroup("w", 1, -5, 10);
  f.ObserveGroup("w", 1, NAN, 10);
  f.ObserveGroup("w", 1, 1000, 0);  // a length, but no rate
  EXPECT_DOUBLE_EQ(*f.WorkerRate("w"), 100 + kForecastWeight * 100);
  f.ObserveVersion(3, 10);
  f.ObserveVersion(2, 50);  // not newer: ignored
  f.ObserveVersion(5, 30);  // two updates in 20 s
  EXPECT_EQ(*f.UpdateSeconds(), 10);
}

}  // namespace
}  // namespace echelon::sched
