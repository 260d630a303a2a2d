// The learner memory model against the learner: for dense and mixture-of-experts models, fp32
// and bf16, one rank and sharded parameters over two and four ranks, the estimate of weights,
// gradients, AdamW state and what is gathered at once is within 15% of the peak Learner measured
// from its own tensors over two updates. And the headline model's figures, by hand.
#include "echelon/learn/learner_memory.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/testing.h"

namespace echelon::learn {
namespace {

double Measure(const model::ModelConfig& c, const LearnerOptions& o, int world) {
  model::Qwen3Model init(c);
  init->InitWeights(2);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 4);
  if (world == 1) {
    Learner one(Copy(init), o);
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(one.Step(groups).ok());
    return static_cast<double>(one.PeakTrainingStateBytes());
  }
  LocalRanks ranks(world);
  Learner rank0(Copy(init), o, ranks.ranks->group());
  EXPECT_TRUE(ranks.ranks->Setup(rank0, {}).ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(ranks.ranks->SendStep(groups, o.lr).ok());
    EXPECT_TRUE(rank0.Step(groups).ok());
  }
  const double bytes = static_cast<double>(rank0.PeakTrainingStateBytes());
  EXPECT_TRUE(ranks.Finish().ok());
  return bytes;
}

TEST(LearnerMemory, StateWithinFifteenPercentOfMeasuredPeaks) {
  model::ModelConfig dense = TinyConfig();
  dense.num_hidden_layers = 6;
  model::ModelConfig moe = TinyMoeConfig();
  for (const model::ModelConfig& c : {dense, moe}) {
    for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
      for (auto [world, shard] : {std::pair{1, Shard::kNone}, {2, Shard::kParams}, {4, Shard::kParams}}) {
        LearnerOptions o;
        o.micro_batch_tokens = 20;
        o.precision = precision;
        o.shard = shard;
        const double measured = Measure(c, o, world);
        LearnerSetup s;
        s.ranks = world;
        s.precision = precision;
        s.shard = shard;
        const double estimated = EstimateLearnerMemory(c, s).state();
        std::printf("%s %s ranks %d shard %d: measured %.0f, estimated %.0f bytes (%.4f)\n", c.moe() ? "moe" : "dense",
                    precision == Precision::kBf16 ? "bf16" : "fp32", world, static_cast<int>(shard), measured,
                    estimated, estimated / measured);
        EXPECT_NEAR(estimated / measured, 1.0, 0.15) << c.moe() << " " << world;
      }
    }
  }
}

// LoRA: the frozen base in the compute dtype, the adapters with fp32 gradients and AdamW state.
TEST(LearnerMemory, LoraStateWithinFifteenPercentOfMeasuredPeaks) {
  for (model::ModelConfig c : {TinyConfig(), TinyMoeConfig()}) {
    c.lora = {4, 16, model::kLoraTargets};
    for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
      LearnerOptions o;
      o.precision = precision;
      const double measured = Measure(c, o, 1);
      LearnerSetup s;
      s.precision = precision;
      s.lora = c.lora;
      const double estimated = EstimateLearnerMemory(c, s).state();
      std::printf("lora %s %s: measured %.0f, estimated %.0f bytes (%.4f)\n", c.moe() ? "moe" : "dense",
                  precision == Precision::kBf16 ? "bf16" : "fp32", measured, estimated, estimated / measured);
      EXPECT_NEAR(estimated / measured, 1.0, 0.15) << c.moe() << " " << static_cast<int>(precision);
      int64_t adapters = 0;
      model::Qwen3Model m(c);
      for (const auto& [name, t] : m->AdapterStateDict()) adapters += t.numel();
      EXPECT_EQ(LoraParameters(c, c.lora), adapters);
    }
  }
}

// Qwen3-30B-A3B (data/models/qwen3-30b-a3b.json) on 4 ranks with sharded parameters: 16 bytes per
// parameter over 4 ranks, 30.53e9 parameters.
TEST(LearnerMemory, HeadlineModelShardedOverFourRanks) {
  model::ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_hidden_layers = 48;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.moe_intermediate_size = 768;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.tie_word_embeddings = false;
  ASSERT_NEAR(c.NumParameters() / 1e9, 30.53, 0.01);
  LearnerSetup s;
  s.ranks = 4;
  s.shard = Shard::kParams;
  const LearnerMemory m = EstimateLearnerMemory(c, s);
  EXPECT_NEAR(m.weights + m.gradients + m.optimizer, 16.0 * c.NumParameters() / 4, 1e6);
  // One layer: 128 experts x 3 x 2048 x 768 + attention and router, 0.623e9 parameters, gathered
  // in bf16 with its gradients (bf16 and fp32) beside the outer unit's 0.622e9 in bf16 and the
  // head's 0.311e9 gradients in bf16: 6.8 GB.
  EXPECT_NEAR(m.gathered / 1e9, 2 * 0.6223 + 2 * 0.6231 + 2 * 0.6231 + 4 * 0.6231 + 2 * 0.3112, 0.01);
  // The KL reference: this rank's fp32 shards of it (a quarter of the model), not a whole copy.
  s.kl_reference = true;
  EXPECT_NEAR(EstimateLearnerMemory(c, s).reference, 4.0 * c.NumParameters() / 4, 1e6);
  s.kl_reference = false;
  s.shard = Shard::kOptimizer;
  EXPECT_GT(EstimateLearnerMemory(c, s).state(), 2.5 * m.state()) << "every rank holds the whole weights";

  // Activations linear in the tokens (tiled attention, chunked log-probs): each doubling from 8k
  // adds twice what the one before added; the fixed transient (a tile, a chunk) cancels out.
  // At 32k tokens with LoRA and checkpointing the learner fits one H200 (141 GB, 90% usable).
  s = LearnerSetup{};
  s.activation_checkpointing = true;
  const auto activations = [&](int64_t tokens) {
    s.micro_batch_tokens = tokens;
    return EstimateLearnerMemory(c, s).activations;
  };
  const double a8 = activations(8192), a16 = activations(16384), a32 = activations(32768);
  EXPECT_NEAR(a32 - a16, 2 * (a16 - a8), 1e-6 * a32);
  s.lora = {16, 32, {"q_proj", "k_proj", "v_proj", "o_proj"}};
  EXPECT_LT(EstimateLearnerMemory(c, s).total(), 0.9 * 141e9);
  s.kl_reference = true;
  EXPECT_EQ(EstimateLearnerMemory(c, s).reference, 0) << "LoRA's reference is its own base";
}

// Tensor bytes of a safetensors file (its size less the length and the JSON header).
double Payload(const std::string& file) {
  uint64_t header = 0;
  std::memcpy(&header, file.data(), 8);  // little-endian, as on every host this runs on
  return static_cast<double>(file.size() - 8 - header);
}

// The verifier's terms are the tensor bytes of a published snapshot and (LoRA) of its model
// copy; older snapshots fill rollout.verify_memory_mb whole, the rest go to
// disk. (tests/verifier_memory_test.sh checks the older snapshots' term against peak RSS.)
TEST(VerifierMemory, SnapshotsAsPublishedAndTheBudgetFilledWhole) {
  for (bool lora : {false, true}) {
    model::ModelConfig c = TinyConfig();
    if (lora) c.lora = {4, 8, {"q_proj", "v_proj"}};
    model::Qwen3Model m(c);
    Result<std::shared_ptr<const std::string>> base = MakeBase(m);
    ASSERT_TRUE(base.ok());
    Result<contract::Snapshot> snap = MakeSnapshot(m, 1, lora ? base.value() : nullptr);
    ASSERT_TRUE(snap.ok()) << snap.status().message();
    const VerifierMemory v = EstimateVerifierMemory(c, 8, 0);
    EXPECT_EQ(v.newest, Payload(*snap->weights)) << "lora " << lora;
    EXPECT_EQ(v.older, 0);
    EXPECT_EQ(v.on_disk, 8 * v.newest);
    EXPECT_EQ(v.mapped, v.newest);  // one from disk while its check runs
    // No weights of its own but under LoRA: every parameter, adapters included.
    EXPECT_EQ(v.model, lora ? Payload(*base.value()) : 0);
    EXPECT_EQ(v.base, v.model);
    const VerifierMemory budget = EstimateVerifierMemory(c, 8, 3.5 * v.newest);
    EXPECT_EQ(budget.older, 3 * v.newest);
    EXPECT_EQ(budget.on_disk, 5 * v.newest);
    EXPECT_EQ(EstimateVerifierMemory(c, 8, -1).older, 8 * v.newest);
    EXPECT_EQ(EstimateVerifierMemory(c, 8, -1).mapped, 0);
  }
}

}  // namespace
}  // namespace echelon::learn
