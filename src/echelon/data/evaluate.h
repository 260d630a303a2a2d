// Greedy evaluation: one episode per prompt at temperature 0, success rate over the set. A
// function of the task and a Policy only: `echelon eval` runs it on a checkpoint, the learner on
// its model (rollout::EvaluateModel).
//
// Thread contract: uses the policy from the calling thread only.
#pragma once

#include <vector>

#include "echelon/data/adapter.h"

namespace echelon::data {

struct EvalResult {
  double accuracy = 0;
  double reward_mean = 0;
  int64_t n = 0;
};

// `policy` must sample greedily (temperature 0). Prompts are run in batches of `batch`, or one
// whole episode each when the task plays episodes (TaskAdapter::EvalPlaysEpisodes). The
// policy's error fails the evaluation.
Result<EvalResult> EvaluateGreedy(const TaskAdapter& task, const std::vector<Prompt>& prompts, Policy& policy,
                                  size_t batch = 256);

}  // namespace echelon::data
