// PipelinePolicy: the head of a pipelined rollout worker (model/pipeline.h). It holds the first
// stage's layers with the embedding and head, samples like ModelPolicy, and runs the later
// layers through the stages behind `next`, with `micro_batches` lanes in flight. Every lane
// names the head's snapshot version, so all stages compute with the same weights; a stage
// that has not caught up yet (or is not reachable) refuses the lane and the head tries again
// for up to kVersionWaitSeconds; stages that have moved past the head's snapshot fail the
// group as Aborted, which the actor runs again on its newest snapshot (Actor::kGroupAttempts).
//
//   net::StageRoute next(token, 60);                  // retargeted as the pipeline re-forms
//   PipelinePolicy policy(config, vocab, params, &next, /*micro_batches=*/2,
//                         [&] { return learner.route()... head's layers; });
//
// Thread contract: owned by one actor thread, like every SnapshotPolicy.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "echelon/model/generate.h"
#include "echelon/model/pipeline.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"
#include "echelon/rollout/snapshot_policy.h"

namespace echelon::rollout {

class PipelinePolicy : public SnapshotPolicy {
 public:
  static constexpr double kVersionWaitSeconds = 30;
  // `layers` says which layers the head holds now (nullopt: the pipeline is not formed); a
  // snapshot loaded for other layers is stale (version() -1) and is loaded again.
  PipelinePolicy(model::ModelConfig config, model::Vocabulary vocab, model::SamplingParams params,
                 model::NextStage* next, int64_t micro_batches,
                 std::function<std::optional<model::LayerRange>()> layers);

  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override;
  // The snapshot holds the head's tensors only (the learner's ranged snapshot).
  Status LoadSnapshot(const std::string& safetensors_bytes, int64_t version) override;
  int64_t version() const override;

 private:
  model::ModelConfig config_;
  model::Vocabulary vocab_;
  model::SamplingParams params_;
  model::NextStage* next_;
  int64_t micro_batches_;
  std::function<std::optional<model::LayerRange>()> layers_;
  model::Qwen3Model model_{nullptr};
  int64_t version_ = -1;
};

}  // namespace echelon::rollout
