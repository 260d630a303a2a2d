#include "echelon/plan/throughput_model.h"

#include <gtest/gtest.h>

#include <cmath>

namespace echelon::plan {
namespace {

const GpuSpec kGpu = {"g", 32, 1000, 100, 1.0, "", ""};

// Qwen3-30B-A3B's published shape: 30.5e9 parameters, 3.3e9 active, 128 experts, top-8.
ModelProfile Moe() {
  ModelProfile m;
  m.params = 30.5e9;
  m.active_params = 3.3e9;
  m.experts = 128;
  m.experts_per_token = 8;
  m.kv_bytes_per_token = 98304;
  return m;
}

TEST(ThroughputModel, MoeReadsTheRoutedExpertsAndComputesWithTheActiveParameters) {
  const ModelProfile m = Moe();
  const double expert = (30.5e9 - 3.3e9) / (1 - 8.0 / 128);  // P_e
  const double shared = 30.5e9 - expert;
  EXPECT_NEAR(m.weight_bytes_read(1), 2 * (shared + expert * 8 / 128), 1);  // one token: its 8 experts
  EXPECT_NEAR(m.weight_bytes_read(1), 2 * 3.3e9, 1);                        // = the active weights
  EXPECT_NEAR(m.weight_bytes_read(4), 2 * (shared + expert * (1 - std::pow(120.0 / 128, 4))), 1);
  EXPECT_NEAR(m.weight_bytes_read(256), m.weight_bytes(), 1e-6 * m.weight_bytes());  // every expert
  ModelProfile dense = m;
  dense.active_params = 0;
  dense.experts = dense.experts_per_token = 0;
  EXPECT_EQ(dense.weight_bytes_read(1), dense.weight_bytes());
  // Training FLOPs and compute-bound decode follow the active parameters.
  EXPECT_NEAR(EstimateTrainSeconds(kGpu, 1, 0.5, m, 1e6) / EstimateTrainSeconds(kGpu, 1, 0.5, dense, 1e6),
              3.3 / 30.5, 1e-12);
}

TEST(ThroughputModel, APipelineHasTheMemoryOfItsStagesAndOneGpusSpeedLessItsLinks) {
  ModelProfile m = Moe();
  RolloutShape shape{8, 256, 1024};
  // 61 GB of bf16 weights fit in no 32 GB GPU, nor in two at 90% usable; three hold them.
  EXPECT_FALSE(EstimateDecode(kGpu, m, shape).feasible);
  EXPECT_FALSE(EstimateDecode(kGpu, m, shape, 2).feasible);
  const DecodeEstimate three = EstimateDecode(kGpu, m, shape, 3, 0.005);
  ASSERT_TRUE(three.feasible);
  const double free_bytes = 3 * 0.9 * 32e9 - m.weight_bytes();
  const int64_t b = std::min<int64_t>(256, static_cast<int64_t>(free_bytes / (98304 * (256 + 512)))) / 8 * 8;
  EXPECT_EQ(three.batch, b);
  EXPECT_NEAR(three.iter_seconds, DecodeIterSeconds(kGpu, m, shape, b / 3) + 3 * 0.005, 1e-12);
  EXPECT_NEAR(three.tokens_per_s, b / three.iter_seconds, 1e-9);
  // Without link latency a pipeline decodes about as fast as one GPU holding everything would
  // at the same batch (the weights are read once per round either way).
  const DecodeEstimate free_links = EstimateDecode(kGpu, m, shape, 3, 0);
  EXPECT_GT(free_links.tokens_per_s, three.tokens_per_s);
  EXPECT_NEAR(free_links.iter_seconds, DecodeIterSeconds(kGpu, m, shape, b / 3), 1e-12);
}

}  // namespace
}  // namespace echelon::plan
