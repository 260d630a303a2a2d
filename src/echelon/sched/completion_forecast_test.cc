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
  EXPECT_EQ(*f.GroupSeconds("w", 2), 40);  // an unseen prompt: the mean of every group so far
  EXPECT_FALSE(f.GroupSeconds("v", 1));    // an unseen worker
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 2, 0)));  // no update seen yet
  f.ObserveVersion(1, 100);
  f.ObserveVersion(2, 115);
  EXPECT_EQ(*f.UpdateSeconds(), 15);
  EXPECT_EQ(f.Slack("w", 1, 2, 115), 2 * 15 - 40);  // late by 10 s
  EXPECT_FALSE(f.Fits("w", 1, 2, 115));
  EXPECT_TRUE(f.Fits("w", 1, 3, 115));
  EXPECT_FALSE(f.Fits("w", 1, 3, 121));  // 6 s into the update: 39 s left
  EXPECT_TRUE(std::isinf(f.Slack("w", 1, 0, 115)));  // synchronous: the learner waits for every group
  // A worker whose groups come from older snapshots has fewer updates to spare: one group
  // sampled one version behind moves its lag from 0 by the weight.
  f.ObserveGroup("w", 1, 4000, 40, 1);
  EXPECT_DOUBLE_EQ(f.WorkerLag("w"), kForecastWeight);
  EXPECT_DOUBLE_EQ(f.Slack("w", 1, 3, 115), (3 - kForecastWeight) * 15 - 40);
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
