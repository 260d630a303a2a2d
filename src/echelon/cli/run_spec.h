// The run spec: everything a remote actor needs to take part in a run (task adapter and its
// options, model shape, tokenizer, sampling, group size, seed), handed out by the learner at
// registration as JSON. Actors get no config file: one config, on the learner, drives all.
//
// Thread contract: free functions over values.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/cli/train_config.h"
#include "echelon/data/adapter.h"
#include "echelon/model/generate.h"
#include "echelon/model/tokenizer.h"

namespace echelon::cli {

struct ActorSetup {
  std::unique_ptr<data::TaskAdapter> task;
  model::CharTokenizer tokenizer;
  model::ModelConfig model;
  model::SamplingParams sampling;
  uint64_t seed = 0;
};

nlohmann::json MakeRunSpec(const RunOptions& options, const model::ModelConfig& model,
                           const model::CharTokenizer& tokenizer);
// Errors name the field that is missing or wrong.
Result<ActorSetup> ParseRunSpec(const std::string& json_text);
// The sampling parameters of the run's actors.
model::SamplingParams RolloutSampling(const RunOptions& options);

}  // namespace echelon::cli
