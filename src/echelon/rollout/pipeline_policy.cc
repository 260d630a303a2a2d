#include "echelon/rollout/pipeline_policy.h"

#include <ATen/ATen.h>

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "echelon/rollout/model_policy.h"

namespace echelon::rollout {

PipelinePolicy::PipelinePolicy(model::ModelConfig config, model::Vocabulary vocab, model::SamplingParams params,
                               model::NextStage* next, int64_t micro_batches,
                               std::function<std::optional<model::LayerRange>()> layers)
    : config_(std::move(config)),
      vocab_(std::move(vocab)),
      params_(std::move(params)),
      next_(next),
      micro_batches_(micro_batches),
      layers_(std::move(layers)) {
  vocab_.SetStops(&params_);
}

int64_t PipelinePolicy::version() const {
  if (!model_) return -1;
  const std::optional<model::LayerRange> now = layers_();
  const model::LayerRange held = model_->range();
  if (!now || now->first != held.first || now->last != held.last) return -1;
  return version_;
}

Status PipelinePolicy::LoadSnapshot(const std::string& safetensors_bytes, int64_t version) {
  const std::string where = "snapshot v" + std::to_string(version);
  ECHELON_ASSIGN_OR_RETURN(model::StageSnapshot s, model::LoadStageSnapshot(config_, safetensors_bytes, where));
  if (s.layers.first != 0) return InvalidArgument(where + ": the head of a pipeline holds layers from 0");
  if (s.layers.last >= config_.num_hidden_layers)
    return InvalidArgument(where + ": holds every layer; a pipeline's head holds the first few");
  model_ = s.model;
  version_ = version;
  return Status::Ok();
}

Result<std::vector<data::Turn>> PipelinePolicy::Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) {
  if (!model_) return FailedPrecondition("the pipeline's head holds no snapshot yet");
  ECHELON_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> ids, EncodePrompts(vocab_, prompts));
  model::SamplingParams sp = params_;
  sp.seed = seed;
  at::NoGradGuard no_grad;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kVersionWaitSeconds);
  Result<std::vector<model::Completion>> out = std::vector<model::Completion>();
  for (;;) {
    try {
      out = model::PipelineGenerate(model_, *next_, ids, sp, micro_batches_, {}, version_);
    } catch (const std::exception& e) {  // LibTorch's errors end here
      return Internal(std::string("generation failed: ") + e.what());
    }
    // Unavailable: a stage does not hold this snapshot yet (it is fetching it) or is not there
    // (it may be back on its address at once). Anything else fails the group; Aborted (the
    // stages have moved past this snapshot) makes the actor run it again on a newer one.
    if (out.ok() || out.status().code() != StatusCode::kUnavailable || std::chrono::steady_clock::now() > deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!out.ok()) return out.status();
  return ToTurns(vocab_, std::move(ids), std::move(out).value());
}

}  // namespace echelon::rollout
