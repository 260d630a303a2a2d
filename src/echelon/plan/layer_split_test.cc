#include "echelon/plan/layer_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

namespace echelon::plan {
namespace {

// Independent reference: every composition of the layers into the stages, each >= 1.
struct Best {
  bool found = false;
  double bottleneck = INFINITY, latency = INFINITY;
};
Best BruteForce(const LayerSplitInput& in, SplitObjective objective) {
  Best best;
  std::vector<int64_t> n(in.stages.size(), 1);
  std::function<void(size_t, int64_t)> walk = [&](size_t i, int64_t left) {
    if (i + 1 == in.stages.size()) {
      n[i] = left;
      double b = 0, l = 0;
      for (size_t j = 0; j < n.size(); ++j) {
        if (StageBytes(in, j, n[j]) > in.stages[j].memory_bytes) return;
        const double t = static_cast<double>(n[j]) * in.stages[j].seconds_per_layer + (j == 0 ? in.first_seconds : 0) +
                         (j + 1 == n.size() ? in.last_seconds : in.link_seconds);
        b = std::max(b, t);
        l += t;
      }
      const double tol = 1e-9;
      const bool better = objective == SplitObjective::kThroughput
                              ? (b < best.bottleneck - tol || (b <= best.bottleneck + tol && l < best.latency - tol))
                              : (l < best.latency - tol || (l <= best.latency + tol && b < best.bottleneck - tol));
      if (better) best = {true, b, l};
      return;
    }
    for (int64_t k = 1; k <= left - static_cast<int64_t>(in.stages.size() - 1 - i); ++k) {
      n[i] = k;
      walk(i + 1, left - k);
    }
  };
  walk(0, in.layers);
  return best;
}

TEST(LayerSplit, EqualsBruteForceOnRandomSmallPipelines) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int> stages(1, 4), layers(1, 12), speed(1, 9), memory(1, 8);
  std::uniform_real_distribution<double> extra(0, 3);
  int feasible = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    LayerSplitInput in;
    in.stages.resize(static_cast<size_t>(stages(rng)));
    in.layers = std::max<int64_t>(layers(rng), static_cast<int64_t>(in.stages.size()));
    in.layer_bytes = 1;
    in.first_bytes = std::floor(extra(rng));
    in.last_bytes = std::floor(extra(rng));
    in.first_seconds = extra(rng);
    in.last_seconds = extra(rng);
    in.link_seconds = trial % 2 ? extra(rng) : 0;
    for (PipelineStage& s : in.stages) s = {"s", static_cast<double>(memory(rng)), speed(rng) / 4.0};
    for (SplitObjective objective : {SplitObjective::kThroughput, SplitObjective::kLatency}) {
      const Best brute = BruteForce(in, objective);
      Result<LayerSplit> split = SplitLayers(in, objective);
      ASSERT_EQ(split.ok(), brute.found) << "trial " << trial << ": " << split.status().message();
      if (!brute.found) continue;
      ++feasible;
      int64_t sum = 0;
      for (size_t i = 0; i < split->layers.size(); ++i) {
        EXPECT_GE(split->layers[i], 1);
        EXPECT_LE(StageBytes(in, i, split->layers[i]), in.stages[i].memory_bytes);
        sum += split->layers[i];
      }
      EXPECT_EQ(sum, in.layers);
      EXPECT_NEAR(split->bottleneck_seconds, brute.bottleneck, 1e-9) << "trial " << trial;
      EXPECT_NEAR(split->latency_seconds, brute.latency, 1e-9) << "trial " << trial;
    }
  }
  EXPECT_GT(feasible, 2000) << "most cases must fit";
}

// A prefix with the larger bottleneck can have the smaller sum that wins after the next
// stage: a single pass over (max, sum) pairs would miss the fastest split's best latency.
TEST(LayerSplit, ThroughputTiesGoToTheSmallestLatency) {
  LayerSplitInput in;
  in.layers = 5;
  in.layer_bytes = 1;
  in.first_seconds = 3;
  in.stages = {{"a", 10, 1.0}, {"b", 10, 2.0}, {"last", 1, 7.0}};
  // The last stage fits one layer: 7 s, the bottleneck of every split. Over the first two
  // stages, (2, 2) takes 5 + 4 s (max 5, sum 9) and (3, 1) 6 + 2 s (max 6, sum 8): a single
  // pass keeping the smaller max per prefix ends at latency 16, the best is 15.
  Result<LayerSplit> s = SplitLayers(in, SplitObjective::kThroughput);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->layers, (std::vector<int64_t>{3, 1, 1}));
  EXPECT_DOUBLE_EQ(s->bottleneck_seconds, 7.0);
  EXPECT_DOUBLE_EQ(s->latency_seconds, 15.0);
  const Result<LayerSplit> fast = SplitLayers(in, SplitObjective::kLatency);
  ASSERT_TRUE(fast.ok());
  EXPECT_EQ(fast->layers, (std::vector<int64_t>{3, 1, 1}));
}

TEST(LayerSplit, MemoryDecidesWhereLayersGoAndTooLittleIsOneClearError) {
  // Two 32 GB GPUs of equal speed, a 48-layer model at 1.2 GB per layer plus a 1.2 GB
  // embedding and lm_head: the throughput split balances time, memory permitting.
  LayerSplitInput in;
  in.layers = 48;
  in.layer_bytes = 1.2e9;
  in.first_bytes = 1.2e9;
  in.last_bytes = 1.2e9;
  in.first_seconds = 0.002;
  in.stages = {{"a", 32e9, 0.004}, {"b", 32e9, 0.004}};
  Result<LayerSplit> s = SplitLayers(in, SplitObjective::kThroughput);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->layers, (std::vector<int64_t>{24, 24}));
  in.stages[0].memory_bytes = 40e9;  // a holds up to 32 layers besides the embedding
  in.stages[1].memory_bytes = 24e9;  // b at most 19 besides lm_head
  s = SplitLayers(in, SplitObjective::kThroughput);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->layers, (std::vector<int64_t>{29, 19}));
  in.stages[0].memory_bytes = 24e9;
  s = SplitLayers(in, SplitObjective::kThroughput);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("60.0"), std::string::npos) << s.status().message();  // GB needed
  EXPECT_NE(s.status().message().find("48.0"), std::string::npos) << s.status().message();  // GB in all
  in.layers = 1;
  EXPECT_FALSE(SplitLayers(in, SplitObjective::kThroughput).ok());  // two stages, one layer
  in.layers = 48;
  in.stages[0].seconds_per_layer = NAN;
  EXPECT_FALSE(SplitLayers(in, SplitObjective::kThroughput).ok());
}

}  // namespace
}  // namespace echelon::plan
