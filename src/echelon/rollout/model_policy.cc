#include "echelon/rollout/model_policy.h"

#include <ATen/ATen.h>

#include "echelon/model/safetensors.h"

namespace echelon::rollout {

ModelPolicy::ModelPolicy(model::Qwen3Model model, model::Vocabulary vocab, model::SamplingParams params)
    : model_(std::move(model)), vocab_(std::move(vocab)), params_(std::move(params)) {
  vocab_.SetStops(&params_);
}

Result<std::vector<data::Turn>> ModelPolicy::Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) {
  std::vector<std::vector<int64_t>> ids;
  for (const data::PolicyPrompt& p : prompts) {
    ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> enc, vocab_.EncodePrompt(p.system, p.user));
    ids.push_back(std::move(enc));
  }
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
  std::vector<data::Turn> turns(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    turns[i].prompt_ids = std::move(ids[i]);
    turns[i].text = vocab_.DecodeCompletion(out[i].tokens);
    turns[i].tokens = std::move(out[i].tokens);
    turns[i].logprobs = std::move(out[i].logprobs);
  }
  return turns;
}

Status ModelPolicy::LoadSnapshot(const std::string& safetensors_bytes, int64_t version) {
  const std::string where = "snapshot v" + std::to_string(version);
  ECHELON_ASSIGN_OR_RETURN(model::SafetensorsFile f, model::ParseSafetensors(safetensors_bytes, where));
  ECHELON_RETURN_IF_ERROR(model_->LoadStateDict(f.tensors, where));
  version_ = version;
  return Status::Ok();
}

}  // namespace echelon::rollout
