// ModelPolicy: the builtin LibTorch inference backend. Implements data::Policy by encoding
// prompts (Vocabulary::EncodePrompt), sampling with the KV-cache generator until a stop id of
// the vocabulary, and decoding (Vocabulary::DecodeCompletion).
//
// Thread contract: owned by one actor thread; LoadSnapshot and Sample on that thread only.
#pragma once

#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/data/evaluate.h"
#include "echelon/model/generate.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"
#include "echelon/rollout/snapshot_policy.h"

namespace echelon::rollout {

// The prompts as token ids (Vocabulary::EncodePrompt), and completions as turns (decoded).
Result<std::vector<std::vector<int64_t>>> EncodePrompts(const model::Vocabulary& vocab,
                                                        const std::vector<data::PolicyPrompt>& prompts);
std::vector<data::Turn> ToTurns(const model::Vocabulary& vocab, std::vector<std::vector<int64_t>> ids,
                                std::vector<model::Completion> completions);

class ModelPolicy : public SnapshotPolicy {
 public:
  // The vocabulary's stop ids replace those of `params`.
  ModelPolicy(model::Qwen3Model model, model::Vocabulary vocab, model::SamplingParams params);

  // Throws std::invalid_argument when a prompt cannot be encoded (a character outside the
  // character tokenizer's alphabet, ill-formed UTF-8).
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override;
  bool ContinuesPrefixes() const override { return true; }
  Result<std::vector<data::Turn>> Continue(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed,
                                           const std::vector<data::Turn>& prefixes) override;
  // Replaces the weights with a snapshot's safetensors bytes (model/snapshot_weights.h: whole,
  // or LoRA adapters over the base LoadBase gave).
  Status LoadSnapshot(const std::string& safetensors_bytes, int64_t version) override;
  Status LoadBase(const std::string& safetensors_bytes) override;
  int64_t version() const override { return version_; }
  bool Evaluates() const override { return true; }
  void SetTemperature(double temperature) override { params_.temperature = temperature; }
  double temperature() const override { return params_.temperature; }
  model::Qwen3Model& model() { return model_; }

 private:
  // Sample, each completion starting from prefixes[i] (none: from the start).
  Result<std::vector<data::Turn>> SampleFrom(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed,
                                             const std::vector<data::Turn>& prefixes);

  model::Qwen3Model model_;
  model::Vocabulary vocab_;
  model::SamplingParams params_;
  int64_t version_ = -1;
  std::string base_;  // SHA-256 of the LoRA base held (LoadPolicyWeights)
};

// Greedy held-out accuracy of `source`'s weights through a ModelPolicy (temperature 0, at most
// `max_new_tokens` a completion). It runs on a copy, so the caller's model keeps its training
// state: the learner passes this as its learn::ModelEvaluator.
Result<data::EvalResult> EvaluateModel(const model::Qwen3Model& source, const model::Vocabulary& vocab,
                                       const data::TaskAdapter& task, int64_t max_new_tokens);

}  // namespace echelon::rollout
