// The run spec: everything a remote actor needs to take part in a run (task adapter and its
// options, model shape, vocabulary with its tokenizer files, sampling, group size, seed), handed
// out by the learner at
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
#include "echelon/model/vocabulary.h"

namespace echelon::cli {

struct ActorSetup {
  std::unique_ptr<data::TaskAdapter> task;
  model::Vocabulary vocab;
  model::ModelConfig model;
  model::SamplingParams sampling;
  uint64_t seed = 0;
};

nlohmann::json MakeRunSpec(const RunOptions& options, const model::ModelConfig& model, const model::Vocabulary& vocab);
// Errors name the field that is missing or wrong.
Result<ActorSetup> ParseRunSpec(const std::string& json_text);
// The sampling parameters of the run's actors (stop ids come from the vocabulary).
model::SamplingParams RolloutSampling(const RunOptions& options);

}  // namespace echelon::cli
