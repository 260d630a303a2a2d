// The run spec: everything a remote actor needs to take part in a run (task adapter and its
// options, model shape, vocabulary with its tokenizer files, sampling), handed out by the
// learner at registration as JSON. Actors get no config file: one config, on the learner,
// drives all. What only the learner may read stays out of it (LearnerOnlyTaskOption): its data
// files and services, and the seeds of what a worker must not know ahead (each group's sampling
// seed comes with the group's assignment, contract::Assignment::seed).
//
//   std::string text = RunSpecToJson(spec).dump();                  // learner side
//   ECHELON_ASSIGN_OR_RETURN(ActorSetup setup, ParseRunSpec(text));  // actor side
//
// Thread contract: free functions over values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/data/adapter.h"
#include "echelon/model/generate.h"
#include "echelon/model/model_config.h"
#include "echelon/model/vocabulary.h"

namespace echelon::contract {

struct RunSpec {
  std::string task_name;
  data::AdapterOptions task_options;
  model::ModelConfig model;
  model::Vocabulary vocab;
  // temperature, top_p, top_k, min_p, max_new_tokens, slots, route_margin (stops: the vocabulary's)
  model::SamplingParams sampling;
  bool partial = false;  // rollout.partial (rollout::ActorOptions::partial)
  // rollout.verify_draws: the learner checks that sampled tokens are the seeded draws, so an
  // actor whose backend cannot draw them (openai-http) must not join.
  bool verify_draws = false;
};

// What an actor builds from the spec.
struct ActorSetup {
  std::unique_ptr<data::TaskAdapter> task;
  model::Vocabulary vocab;
  model::ModelConfig model;
  model::SamplingParams sampling;
  bool partial = false;
  bool verify_draws = false;
};

// A task option that never leaves the learner: `*_file` and `*_url` (data and scoring
// services: each prompt comes with its work), `server` (an environment the learner plays),
// `seed` and `secret` (data order, deals and episode seeds).
bool LearnerOnlyTaskOption(const std::string& key);

// Without the learner-only task options.
nlohmann::json RunSpecToJson(const RunSpec& spec);
// Errors name the field that is missing or wrong.
Result<ActorSetup> ParseRunSpec(const std::string& json_text);

}  // namespace echelon::contract
