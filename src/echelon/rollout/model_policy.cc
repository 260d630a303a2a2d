#include "echelon/rollout/model_policy.h"

#include <ATen/ATen.h>

#include "echelon/model/snapshot_weights.h"

namespace echelon::rollout {

ModelPolicy::ModelPolicy(model::Qwen3Model model, model::Vocabulary vocab, model::SamplingParams params)
    : model_(std::move(model)), vocab_(std::move(vocab)), params_(std::move(params)) {
  vocab_.SetStops(&params_);
}

Result<std::vector<std::vector<int64_t>>> EncodePrompts(const model::Vocabulary& vocab,
                                                        const std::vector<data::PolicyPrompt>& prompts) {
  std::vector<std::vector<int64_t>> ids;
  for (const data::PolicyPrompt& p : prompts) {
    ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> enc, vocab.EncodePrompt(p.system, p.user));
    ids.push_back(std::move(enc));
  }
  return ids;
}

std::vector<data::Turn> ToTurns(const model::Vocabulary& vocab, std::vector<std::vector<int64_t>> ids,
                                std::vector<model::Completion> completions) {
  std::vector<data::Turn> turns(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    turns[i].prompt_ids = std::move(ids[i]);
    turns[i].text = vocab.DecodeCompletion(completions[i].tokens);
    turns[i].tokens = std::move(completions[i].tokens);
    turns[i].logprobs = std::move(completions[i].logprobs);
  }
  return turns;
}

Result<std::vector<data::Turn>> ModelPolicy::Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) {
  ECHELON_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> ids, EncodePrompts(vocab_, prompts));
  model::SamplingParams sp = params_;
  sp.seed = seed;
  at::NoGradGuard no_grad;
  model_->eval();
  std::vector<model::Completion> out;
  try {
    out = model::Generate(model_, ids, sp);
  } catch (const std::exception& e) {  // LibTorch's errors end here
    return Internal(std::string("generation failed: ") + e.what());
  }
  return ToTurns(vocab_, std::move(ids), std::move(out));
}

Status ModelPolicy::LoadSnapshot(const std::string& safetensors_bytes, int64_t version) {
  const std::string where = "snapshot v" + std::to_string(version);
  ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, safetensors_bytes, &base_, where));
  version_ = version;
  return Status::Ok();
}

Status ModelPolicy::LoadBase(const std::string& safetensors_bytes) {
  ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, safetensors_bytes, &base_, "LoRA base"));
  version_ = -1;
  return Status::Ok();
}

Result<data::EvalResult> EvaluateModel(const model::Qwen3Model& source, const model::Vocabulary& vocab,
                                       const data::TaskAdapter& task, int64_t max_new_tokens) {
  model::Qwen3Model copy(source->config());
  ECHELON_RETURN_IF_ERROR(copy->LoadStateDict(source->StateDict(), "evaluation copy"));
  model::SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = max_new_tokens;
  ModelPolicy policy(copy, vocab, sp);
  return data::EvaluateGreedy(task, task.HeldOut(), policy);
}

}  // namespace echelon::rollout
