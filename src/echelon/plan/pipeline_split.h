// SplitPipelineLayers: the layer split of a pipeline the learner formed from a worker's stage
// processes (sched/pipeline_formation.h), a sched::LayerSplitter. It poses the split as
// plan/layer_split.h's problem and solves it for throughput (the smallest bottleneck stage):
//  - memory: a stage holds its layers' weights, each layer an equal share of the parameters
//    outside the embedding, the lm_head (none when tied) and the final norm; stage 0 holds
//    those too (it embeds and samples). Two bytes per parameter, four for float32 weights.
//  - a stage that declared no memory is not limited; one that declared no speed takes one
//    second per layer, so with nothing declared the layers are spread evenly.
//
//   Result<std::vector<int64_t>> n = SplitPipelineLayers(shape, {{"box/0", 0, 0}, {"box/1", 0, 3.0}});
//   sched::LayerSplitter split = SplitPipelineLayers;  // what cli/launch.cc hands the learner's server
//
// Thread contract: pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/plan/layer_split.h"
#include "echelon/sched/pipeline_formation.h"

namespace echelon::plan {

// The problem SplitPipelineLayers solves (exposed for tests).
LayerSplitInput PipelineSplitInput(const sched::PipelineModelShape& shape,
                                   const std::vector<sched::StageOffer>& stages);

// Layers per stage, in pipeline order; fails with plan::SplitLayers' one line when no split
// fits the declared memory.
Result<std::vector<int64_t>> SplitPipelineLayers(const sched::PipelineModelShape& shape,
                                                 const std::vector<sched::StageOffer>& stages);

}  // namespace echelon::plan
