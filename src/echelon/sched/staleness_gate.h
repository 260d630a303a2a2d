// StalenessGate: the learner-side bound of the versioning contract. Building update
// t -> t+1, the learner may consume a rollout whose (oldest) behaviour version is x only if
// t - x <= S. S = 0 is exact synchronous on-policy training.
//
// Thread contract: immutable; safe for concurrent use.
#pragma once

#include <cstdint>

namespace echelon::sched {

class StalenessGate {
 public:
  explicit StalenessGate(int64_t max_staleness) : max_staleness_(max_staleness) {}
  int64_t max_staleness() const { return max_staleness_; }
  bool Admits(int64_t behavior_version, int64_t learner_step) const {
    return learner_step - behavior_version <= max_staleness_;
  }

 private:
  int64_t max_staleness_;
};

// The paper's default snapshot period kappa = S - 1, floored at 1: a snapshot published every
// kappa steps lags the learner by at most kappa - 1 versions, and one more version passes
// while a group is generated, so rollouts from the newest snapshot stay within S.
inline int64_t DefaultPublishPeriod(int64_t max_staleness) {
  return max_staleness - 1 > 1 ? max_staleness - 1 : 1;
}

}  // namespace echelon::sched
