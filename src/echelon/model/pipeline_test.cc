#include "echelon/model/pipeline.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "echelon/model/testing.h"

namespace echelon::model {
namespace {

// Stages after the first, chained: servers[0] serves the layers right after the first stage.
struct Chain {
  std::vector<std::unique_ptr<StageServer>> servers;
  NextStage& head() { return *servers.front(); }
};

// `cuts` = the first layer of each stage after the first, e.g. {2} or {1, 3}.
Chain Build(const Qwen3Model& whole, const std::vector<int64_t>& cuts) {
  Chain chain;
  chain.servers.resize(cuts.size());
  for (size_t i = cuts.size(); i-- > 0;) {
    const int64_t last = i + 1 < cuts.size() ? cuts[i + 1] : whole->config().num_hidden_layers;
    chain.servers[i] = std::make_unique<StageServer>(StageOf(whole, {cuts[i], last}),
                                                     i + 1 < cuts.size() ? chain.servers[i + 1].get() : nullptr);
  }
  return chain;
}

// Eight rows: two groups of three sharing a prompt, two single prompts; EOS = 7 ends rows early;
// three sequence slots, so rows wait and refill finished slots.
const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 30, 3}, {5, 17, 30, 3}, {5, 17, 30, 3}, {9},
                                                    {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6},
                                                    {40, 41}};

SamplingParams Params(int64_t slots, int64_t eos = 7) {
  SamplingParams p;
  p.temperature = 1.0;
  p.max_new_tokens = 10;
  p.eos_token_id = eos;
  p.seed = 123;
  p.slots = slots;
  return p;
}

// The token drawn most often after the first step of a run without EOS: as EOS it ends rows at
// different steps.
int64_t FrequentToken(Qwen3Model& whole) {
  std::map<int64_t, int64_t> count;
  for (const Completion& c : Generate(whole, kPrompts, Params(3, -1)))
    for (size_t i = 1; i < c.tokens.size(); ++i) ++count[c.tokens[i]];
  return std::max_element(count.begin(), count.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
}

void ExpectSame(const std::vector<Completion>& got, const std::vector<Completion>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << "row " << r;
    EXPECT_EQ(got[r].logprobs, want[r].logprobs) << "row " << r;
    EXPECT_EQ(got[r].finished_eos, want[r].finished_eos) << "row " << r;
  }
}

TEST(PipelineTest, StagesHoldOnlyTheirLayersTensors) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  Qwen3Model first(whole->config(), LayerRange{0, 1}), later(whole->config(), LayerRange{1, 3});
  for (const auto& [name, t] : first->StateDict())
    EXPECT_TRUE(name.rfind("model.layers.0.", 0) == 0 || name.find("layers") == std::string::npos) << name;
  EXPECT_TRUE(first->StateDict().count("model.embed_tokens.weight"));
  EXPECT_TRUE(first->StateDict().count("model.norm.weight"));
  EXPECT_FALSE(later->StateDict().count("model.embed_tokens.weight"));
  EXPECT_FALSE(later->StateDict().count("model.norm.weight"));
  EXPECT_TRUE(later->StateDict().count("model.layers.2.mlp.up_proj.weight"));
  EXPECT_FALSE(later->StateDict().count("model.layers.3.mlp.up_proj.weight"));
  EXPECT_EQ(later->NewCache(2, 8).layers(), 2u);
  // Strict loading stays strict: the whole model's tensors are not a stage's.
  const Status st = later->LoadStateDict(whole->StateDict(), "whole");
  EXPECT_NE(st.message().find("unexpected tensor model.embed_tokens.weight"), std::string::npos) << st.message();
  EXPECT_THROW(Qwen3Model(whole->config(), LayerRange{3, 5}), c10::Error);
  EXPECT_THROW(Qwen3Model(whole->config(), LayerRange{2, 2}), c10::Error);
}

TEST(PipelineTest, TwoAndThreeStagesGenerateExactlyTheWholeModelsTokensAndLogprobs) {
  for (bool moe : {false, true}) {
    Qwen3Model whole = PeakedModel(FourLayerConfig(moe));
    const int64_t eos = FrequentToken(whole);
    const std::vector<Completion> want = Generate(whole, kPrompts, Params(3, eos));
    int64_t ended_early = 0;
    for (const Completion& c : want) ended_early += c.finished_eos && c.tokens.size() < 10;
    ASSERT_GE(ended_early, 2) << "the rows must end at different steps for the test to mean something";
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{2}, std::vector<int64_t>{1, 3}}) {
      SCOPED_TRACE(std::string(moe ? "moe, " : "dense, ") + std::to_string(cuts.size() + 1) + " stages");
      Chain chain = Build(whole, cuts);
      Qwen3Model first = StageOf(whole, {0, cuts[0]});
      Result<std::vector<Completion>> got = PipelineGenerate(first, chain.head(), kPrompts, Params(3, eos), 1);
      ASSERT_TRUE(got.ok()) << got.status().message();
      ExpectSame(got.value(), want);
      for (const auto& s : chain.servers) EXPECT_EQ(s->open_lanes(), 0);
    }
  }
}

TEST(PipelineTest, MicroBatchesDrawWhatTheWholeModelDrawsForTheirRows) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  Chain chain = Build(whole, {1, 3});
  Qwen3Model first = StageOf(whole, {0, 1});
  const int64_t eos = FrequentToken(whole);
  for (int64_t lanes : {2, 4}) {
    SCOPED_TRACE(std::to_string(lanes) + " micro-batches");
    Result<std::vector<Completion>> got = PipelineGenerate(first, chain.head(), kPrompts, Params(4, eos), lanes);
    ASSERT_TRUE(got.ok()) << got.status().message();
    // Each lane is exactly the whole model's Generate over the lane's rows (its own row
    // streams, slots / lanes slots).
    const int64_t per_lane = static_cast<int64_t>(kPrompts.size()) / lanes;
    for (int64_t j = 0; j < lanes; ++j) {
      SamplingParams p = Params(4 / lanes, eos);
      p.first_row = j * per_lane;
      const std::vector<std::vector<int64_t>> rows(kPrompts.begin() + j * per_lane,
                                                   kPrompts.begin() + (j + 1) * per_lane);
      const std::vector<Completion> want = Generate(whole, rows, p);
      ExpectSame(std::vector<Completion>(got->begin() + j * per_lane, got->begin() + (j + 1) * per_lane), want);
    }
    // And the log-probs are the whole model's rescoring of the drawn tokens.
    for (size_t r = 0; r < kPrompts.size(); ++r) {
      const std::vector<float> rescored = ScoreCompletion(whole, kPrompts[r], got.value()[r].tokens, 1.0);
      for (size_t i = 0; i < rescored.size(); ++i) EXPECT_NEAR(got.value()[r].logprobs[i], rescored[i], 1e-5);
    }
  }
}

TEST(PipelineTest, AStopFromTheCallbackEndsEveryStage) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  Chain chain = Build(whole, {1, 3});
  Qwen3Model first = StageOf(whole, {0, 1});
  int64_t steps = 0;
  const StepCallback stop_after_three = [&](const std::vector<int64_t>&, const std::vector<int64_t>&,
                                            const std::vector<float>&) { return ++steps < 3; };
  Result<std::vector<Completion>> got = PipelineGenerate(first, chain.head(), kPrompts, Params(3), 1, stop_after_three);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(steps, 3);
  for (const Completion& c : got.value()) EXPECT_LE(c.tokens.size(), 3u);
  for (const auto& s : chain.servers) EXPECT_EQ(s->open_lanes(), 0);
}

// A later stage that fails every forward (as a stage that died does).
class DeadStage : public NextStage {
 public:
  Status Open(uint64_t, const LaneSpec&) override { return Status::Ok(); }
  Result<at::Tensor> Forward(uint64_t, StageMessage) override { return Unavailable("stage 2 is gone"); }
  Status Close(uint64_t, StageMessage) override { return Status::Ok(); }
};

TEST(PipelineTest, ADeadStageFailsTheCallWithItsErrorAndLeavesNoLaneOpen) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  DeadStage dead;
  StageServer middle(StageOf(whole, {1, 3}), &dead);
  Qwen3Model first = StageOf(whole, {0, 1});
  Result<std::vector<Completion>> got = PipelineGenerate(first, middle, kPrompts, Params(3), 2);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("stage 2 is gone"), std::string::npos) << got.status().message();
  EXPECT_EQ(middle.open_lanes(), 0);
}

// Regression: a lane whose first stage vanished mid-generation stayed open for good, holding
// its cache and, with enough of them, the stage's whole lane limit.
TEST(PipelineTest, ALaneLeftSilentIsClosedWhenTheNextOpens) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  StageServer last(StageOf(whole, {1, 4}), nullptr, /*lane_idle_seconds=*/0.2);
  LaneSpec spec{{{5, 6}}, Params(0)};
  ASSERT_TRUE(last.Open(1, spec).ok());
  EXPECT_EQ(last.open_lanes(), 1);
  ASSERT_TRUE(last.Open(2, spec).ok());  // lane 1 is not idle yet
  EXPECT_EQ(last.open_lanes(), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ASSERT_TRUE(last.Open(3, spec).ok());
  EXPECT_EQ(last.open_lanes(), 1);
  EXPECT_FALSE(last.Forward(1, StageMessage{false, {}, {}, at::zeros({1, 1, 32})}).ok());
}

TEST(PipelineTest, EveryStageOfALaneComputesWithTheSnapshotTheLaneNames) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  Qwen3Model other = PeakedModel(FourLayerConfig());
  {
    at::NoGradGuard no_grad;  // later layers that outweigh the peaked embedding (no RNG drawn)
    for (auto& [name, t] : other->StateDict())
      if (name.find("down_proj") != std::string::npos) t.mul_(1000);
  }
  StageServer last(Qwen3Model(nullptr), nullptr);
  Qwen3Model first = StageOf(whole, {0, 1});
  Result<std::vector<Completion>> none = PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 4);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable) << "a stage without weights is not ready";
  last.SetModel(StageOf(other, {1, 4}), 3);
  last.SetModel(StageOf(whole, {1, 4}), 4);
  EXPECT_EQ(last.version(), 4);
  StageServer whole_rest(StageOf(whole, {1, 4}), nullptr);
  const std::vector<Completion> want = PipelineGenerate(first, whole_rest, kPrompts, Params(3), 1).value();
  const std::vector<Completion> v4 = PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 4).value();
  for (size_t r = 0; r < want.size(); ++r) EXPECT_EQ(v4[r].tokens, want[r].tokens) << r;
  // v3's weights are another model's: the lane that names it decodes with them.
  const std::vector<Completion> v3 = PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 3).value();
  bool differs = false;
  for (size_t r = 0; r < want.size(); ++r) differs = differs || v3[r].logprobs != want[r].logprobs;
  EXPECT_TRUE(differs);
  // Two versions are kept; a lane naming an older one is refused as Aborted (the first stage
  // must move on), a newer one as Unavailable (this stage is fetching it).
  last.SetModel(StageOf(whole, {1, 4}), 5);
  Result<std::vector<Completion>> gone = PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 3);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kAborted) << gone.status().message();
  EXPECT_EQ(PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 6).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(last.wanted(), 6) << "the stage knows which snapshot to fetch";
  EXPECT_TRUE(PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 4).ok());
  // New layers (a new split) retire every other range's weights.
  last.SetModel(StageOf(whole, {2, 4}), 6);
  EXPECT_EQ(PipelineGenerate(first, last, kPrompts, Params(3), 1, {}, 5).status().code(), StatusCode::kAborted);
  EXPECT_EQ(last.open_lanes(), 0);
}

TEST(PipelineTest, TensorNamesSayWhichStageHoldsThem) {
  EXPECT_TRUE(StageHolds("model.embed_tokens.weight", {0, 2}));
  EXPECT_FALSE(StageHolds("model.embed_tokens.weight", {2, 4}));
  EXPECT_TRUE(StageHolds("lm_head.weight", {0, 1}));
  EXPECT_TRUE(StageHolds("model.layers.3.mlp.experts.12.up_proj.weight", {2, 4}));
  EXPECT_FALSE(StageHolds("model.layers.4.self_attn.q_proj.weight", {2, 4}));
  EXPECT_FALSE(StageHolds("model.layers.1.input_layernorm.weight", {2, 4}));
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  for (LayerRange r : {LayerRange{0, 1}, LayerRange{1, 3}, LayerRange{3, 4}, LayerRange{0, 4}}) {
    Qwen3Model stage(whole->config(), r);
    const auto held = stage->StateDict();
    for (const auto& [name, t] : whole->StateDict()) EXPECT_EQ(StageHolds(name, r), held.count(name) == 1) << name;
    const LayerRange got = RangeOfTensors(held).value();
    EXPECT_EQ(got.first, r.first);
    EXPECT_EQ(got.last, r.last);
  }
  EXPECT_FALSE(RangeOfTensors({{"model.norm.weight", at::ones({2})}}).ok());
}

TEST(PipelineTest, MessagesOutOfStepAreRefusedNotComputed) {
  Qwen3Model whole = PeakedModel(FourLayerConfig());
  StageServer last(StageOf(whole, {1, 4}), nullptr);
  LaneSpec spec{{{5, 6}}, Params(0)};
  ASSERT_TRUE(last.Open(9, spec).ok());
  EXPECT_FALSE(last.Open(9, spec).ok());  // one lane id, one lane
  StageMessage draws;  // draws where the first forward's hidden states are due
  draws.has_draws = true;
  draws.rows = {0};
  draws.tokens = {3};
  draws.hidden = at::zeros({1, 1, 32});
  Result<at::Tensor> r = last.Forward(9, draws);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of step"), std::string::npos) << r.status().message();
  EXPECT_FALSE(last.Forward(10, draws).ok());  // no such lane
  EXPECT_FALSE(last.Close(9, StageMessage()).ok());
  EXPECT_EQ(last.open_lanes(), 0);
}

}  // namespace
}  // namespace echelon::model
