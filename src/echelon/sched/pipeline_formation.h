// Pipeline formation: a pipelined worker is several stage processes registered under one
// pipeline name, each for one stage. These are the learner's rules for making a pipeline of
// them, kept apart from the transport (net/learner_server.h) that carries the registrations:
//
//  - ChooseStageMembers: which registered process serves each stage. The member of a stage is
//    the one registered first (ties: the smaller id); a live member keeps its place, so a spare
//    registered later never displaces it and takes over only when it is gone. When a later
//    stage's member leaves or is replaced while the head stays, the head's groups were in
//    flight through it and cannot finish: they are re-issued at once instead of at lease
//    expiry. The head's own departure re-issues its groups as for any actor.
//  - LayerSplitter: how many layers each member holds, from the model's shape and what the
//    members declared of their memory and speed. The policy is plan's
//    (plan/pipeline_split.h: plan::SplitPipelineLayers); the transport is handed one, so it
//    depends on this header only.
//
//   StageMembers m = ChooseStageMembers(2, previous, {{"s0#a", 0, 1.0}, {"s1#b", 1, 2.0}});
//   if (!m.reissue_head.empty()) ...;                   // re-issue the head's groups
//   if (m.changed && m.complete) layers = split(shape, offers);  // a LayerSplitter
//
// Thread contract: pure functions and plain data.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::sched {

// A registered stage process of one pipeline.
struct StageCandidate {
  std::string id;
  int stage = 0;             // 0 .. stages-1
  double registered_at = 0;  // earlier registrations win a free stage
};

struct StageMembers {
  std::vector<std::string> active;  // per stage, the member ("" when the stage has none)
  bool changed = false;             // differs from the previous members: a new epoch
  bool complete = false;            // every stage has a member
  std::string reissue_head;         // non-empty: re-issue this head's groups now
};

// The members of a pipeline of `stages` stages, given the previous members (empty for a new
// pipeline) and every registered process of the pipeline. A previous member that is not among
// the candidates has left. Candidates whose stage is out of range are ignored.
StageMembers ChooseStageMembers(int stages, const std::vector<std::string>& previous,
                                const std::vector<StageCandidate>& candidates);

// What the layer split needs of the model (model::ModelConfig's fields).
struct PipelineModelShape {
  int64_t layers = 0;          // decoder layers
  double parameters = 0;       // every parameter (ModelConfig::NumParameters)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  bool tied_embeddings = false;
  std::string dtype;           // the weights' torch_dtype ("bfloat16", "float32", ...)
};

// One member as it declared itself; 0 means not declared.
struct StageOffer {
  std::string name;  // for messages, e.g. "box/1"
  double memory_bytes = 0;
  double seconds_per_layer = 0;
};

// Layers per stage, in pipeline order (each >= 1, summing to shape.layers), or why no split fits.
using LayerSplitter =
    std::function<Result<std::vector<int64_t>>(const PipelineModelShape& shape, const std::vector<StageOffer>& stages)>;

}  // namespace echelon::sched
