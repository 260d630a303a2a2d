#include "echelon/rollout/evaluate.h"

#include <algorithm>

namespace echelon::rollout {

Result<EvalResult> EvaluateGreedy(const data::TaskAdapter& task, const std::vector<data::Prompt>& prompts,
                          data::Policy& policy, size_t batch) {
  EvalResult r;
  double reward_sum = 0;
  int64_t correct = 0;
  const auto count = [&](double reward) {
    reward_sum += reward;
    correct += reward >= 1.0 ? 1 : 0;
  };
  if (task.EvalPlaysEpisodes()) {
    for (const data::Prompt& p : prompts) {
      ECHELON_ASSIGN_OR_RETURN(const std::vector<data::Episode> played, task.RunGroup(p, 1, policy, 0));
      for (const data::Episode& e : played) count(e.reward);
    }
  } else {
    for (size_t start = 0; start < prompts.size(); start += batch) {
      const size_t end = std::min(prompts.size(), start + batch);
      std::vector<data::PolicyPrompt> texts;
      for (size_t i = start; i < end; ++i) texts.push_back(data::PolicyPrompt::Of(prompts[i]));
      ECHELON_ASSIGN_OR_RETURN(std::vector<data::Turn> turns, policy.Sample(texts, 0));
      for (size_t i = start; i < end; ++i) {
        ECHELON_ASSIGN_OR_RETURN(const data::Scored scored, task.Reward(prompts[i], turns[i - start].text));
        count(scored.reward);
      }
    }
  }
  r.n = static_cast<int64_t>(prompts.size());
  if (r.n > 0) {
    r.accuracy = static_cast<double>(correct) / r.n;
    r.reward_mean = reward_sum / r.n;
  }
  return r;
}

}  // namespace echelon::rollout
