#include "echelon/data/evaluate.h"

#include <algorithm>

namespace echelon::data {

Result<EvalResult> EvaluateGreedy(const TaskAdapter& task, const std::vector<Prompt>& prompts, Policy& policy,
                                  size_t batch) {
  EvalResult r;
  double reward_sum = 0;
  int64_t correct = 0;
  const auto count = [&](double reward) {
    reward_sum += reward;
    correct += reward >= 1.0 ? 1 : 0;
  };
  if (task.EvalPlaysEpisodes()) {
    for (const Prompt& p : prompts) {
      ECHELON_ASSIGN_OR_RETURN(const std::vector<Episode> played, task.RunGroup(p, 1, policy, 0));
      for (const Episode& e : played) count(e.reward);
    }
  } else {
    for (size_t start = 0; start < prompts.size(); start += batch) {
      const size_t end = std::min(prompts.size(), start + batch);
      std::vector<PolicyPrompt> texts;
      for (size_t i = start; i < end; ++i) texts.push_back(PolicyPrompt::Of(prompts[i]));
      ECHELON_ASSIGN_OR_RETURN(std::vector<Turn> turns, policy.Sample(texts, 0));
      for (size_t i = start; i < end; ++i) {
        ECHELON_ASSIGN_OR_RETURN(const Scored scored, task.Reward(prompts[i], turns[i - start].text));
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

}  // namespace echelon::data
