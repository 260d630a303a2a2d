#include "echelon/plan/pipeline_split.h"

#include <gtest/gtest.h>

#include <vector>

namespace echelon::plan {
namespace {

using Layers = std::vector<int64_t>;

// Four layers of 1000 parameters each; a 128 x 16 embedding, an untied lm_head of the same
// size and a 16-wide final norm: 2 * 2048 + 16 = 4112 parameters outside the layers.
sched::PipelineModelShape Shape(bool tied = false, const std::string& dtype = "bfloat16") {
  sched::PipelineModelShape s;
  s.layers = 4;
  s.vocab_size = 128;
  s.hidden_size = 16;
  s.tied_embeddings = tied;
  s.parameters = 4 * 1000 + (tied ? 2064 : 4112);
  s.dtype = dtype;
  return s;
}

std::vector<sched::StageOffer> Undeclared(int n) {
  std::vector<sched::StageOffer> stages;
  for (int i = 0; i < n; ++i) stages.push_back({"box/" + std::to_string(i), 0, 0});
  return stages;
}

TEST(PipelineSplit, TheProblemPosedCountsTheEmbeddingAndHeadOnTheFirstStage) {
  LayerSplitInput in = PipelineSplitInput(Shape(), Undeclared(2));
  EXPECT_EQ(in.layers, 4);
  EXPECT_DOUBLE_EQ(in.layer_bytes, 2000);  // 1000 parameters, two bytes each
  EXPECT_DOUBLE_EQ(in.first_bytes, 8224);
  EXPECT_DOUBLE_EQ(in.last_bytes, 0);
  ASSERT_EQ(in.stages.size(), 2u);
  EXPECT_EQ(in.stages[1].name, "box/1");
  EXPECT_GT(in.stages[0].memory_bytes, 1e100) << "undeclared memory does not limit a stage";
  EXPECT_DOUBLE_EQ(in.stages[0].seconds_per_layer, 1.0);

  in = PipelineSplitInput(Shape(/*tied=*/true), Undeclared(2));
  EXPECT_DOUBLE_EQ(in.layer_bytes, 2000);
  EXPECT_DOUBLE_EQ(in.first_bytes, 4128) << "a tied lm_head is the embedding";
  in = PipelineSplitInput(Shape(false, "float32"), Undeclared(2));
  EXPECT_DOUBLE_EQ(in.layer_bytes, 4000);
  EXPECT_DOUBLE_EQ(in.first_bytes, 16448);
}

TEST(PipelineSplit, WithNothingDeclaredTheLayersAreSpreadEvenly) {
  EXPECT_EQ(SplitPipelineLayers(Shape(), Undeclared(2)).value(), (Layers{2, 2}));
  EXPECT_EQ(SplitPipelineLayers(Shape(), Undeclared(4)).value(), (Layers{1, 1, 1, 1}));
}

TEST(PipelineSplit, ASlowerStageHoldsFewerLayers) {
  // Stage 1 three times slower: {3, 1} has a bottleneck of 3 s, {2, 2} of 6 s.
  std::vector<sched::StageOffer> stages = Undeclared(2);
  stages[1].seconds_per_layer = 3.0;
  EXPECT_EQ(SplitPipelineLayers(Shape(), stages).value(), (Layers{3, 1}));
}

TEST(PipelineSplit, DeclaredMemoryBoundsAStagesLayers) {
  // Room for the embedding, the head and one layer: the head stage holds one layer.
  std::vector<sched::StageOffer> stages = Undeclared(2);
  stages[0].memory_bytes = 8224 + 2000;
  EXPECT_EQ(SplitPipelineLayers(Shape(), stages).value(), (Layers{1, 3}));
  // The same memory holds three layers beside a tied head (4128 + 3 * 2000 = 10128).
  EXPECT_EQ(SplitPipelineLayers(Shape(/*tied=*/true), stages).value(), (Layers{2, 2}))
      << "fits, and the even split is the fastest";
  stages[1].memory_bytes = 2000;
  EXPECT_EQ(SplitPipelineLayers(Shape(/*tied=*/true), stages).value(), (Layers{3, 1}));
}

TEST(PipelineSplit, NoSplitFittingTheMemoryIsRefusedWithItsReason) {
  std::vector<sched::StageOffer> stages = Undeclared(2);
  stages[0].memory_bytes = 8000;  // not even the embedding and head of the untied model
  Result<std::vector<int64_t>> split = SplitPipelineLayers(Shape(), stages);
  ASSERT_FALSE(split.ok());
  EXPECT_FALSE(split.status().message().empty());
  stages[0].memory_bytes = 8224 + 2000;  // bf16 fits one layer; float32 weights do not
  EXPECT_FALSE(SplitPipelineLayers(Shape(false, "float32"), stages).ok());
}

}  // namespace
}  // namespace echelon::plan
