// WorkerStats: what each worker's consumed groups look like, beside the other workers'. A
// worker that lies only where the verifier does not look (a reward it games, samples it
// shapes, texts made long) still stands out from the fleet in what its groups contain, so
// the learner keeps per worker, over the learner process's life (a resume starts afresh):
//   reward_mean       mean reward of its episodes
//   zero_spread_frac  share of its groups whose episodes all got the same reward
//   length_mean       mean completion tokens of a turn
//   gap_mean          mean |learner - claimed| behaviour log-prob at the start of the update
//   route_agreement   router replay: share of its sent routes the learner's own router chose
//                     too (only for workers that sent routes: a worker on other weights, or one
//                     sending routes it did not draw, agrees less than the fleet)
//   canary_pass       share of its samples of canary groups (eval.canaries: known-answer
//                     prompts handed out as training work, learn/trajectory_intake.h) that
//                     succeeded; only for workers that sampled canaries. A worker on a smaller
//                     model or at another temperature passes them at another rate than the fleet.
// and flags canary_pass when it differs from the pooled rate p of the other workers' canary
// samples by more than kCanaryScale binomial standard errors sqrt(p (1 - p) / n) (at least
// kCanaryFloor), once the worker has kCanaryMinSamples samples and kOutlierMinWorkers workers
// have as many (every worker draws canaries from one set, so their rates compare directly);
// it flags every other statistic of a worker as an outlier when it lies more than kOutlierScale robust
// deviations from the fleet's median (median absolute deviation x 1.4826, held at least at a
// floor per statistic so an all-alike honest fleet does not flag sampling noise), once at
// least kOutlierMinWorkers workers have kOutlierMinGroups groups each. A flag is a signal for
// the operator (metrics.jsonl's actor_stats, a warning the first time), not a strike: an
// honest worker may draw an unusual share of hard prompts.
//
//   WorkerStats s;
//   s.Add("alice", {/*reward_mean=*/0.5, /*zero_spread=*/false, /*length_mean=*/212, /*gap=*/1e-6});
//   nlohmann::json j = s.ToJson();   // {"alice": {"groups": 1, "reward_mean": 0.5, ...}}
//
// Thread contract: a plain value (the learner loop's own).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace echelon::learn {

// The rule's constants, in one place.
inline constexpr int kOutlierMinWorkers = 3;      // fewer: no fleet to compare with
inline constexpr int64_t kOutlierMinGroups = 16;  // a worker's groups before its statistics count
inline constexpr double kOutlierScale = 5.0;      // robust deviations from the median
// Floors of the robust deviation, per statistic: sampling noise a fleet of honest workers
// shows even when its median absolute deviation is ~0.
inline constexpr double kRewardFloor = 0.05;       // reward units (rewards in [0, 1] for the built-in tasks)
inline constexpr double kZeroSpreadFloor = 0.05;   // share of groups
inline constexpr double kLengthFloorFrac = 0.10;   // of the median length (and at least 1 token)
inline constexpr double kGapFloor = 0.01;          // nats
inline constexpr double kRouteAgreementFloor = 0.05;  // share of routes
// Canaries: samples before a worker's pass rate counts, binomial standard errors from the rest
// of the fleet's rate, and the smallest difference flagged (a share of samples).
inline constexpr int64_t kCanaryMinSamples = 32;
inline constexpr double kCanaryScale = 4.0;
inline constexpr double kCanaryFloor = 0.05;

// A worker's canary groups (eval.canaries) as the intake scored them.
struct CanaryTally {
  int64_t groups = 0;
  int64_t samples = 0;
  int64_t successes = 0;
};

// One consumed group's contribution.
struct GroupSummary {
  double reward_mean = 0;   // of its episodes
  bool zero_spread = false;  // every episode the same reward
  double length_mean = 0;   // completion tokens per turn
  double gap = 0;           // mean |learner - claimed| log-prob (StepStats::group_logprob_gap)
  int64_t routes = 0, routes_same = 0;  // router replay: routes sent, of which the learner chose alike
};

class WorkerStats {
 public:
  struct Row {
    int64_t groups = 0;
    double reward_mean = 0, zero_spread_frac = 0, length_mean = 0, gap_mean = 0;
    double route_agreement = std::numeric_limits<double>::quiet_NaN();  // NaN: no routes sent
    int64_t canary_groups = 0;
    double canary_pass = std::numeric_limits<double>::quiet_NaN();  // NaN: no canaries sampled
    std::vector<std::string> outlier;  // names of the statistics flagged
  };

  void Add(const std::string& worker, const GroupSummary& g);
  // Every worker's canary tallies so far (they replace the previous ones).
  void SetCanaries(std::map<std::string, CanaryTally> tallies) { canaries_ = std::move(tallies); }
  // Every worker's row, outlier flags included.
  std::map<std::string, Row> Rows() const;
  // Rows() as metrics.jsonl's actor_stats object ("outlier" only where a statistic is flagged).
  nlohmann::json ToJson() const;

 private:
  struct Sums {
    int64_t groups = 0, zero_spread = 0, routes = 0, routes_same = 0;
    double reward = 0, length = 0, gap = 0;
  };
  // Sets each canary worker's canary_pass and flags those the rule above finds.
  void FlagCanaries(std::map<std::string, Row>& rows) const;
  std::map<std::string, Sums> sums_;
  std::map<std::string, CanaryTally> canaries_;
};

}  // namespace echelon::learn
