#include "echelon/learn/worker_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

namespace echelon::learn {
namespace {

// An honest worker's group: 8 episodes of a task it solves half the time, ~120-token turns,
// log-probs matching the learner's to 1e-6.
GroupSummary HonestGroup(std::mt19937& rng) {
  std::bernoulli_distribution solved(0.5);
  std::normal_distribution<double> length(120, 25);
  int right = 0;
  for (int e = 0; e < 8; ++e) right += solved(rng);
  return {right / 8.0, right == 0 || right == 8, std::max(1.0, length(rng)), 1e-6};
}

// Five honest workers never flagged, over 200 runs of 40 groups each: the floors and the scale
// keep sampling noise under the bar.
TEST(WorkerStatsTest, AnHonestFleetIsNotFlagged) {
  int flagged = 0;
  for (uint32_t seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(seed);
    WorkerStats s;
    for (int g = 0; g < 40; ++g)
      for (int w = 0; w < 5; ++w) s.Add("honest-" + std::to_string(w), HonestGroup(rng));
    for (const auto& [worker, row] : s.Rows()) flagged += !row.outlier.empty();
  }
  EXPECT_EQ(flagged, 0);
}

// A worker whose groups all score (it games the reward) and whose texts run three times as long
// stands out on those two statistics and no other; the honest ones stay unflagged.
TEST(WorkerStatsTest, AWorkerUnlikeTheFleetIsFlaggedOnWhatDiffers) {
  std::mt19937 rng(7);
  WorkerStats s;
  for (int g = 0; g < 40; ++g) {
    for (int w = 0; w < 4; ++w) s.Add("honest-" + std::to_string(w), HonestGroup(rng));
    GroupSummary gamed = HonestGroup(rng);
    gamed.reward_mean = 1.0;
    gamed.zero_spread = false;
    gamed.length_mean *= 3;
    s.Add("mallory", gamed);
  }
  const auto rows = s.Rows();
  EXPECT_EQ(rows.at("mallory").outlier, (std::vector<std::string>{"reward_mean", "length_mean"}));
  for (int w = 0; w < 4; ++w) EXPECT_TRUE(rows.at("honest-" + std::to_string(w)).outlier.empty()) << w;
  const nlohmann::json j = s.ToJson();
  EXPECT_EQ(j["mallory"]["groups"], 40);
  EXPECT_EQ(j["mallory"]["reward_mean"], 1.0);
  EXPECT_EQ(j["mallory"]["outlier"], nlohmann::json({"reward_mean", "length_mean"}));
  EXPECT_FALSE(j["honest-0"].contains("outlier"));
}

// No fleet, no flags: under kOutlierMinWorkers workers with kOutlierMinGroups groups each, a
// worker unlike the others is only reported.
// Router replay: a worker whose sent routes its learner's router rarely shares (other weights,
// or routes it did not draw) is flagged on route_agreement alone; a worker that sends no routes
// has no such statistic and is not compared on it.
TEST(WorkerStatsTest, AWorkerWhoseRoutesTheLearnerDoesNotShareIsFlagged) {
  std::mt19937 rng(11);
  std::binomial_distribution<int64_t> honest(200, 0.9), odd(200, 0.3);
  WorkerStats s;
  for (int g = 0; g < 20; ++g) {
    for (int w = 0; w < 4; ++w) {
      GroupSummary h = HonestGroup(rng);
      h.routes = 200;
      h.routes_same = honest(rng);
      s.Add("honest-" + std::to_string(w), h);
    }
    GroupSummary o = HonestGroup(rng);
    o.routes = 200;
    o.routes_same = odd(rng);
    s.Add("odd", o);
    s.Add("dense", HonestGroup(rng));  // sends no routes
  }
  const auto rows = s.Rows();
  EXPECT_EQ(rows.at("odd").outlier, std::vector<std::string>{"route_agreement"});
  for (int w = 0; w < 4; ++w) EXPECT_TRUE(rows.at("honest-" + std::to_string(w)).outlier.empty());
  EXPECT_TRUE(rows.at("dense").outlier.empty());
  EXPECT_TRUE(std::isnan(rows.at("dense").route_agreement));
  EXPECT_NEAR(rows.at("honest-0").route_agreement, 0.9, 0.03);
  const nlohmann::json j = s.ToJson();
  EXPECT_FALSE(j.at("dense").contains("route_agreement"));
  EXPECT_TRUE(j.at("odd").contains("route_agreement"));
}

TEST(WorkerStatsTest, WithoutAFleetToCompareWithNothingIsFlagged) {
  std::mt19937 rng(3);
  WorkerStats s;
  for (int g = 0; g < 40; ++g) {
    s.Add("honest-0", HonestGroup(rng));
    s.Add("mallory", {1.0, false, 500, 3.0});
  }
  for (int g = 0; g < kOutlierMinGroups - 1; ++g) s.Add("newcomer", HonestGroup(rng));
  for (const auto& [worker, row] : s.Rows()) EXPECT_TRUE(row.outlier.empty()) << worker;
  EXPECT_EQ(s.Rows().at("mallory").gap_mean, 3.0);
}

// Canaries: five honest workers pass a canary sample 60% of the time; one on a smaller model
// passes 25%, one sampling far colder passes 90%. Over 8 samples a group, 12 groups each
// (96 samples): both are flagged, no honest worker is; below kCanaryMinSamples nobody is.
TEST(WorkerStatsTest, AWorkerPassingCanariesAtAnotherRateThanTheFleetIsFlagged) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const auto tally = [&](double p, int groups) {
      std::bernoulli_distribution pass(p);
      CanaryTally t;
      for (int g = 0; g < groups; ++g)
        for (int e = 0; e < 8; ++e) {
          ++t.samples;
          t.successes += pass(rng) ? 1 : 0;
        }
      t.groups = groups;
      return t;
    };
    std::map<std::string, CanaryTally> canaries;
    for (int w = 0; w < 5; ++w) canaries["honest-" + std::to_string(w)] = tally(0.6, 12);
    canaries["small-model"] = tally(0.25, 12);
    canaries["cold"] = tally(0.9, 12);
    canaries["newcomer"] = tally(0.0, 3);  // 24 samples: too few to judge
    WorkerStats s;
    s.SetCanaries(canaries);
    const std::map<std::string, WorkerStats::Row> rows = s.Rows();
    for (const auto& [worker, row] : rows) {
      const bool flagged = std::find(row.outlier.begin(), row.outlier.end(), "canary_pass") != row.outlier.end();
      EXPECT_EQ(flagged, worker == "small-model" || worker == "cold") << worker << " seed " << seed;
    }
    EXPECT_EQ(rows.at("cold").canary_groups, 12);
    EXPECT_NEAR(rows.at("newcomer").canary_pass, 0.0, 1e-12);
    EXPECT_EQ(s.ToJson()["honest-0"]["canary_groups"], 12);
  }
  // Only two workers with enough samples: no fleet to compare with.
  WorkerStats two;
  two.SetCanaries({{"a", {8, 64, 60}}, {"b", {8, 64, 4}}});
  for (const auto& [worker, row] : two.Rows()) EXPECT_TRUE(row.outlier.empty()) << worker;
}

}  // namespace
}  // namespace echelon::learn
