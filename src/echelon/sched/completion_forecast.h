// CompletionForecast: when a group handed to a worker now would come back, and whether that is
// before the learner would drop it as stale. The dispatcher asks it which waiting group to hand
// to each worker (sched/dispatcher.h, deadline-aware dispatch); the learner and the simulator
// feed it what they observe, so both run the same rule.
//
// What it learns, each as an exponentially weighted mean (kForecastWeight for a new value):
//   - per worker, its rate in group tokens per second: a finished group's tokens (every
//     sample's completion) over the seconds from hand-out to submission;
//   - per prompt (a key the caller gives: a dataset row), its groups' tokens; a prompt never
//     seen is predicted at the mean of every group seen (the dataset's distribution so far);
//   - the learner's seconds per update, from the times its version advanced.
// A group of prompt p on worker w is predicted to take tokens(p) / rate(w) seconds. Its budget
// is the time until it would be stale: a group sampled at the current version must be consumed
// within S updates, S x seconds_per_update from now. It fits when the prediction is within
// kForecastSafety of the budget. Where anything is unknown (a worker with no finished group,
// no group seen at all, no update yet, S = 0: the learner waits for every group) it fits.
//
//   CompletionForecast f;
//   f.ObserveGroup("gpu-3", /*prompt=*/17, /*tokens=*/4096, /*seconds=*/20);
//   f.ObserveVersion(1, 30.0);  f.ObserveVersion(2, 42.0);
//   std::optional<double> s = f.GroupSeconds("gpu-3", 17);   // 20
//   double slack = f.Slack("gpu-3", 17, /*staleness=*/2);     // 2 x 12 - 20 = 4 s
//
// Thread contract: a plain value; the dispatcher's mutex guards its copy.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace echelon::sched {

// The rule's constants, in one place.
inline constexpr double kForecastWeight = 0.25;  // of a new observation in each running mean
inline constexpr double kForecastSafety = 1.0;   // fits: predicted seconds <= this x the budget
// A waiting group passed over this many times goes to the next worker that asks, fit or not,
// so that no prompt waits for ever (one too long for every worker included).
inline constexpr int64_t kMaxPassOvers = 64;

class CompletionForecast {
 public:
  // A group of `prompt` with `tokens` completion tokens in all came back from `worker`
  // `seconds` after it was handed out.
  void ObserveGroup(const std::string& worker, uint64_t prompt, double tokens, double seconds);
  // The learner reached `version` at time `now` (seconds).
  void ObserveVersion(int64_t version, double now);

  // tokens(prompt) / rate(worker); nullopt when either is unknown.
  std::optional<double> GroupSeconds(const std::string& worker, uint64_t prompt) const;
  // The learner's seconds per update; nullopt before two versions were seen.
  std::optional<double> UpdateSeconds() const;
  // Budget minus prediction, in seconds: how much earlier than its staleness deadline the group
  // is predicted back (negative: late). +infinity when nothing can be predicted.
  double Slack(const std::string& worker, uint64_t prompt, int64_t staleness) const;
  bool Fits(const std::string& worker, uint64_t prompt, int64_t staleness) const {
    return Slack(worker, prompt, staleness) >= 0;
  }

  std::optional<double> WorkerRate(const std::string& worker) const;  // group tokens per second
  double PromptTokens(uint64_t prompt) const;                          // 0 when nothing is known

 private:
  std::map<std::string, double> rate_;  // worker -> group tokens per second
  std::map<uint64_t, double> tokens_;   // prompt -> group tokens
  double mean_tokens_ = 0;              // over every group observed
  int64_t groups_ = 0;
  int64_t last_version_ = -1;
  double last_version_at_ = 0;
  double update_seconds_ = 0;  // 0: unknown
};

}  // namespace echelon::sched
