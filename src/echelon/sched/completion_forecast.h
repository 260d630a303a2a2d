// CompletionForecast: when a group handed to a worker now would come back, and whether that is
// before the learner would drop it as stale. The dispatcher asks it which waiting group to hand
// to each worker (sched/dispatcher.h, deadline-aware dispatch); the learner and the simulator
// feed it what they observe, so both run the same rule.
//
// What it learns, each as an exponentially weighted mean (kForecastWeight for a new value):
//   - per worker, its rate in group tokens per second: a finished group's tokens (every
//     sample's completion) over the seconds from hand-out to submission;
//   - per prompt (a key the caller gives: a dataset row), its groups' tokens; a prompt never
//     seen is predicted at the kUnseenPromptQuantile of every group seen (the dataset's
//     distribution so far): a worker that can return even a long one in time takes it, a slow
//     one keeps to prompts known to be short;
//   - per worker, its lag: how many versions older than the learner's at hand-out the snapshot
//     its groups were sampled from is (a worker behind a slow link samples from old ones);
//   - the learner's seconds per update, from the times its version advanced.
// A group of prompt p on worker w is predicted to take tokens(p) / rate(w) seconds. Its budget
// is the time until it would be stale: sampled lag(w) versions behind the learner's v, it must
// reach the learner before the learner takes its batch for update v - lag(w) + S, which it does
// as soon as version v - lag(w) + S is reached: (S - lag(w)) x seconds_per_update after the
// update now running began. A group continued from a kept prefix (resumable groups) needs only
// its remaining tokens, tokens(p) minus those kept, and its deadline is its prefix's oldest
// token's: the lag is at least the learner's version minus that token's. It fits when the
// prediction is within kForecastSafety of the budget. Where anything is unknown (a worker with
// no finished group, no group seen at all, no update yet, S = 0: the learner waits for every
// group) it fits.
//
//   CompletionForecast f;
//   f.ObserveGroup("gpu-3", /*prompt=*/17, /*tokens=*/4096, /*seconds=*/20, /*lag=*/0);
//   f.ObserveVersion(1, 30.0);  f.ObserveVersion(2, 42.0);
//   std::optional<double> s = f.GroupSeconds("gpu-3", 17);   // 20
//   double slack = f.Slack("gpu-3", 17, /*staleness=*/2, /*now=*/42.0);  // 2 x 12 - 20 = 4 s
//
// Thread contract: a plain value; the dispatcher's mutex guards its copy.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace echelon::sched {

// The rule's constants, in one place.
inline constexpr double kForecastWeight = 0.25;  // of a new observation in each running mean
// Fits: predicted seconds <= this x the budget. Below 1 for what the means do not see: a worker's
// snapshot lag and a prompt's length vary from group to group (configs/simulate-mixed-fleet.yaml:
// 1.0 wasted 8.5% of tokens as stale, 0.8 6.7%, 0.6 4.0%, the slow workers idling more).
inline constexpr double kForecastSafety = 0.8;
// A waiting group passed over this many times goes to the next worker that asks, fit or not,
// so that no prompt waits for ever (one too long for every worker included).
inline constexpr int64_t kMaxPassOvers = 64;
// ... but only to a worker at least this fraction as fast as the fastest known: a group long
// enough to be passed over that often would be late on a slow one too.
inline constexpr double kPassedOverRateFraction = 0.5;
// What a prompt never seen is predicted at: this quantile of the groups seen (response lengths
// are heavy-tailed, and the mean would send a slow worker many of the long ones).
inline constexpr double kUnseenPromptQuantile = 0.9;
// New groups the dispatcher draws ahead to choose from (DispatcherOptions::lookahead) under
// deadline-aware dispatch: a few times a large worker's concurrent groups, so a slow worker
// finds a short prompt among them.
inline constexpr int64_t kDeadlineLookahead = 32;

class CompletionForecast {
 public:
  // A group of `prompt` with `tokens` completion tokens in all came back from `worker`
  // `seconds` after it was handed out, sampled from a snapshot `lag` versions older than the
  // learner's at the hand-out.
  void ObserveGroup(const std::string& worker, uint64_t prompt, double tokens, double seconds, double lag);
  // The learner reached `version` at time `now` (seconds).
  void ObserveVersion(int64_t version, double now);

  // tokens(prompt) / rate(worker); nullopt when either is unknown.
  std::optional<double> GroupSeconds(const std::string& worker, uint64_t prompt) const;
  // The learner's seconds per update; nullopt before two versions were seen.
  std::optional<double> UpdateSeconds() const;
  // Budget minus prediction at time `now`, in seconds: how much earlier than its staleness
  // deadline the group is predicted back (negative: late). +infinity when nothing can be
  // predicted.
  // `lag`: the worker's snapshot lag when known (it said which snapshot it holds), instead of
  // its running mean. `prefix` (a group continued from what was kept of it): its tokens and how
  // many versions older than the learner's its oldest token is.
  struct Prefix {
    double tokens = 0;
    double lag = 0;
  };
  double Slack(const std::string& worker, uint64_t prompt, int64_t staleness, double now,
               std::optional<double> lag = std::nullopt, std::optional<Prefix> prefix = std::nullopt) const;
  bool Fits(const std::string& worker, uint64_t prompt, int64_t staleness, double now) const {
    return Slack(worker, prompt, staleness, now) >= 0;
  }

  std::optional<double> WorkerRate(const std::string& worker) const;  // group tokens per second
  // Whether `worker` is at least kPassedOverRateFraction as fast as the fastest known (or its
  // rate or any is unknown): may it take a group passed over kMaxPassOvers times?
  bool AmongTheFastest(const std::string& worker) const;
  double WorkerLag(const std::string& worker) const;                   // versions; 0 when unknown
  double PromptTokens(uint64_t prompt) const;                          // 0 when nothing is known
  double TokensQuantile(double q) const;  // of every group seen; 0 when none

 private:
  std::map<std::string, double> rate_;  // worker -> group tokens per second
  std::map<std::string, double> lag_;   // worker -> versions behind at hand-out
  std::map<uint64_t, double> tokens_;   // prompt -> group tokens
  // Every group's tokens, in bins a quarter-octave wide (bin i: [2^(i/4), 2^((i+1)/4))).
  static constexpr int kBins = 160;
  int64_t histogram_[kBins] = {};
  int64_t groups_ = 0;
  int64_t last_version_ = -1;
  double last_version_at_ = 0;
  double update_seconds_ = 0;  // 0: unknown
};

}  // namespace echelon::sched
