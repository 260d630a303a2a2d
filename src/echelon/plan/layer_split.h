// Layer allocation for a rollout pipeline: a model too large for one cheap GPU is served by k
// stages in a row, each holding a contiguous slice of the decoder's layers (Parallax, arXiv
// 2509.26182, chooses such splits over heterogeneous GPUs with a dynamic program). Given the
// stages in pipeline order (memory, seconds per layer), what one layer costs in memory, and
// what the first stage (embedding, sampling) and the last (final norm, lm_head) add, choose how
// many layers each stage holds:
//   kThroughput: minimise the slowest stage's time (a pipeline with micro-batches in flight
//     emits one micro-batch per bottleneck time); among those splits, the smallest latency.
//   kLatency: minimise the time of one token through all stages; among those, the smallest
//     bottleneck.
// A stage's time for n layers: n * seconds_per_layer, plus first_seconds on stage 0,
// last_seconds on the last stage, and link_seconds for the hand-off to the next stage. Every
// stage holds at least one layer and fits its memory.
//
// Method: exact dynamic programs over (stage, layers placed), O(k L^2):
//  - the smallest bottleneck B* by a min-max program, then the smallest latency over splits
//    whose every stage time is <= B* (a min-sum program under that cap): two passes, because
//    one pass on (max, sum) pairs is not exact (a prefix with the larger max may have the sum
//    that wins after the next stage);
//  - kLatency: one min-sum program on (sum, max) pairs, which is exact: a smaller prefix sum
//    always gives the smaller total, and equal sums are ordered by their max.
//
//   LayerSplitInput in{.layers = 48, .layer_bytes = 1.2e9, .first_bytes = 1.2e9, .last_bytes = 1.2e9,
//                      .stages = {{"5090-a", 32e9, 0.004}, {"5090-b", 32e9, 0.004}}};
//   Result<LayerSplit> s = SplitLayers(in, SplitObjective::kThroughput);   // s->layers = {23, 25}
//
// Thread contract: pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::plan {

struct PipelineStage {
  std::string name;
  double memory_bytes = 0;       // what the stage may fill (weights + KV cache + activations)
  double seconds_per_layer = 0;  // one micro-batch through one layer (measured or declared)
};

struct LayerSplitInput {
  int64_t layers = 0;
  double layer_bytes = 0;   // one layer's weights plus its KV cache at the planned batch
  double first_bytes = 0;   // held by stage 0 besides its layers (embedding)
  double last_bytes = 0;    // held by the last stage besides its layers (final norm, lm_head)
  double first_seconds = 0;  // stage 0's work besides its layers (embedding, sampling)
  double last_seconds = 0;   // the last stage's (final norm, lm_head)
  double link_seconds = 0;   // hand-off of one micro-batch's activations to the next stage
  std::vector<PipelineStage> stages;  // in pipeline order
};

enum class SplitObjective { kThroughput, kLatency };

struct LayerSplit {
  std::vector<int64_t> layers;    // per stage, >= 1, summing to the model's layers
  double bottleneck_seconds = 0;  // the slowest stage's time
  double latency_seconds = 0;     // one micro-batch through every stage
};

// Fails with one line when the input is malformed or no split fits the stages' memory (naming
// the memory needed and available).
Result<LayerSplit> SplitLayers(const LayerSplitInput& in, SplitObjective objective);

// A stage's time and memory for `n` layers at position `i` (what SplitLayers optimises).
double StageSeconds(const LayerSplitInput& in, size_t i, int64_t n);
double StageBytes(const LayerSplitInput& in, size_t i, int64_t n);

}  // namespace echelon::plan
