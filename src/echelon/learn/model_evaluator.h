// ModelEvaluator: how the learning plane measures its model, the greedy accuracy on the task's
// held-out set (data/evaluate.h), after the warm-start, every eval.every versions and at the
// end. Sampling a model is the rollout plane's (rollout::ModelPolicy) and learn/ does not
// depend on it: whoever composes the two planes passes rollout::EvaluateModel (cli/launch.cc).
//
//   RunLearner(options, args, actors, rollout::EvaluateModel, &stop, std::cout);
//
// Thread contract: called on the learner thread only. The model stays the caller's: an
// implementation must leave its weights and training state as they were.
#pragma once

#include <cstdint>
#include <functional>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/data/evaluate.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"

namespace echelon::learn {

using ModelEvaluator = std::function<Result<data::EvalResult>(
    const model::Qwen3Model& model, const model::Vocabulary& vocab, const data::TaskAdapter& task,
    int64_t max_new_tokens)>;

}  // namespace echelon::learn
