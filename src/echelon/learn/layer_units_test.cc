// Activation checkpointing and sharded parameters (learn/layer_units.h) against the plain
// learner: the same updates give the same losses and weights; sharded ranks hold about 1/N of
// one rank's weights, gradients and AdamW state. Ranks are threads of this test, on loopback.
#include "echelon/learn/layer_units.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "echelon/learn/testing.h"

namespace echelon::learn {
namespace {

LearnerOptions Options(const model::ModelConfig& c) {
  LearnerOptions o;
  o.lr = 1e-3;
  o.micro_batch_tokens = 20;  // several micro-batches: more than some ranks get
  if (c.moe()) o.router_aux_coef = 0.01;  // the router's aux loss through recomputed layers
  return o;
}

// Activation checkpointing changes where the backward's activations come from, not the update:
// ten updates give the plain learner's losses and weights, dense and mixture-of-experts, with
// one and with two minibatches (pi_prox through the hook without gradients).
TEST(LayerUnits, CheckpointingGivesThePlainUpdates) {
  for (const model::ModelConfig& c : {TinyConfig(), TinyMoeConfig()}) {
    for (int64_t minibatches : {1, 2}) {
      model::Qwen3Model init(c);
      init->InitWeights(5);
      const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
      LearnerOptions o = Options(c);
      o.minibatches = minibatches;
      Learner plain(Copy(init), o);
      o.activation_checkpointing = true;
      Learner checkpointed(Copy(init), o);
      for (int step = 0; step < 10; ++step) {
        Result<StepStats> a = plain.Step(groups), b = checkpointed.Step(groups);
        ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
        EXPECT_NEAR(a->loss, b->loss, 1e-6) << "step " << step;
        EXPECT_NEAR(a->grad_norm, b->grad_norm, 1e-5) << "step " << step;
        EXPECT_NEAR(a->router_aux_loss, b->router_aux_loss, 1e-6) << "step " << step;
        EXPECT_EQ(a->router_load, b->router_load) << "recomputing counts no token twice";
      }
      EXPECT_LT(MaxWeightDiff(plain.model(), checkpointed.model()), 1e-5) << c.moe() << " " << minibatches;
      EXPECT_GT(MaxWeightDiff(plain.model(), init), 1e-3);
    }
  }
}

// ZeRO stage 3 on two and four ranks: ten updates give one rank's losses and weights within
// 1e-5 (the gradient summed in another order), dense and mixture-of-experts; the AdamW state
// gathered for a checkpoint is one rank's whole state.
TEST(LayerUnits, ShardedParametersGiveTheWeightsOfOneRank) {
  for (const model::ModelConfig& c : {TinyConfig(), TinyMoeConfig()}) {
    model::Qwen3Model init(c);
    init->InitWeights(7);
    const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
    LearnerOptions o = Options(c);
    Learner one(Copy(init), o);
    std::vector<StepStats> expected;
    for (int step = 0; step < 10; ++step) {
      Result<StepStats> a = one.Step(groups);
      ASSERT_TRUE(a.ok()) << a.status().message();
      expected.push_back(a.value());
    }
    o.shard = Shard::kParams;
    for (int world : {2, 4}) {
      LocalRanks ranks(world);
      Learner rank0(Copy(init), o, ranks.ranks->group());
      ASSERT_TRUE(ranks.ranks->Setup(rank0, {}).ok());
      for (int step = 0; step < 10; ++step) {
        ASSERT_TRUE(ranks.ranks->SendStep(groups, o.lr).ok());
        Result<StepStats> b = rank0.Step(groups);
        ASSERT_TRUE(b.ok()) << b.status().message();
        EXPECT_NEAR(expected[step].loss, b->loss, 1e-5) << "step " << step << " of " << world << " ranks";
        EXPECT_NEAR(expected[step].grad_norm, b->grad_norm, 1e-4) << "step " << step;
      }
      EXPECT_LT(MaxWeightDiff(one.model(), WholeWeights(*ranks.ranks, rank0)), 1e-5) << world << " ranks, moe " << c.moe();
      Result<std::map<std::string, at::Tensor>> gathered = ranks.ranks->GatherOptimizerState(rank0);
      ASSERT_TRUE(gathered.ok()) << gathered.status().message();
      const std::map<std::string, at::Tensor> whole = one.OptimizerState();
      ASSERT_EQ(gathered->size(), whole.size());
      for (const auto& [name, t] : whole)
        EXPECT_LT((t.to(at::kFloat) - gathered->at(name).to(at::kFloat)).abs().max().item<double>(), 1e-4) << name;
      ASSERT_TRUE(ranks.Finish().ok());
    }
  }
}

// The default job's loop in small: twenty updates, each on groups sampled from the one-rank
// learner's weights of that moment (S = 0), by two and four ranks in every layout: one rank's
// loss and gradient norm at every update within 1e-5. Every rank's token sums are added before
// the division, so the loss is the batch's token mean, not a mean of the ranks' means.
TEST(LayerUnits, EveryRankCountAndLayoutGivesOneRanksLossesForTwentyUpdates) {
  const model::ModelConfig c = TinyConfig();
  model::Qwen3Model init(c);
  init->InitWeights(11);
  LearnerOptions o = Options(c);
  Learner one(Copy(init), o);
  std::vector<std::vector<LearnerGroup>> batches;
  std::vector<StepStats> expected;
  for (int step = 0; step < 20; ++step) {
    batches.push_back(SampleGroups(one.model(), 1.0, 6));
    Result<StepStats> a = one.Step(batches.back());
    ASSERT_TRUE(a.ok()) << a.status().message();
    expected.push_back(a.value());
  }
  EXPECT_GT(MaxWeightDiff(one.model(), init), 1e-2);
  for (Shard shard : {Shard::kNone, Shard::kOptimizer, Shard::kParams})
    for (int world : {2, 4}) {
      o.shard = shard;
      LocalRanks ranks(world);
      Learner rank0(Copy(init), o, ranks.ranks->group());
      ASSERT_TRUE(ranks.ranks->Setup(rank0, {}).ok());
      for (int step = 0; step < 20; ++step) {
        ASSERT_TRUE(ranks.ranks->SendStep(batches[step], o.lr).ok());
        Result<StepStats> b = rank0.Step(batches[step]);
        ASSERT_TRUE(b.ok()) << b.status().message();
        const std::string where = "update " + std::to_string(step) + " on " + std::to_string(world) +
                                  " ranks, shard " + std::to_string(static_cast<int>(shard));
        EXPECT_NEAR(expected[step].loss, b->loss, 1e-5) << where;
        EXPECT_NEAR(expected[step].grad_norm, b->grad_norm, 1e-5) << where;
      }
      ASSERT_TRUE(ranks.Finish().ok());
    }
}

// The KL term under sharded parameters: the reference is sharded as the weights are (no rank
// keeps a whole copy of it) and its log-probs come from its own gathered units; two and four
// ranks give one rank's loss, KL and gradient norm for five updates.
TEST(LayerUnits, AShardedKlReferenceGivesOneRanksUpdates) {
  for (const model::ModelConfig& c : {TinyConfig(), TinyMoeConfig()}) {
    model::Qwen3Model init(c);
    init->InitWeights(13);
    const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
    LearnerOptions o = Options(c);
    o.lr = 1e-2;
    o.loss.kl_coef = 0.1;
    Learner one(Copy(init), o);
    std::vector<StepStats> expected;
    for (int step = 0; step < 5; ++step) {
      Result<StepStats> a = one.Step(groups);
      ASSERT_TRUE(a.ok()) << a.status().message();
      expected.push_back(a.value());
    }
    EXPECT_GT(expected.back().kl, 1e-6) << "the policy moved away from its reference";
    o.shard = Shard::kParams;
    for (int world : {2, 4}) {
      LocalRanks ranks(world);
      Learner rank0(Copy(init), o, ranks.ranks->group());
      EXPECT_TRUE(rank0.ReferenceState().empty()) << "no whole reference on rank 0";
      ASSERT_TRUE(ranks.ranks->Setup(rank0, {}).ok());
      for (int step = 0; step < 5; ++step) {
        ASSERT_TRUE(ranks.ranks->SendStep(groups, o.lr).ok());
        Result<StepStats> b = rank0.Step(groups);
        ASSERT_TRUE(b.ok()) << b.status().message();
        EXPECT_NEAR(expected[step].loss, b->loss, 1e-5) << "step " << step << " of " << world << " ranks";
        EXPECT_NEAR(expected[step].kl, b->kl, 1e-7 + 1e-4 * expected[step].kl) << "step " << step;
        EXPECT_NEAR(expected[step].grad_norm, b->grad_norm, 1e-5) << "step " << step;
      }
      EXPECT_LT(MaxWeightDiff(one.model(), WholeWeights(*ranks.ranks, rank0)), 1e-5) << world << " ranks, moe " << c.moe();
      ASSERT_TRUE(ranks.Finish().ok());
    }
  }
}

// A run checkpointed under two sharded ranks resumes under four (and one): the whole state
// gathered, restored into each rank's shards; the next update is the uninterrupted run's.
TEST(LayerUnits, ShardedStateResumesWithAnotherRankCount) {
  const model::ModelConfig c = TinyMoeConfig();
  model::Qwen3Model init(c);
  init->InitWeights(9);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  LearnerOptions o = Options(c);
  Learner one(Copy(init), o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(one.Step(groups).ok());
  o.shard = Shard::kParams;
  std::map<std::string, at::Tensor> state;
  model::Qwen3Model saved(nullptr);
  {
    LocalRanks two(2);
    Learner rank0(Copy(init), o, two.ranks->group());
    ASSERT_TRUE(two.ranks->Setup(rank0, {}).ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(two.ranks->SendStep(groups, o.lr).ok());
      ASSERT_TRUE(rank0.Step(groups).ok());
    }
    Result<std::map<std::string, at::Tensor>> gathered = two.ranks->GatherOptimizerState(rank0);
    ASSERT_TRUE(gathered.ok());
    state = gathered.value();
    saved = WholeWeights(*two.ranks, rank0);
    ASSERT_TRUE(two.Finish().ok());
  }
  LocalRanks four(4);
  Learner rank0(Copy(saved), o, four.ranks->group());
  ASSERT_TRUE(rank0.Restore(3, state, {}).ok());
  ASSERT_TRUE(four.ranks->Setup(rank0, state).ok());
  ASSERT_TRUE(four.ranks->SendStep(groups, o.lr).ok());
  ASSERT_TRUE(rank0.Step(groups).ok());
  EXPECT_EQ(rank0.version(), 4);
  EXPECT_LT(MaxWeightDiff(one.model(), WholeWeights(*four.ranks, rank0)), 1e-5);
  ASSERT_TRUE(four.Finish().ok());
}

// Per-rank bytes of weights, gradients and AdamW state: the peak of a sharded rank (its shards
// plus the most gathered weights and unreduced gradients alive at once) within 1.2 x 1/N of one
// rank's. A model of 24 layers, so that one gathered layer is a small part of it.
TEST(LayerUnits, ShardedRankHoldsAboutOneNthOfTheState) {
  model::ModelConfig c = TinyConfig();
  c.num_hidden_layers = 24;
  model::Qwen3Model init(c);
  init->InitWeights(3);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 4);
  LearnerOptions o;
  o.micro_batch_tokens = 20;
  Learner one(Copy(init), o);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(one.Step(groups).ok());
  const double whole = static_cast<double>(one.PeakTrainingStateBytes());
  o.shard = Shard::kParams;
  for (int world : {2, 4}) {
    LocalRanks ranks(world);
    Learner rank0(Copy(init), o, ranks.ranks->group());
    ASSERT_TRUE(ranks.ranks->Setup(rank0, {}).ok());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(ranks.ranks->SendStep(groups, o.lr).ok());
      ASSERT_TRUE(rank0.Step(groups).ok());
    }
    const double share = rank0.PeakTrainingStateBytes() / whole;
    std::printf("%d ranks: peak %.0f of one rank's %.0f bytes = %.3f x 1/N\n", world,
                static_cast<double>(rank0.PeakTrainingStateBytes()), whole, share * world);
    EXPECT_LT(share, 1.2 / world) << world << " ranks";
    EXPECT_GT(share, 1.0 / world) << "the shards alone are 1/N";
    ASSERT_TRUE(ranks.Finish().ok());
  }
}

// Gloo has no bf16: a bf16 learner's gathers failed on every rank ("Invalid scalar type") until
// their bits travelled as fp16. Two sharded bf16 ranks now follow one bf16 rank; not to 1e-5,
// as one rank accumulates its micro-batches' gradients in bf16 and the shards in fp32.
TEST(LayerUnits, ShardedBf16GathersOverGloo) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(4);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  LearnerOptions o = Options(TinyConfig());
  o.precision = Precision::kBf16;
  Learner one(Copy(init), o);
  o.shard = Shard::kParams;
  LocalRanks two(2);
  Learner rank0(Copy(init), o, two.ranks->group());
  ASSERT_TRUE(two.ranks->Setup(rank0, {}).ok());
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(one.Step(groups).ok());
    ASSERT_TRUE(two.ranks->SendStep(groups, o.lr).ok());
    Result<StepStats> b = rank0.Step(groups);
    ASSERT_TRUE(b.ok()) << b.status().message();
  }
  EXPECT_LT(RelativeUpdateDiff(one.model(), WholeWeights(*two.ranks, rank0), init), 0.05);
  ASSERT_TRUE(two.Finish().ok());
}

}  // namespace
}  // namespace echelon::learn
