// StalenessControl: `rl.staleness: auto`, a staleness bound S the run chooses itself. After
// every update it sees the batch's staleness health and whether the learner waited for
// rollouts, and moves S the way TCP moves its window (additive increase, multiplicative
// decrease):
//   - stale data hurting: the importance weights' ESS fraction (pi_prox / pi_behav over the
//     batch's tokens, learn/grpo.h) averaged over the last `window` updates is below ess_min:
//     S halves (never below min). Halving, because a hurt run must get fresh data soon.
//   - the learner starved: its busy share (train / (train + wait)) over the last `window`
//     updates is below busy_target and the health is good: S grows by one (never above max).
//     One at a time, because each step lets the rollout plane run one batch further ahead.
// Every change starts a new window, so the next decision sees only updates under the new S
// (groups admitted under a larger S keep their own bound, sched/dispatcher.h, and drain in
// about S updates; the window lets most of them go).
//
// The learning rate follows S: the bias of stale data grows with S x lr (the step a policy
// moved since the data was drawn), so above the starting S (at least 1) lr is scaled by
// start / S, which holds S x lr at its starting value; at or below it lr is the configured one
// (`couple_lr` false leaves lr alone).
//
//   StalenessControl c({.start = 4, .max = 64});
//   if (auto change = c.Observe({ess_frac, train_s, wait_s})) { ...apply change->to, log change->reason... }
//   learner.SetLearningRate(base_lr * c.LrScale());
//
// Thread contract: not thread-safe; owned by the learner loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::sched {

struct StalenessControlOptions {
  int64_t start = 4;         // S at the first update
  int64_t min = 0;
  int64_t max = 64;
  double ess_min = 0.9;      // below this mean ESS fraction stale data is taken to hurt
  double busy_target = 0.95; // below this busy share the learner waits for rollouts
  int64_t window = 4;        // updates per decision (and after every change)
  bool couple_lr = true;     // lr x start / S above the starting S
};

// What one update showed.
struct StalenessObservation {
  double ess_frac = 1;  // of the batch's importance weights
  double train_s = 0;   // the update
  double wait_s = 0;    // waiting for its batch
};

struct StalenessChange {
  int64_t from = 0, to = 0;
  std::string reason;  // e.g. "ess_frac 0.82 < 0.9 over 4 updates"
};

class StalenessControl {
 public:
  explicit StalenessControl(const StalenessControlOptions& options);

  // Records one update; a change of S when the window is full and a rule fires.
  std::optional<StalenessChange> Observe(const StalenessObservation& o);
  int64_t staleness() const { return staleness_; }
  // The factor on the configured learning rate at the current S (1 at or below the start).
  double LrScale() const;
  const StalenessControlOptions& options() const { return options_; }

  // For a checkpoint: S and the current window, so a resumed run decides as an unbroken one.
  nlohmann::json Export() const;
  // Errors name `where` and the field; an S outside [min, max] is refused.
  Status Restore(const nlohmann::json& j, const std::string& where);

 private:
  StalenessControlOptions options_;
  int64_t staleness_;
  int64_t seen_ = 0;  // updates in the current window
  double ess_sum_ = 0, train_sum_ = 0, wait_sum_ = 0;
};

}  // namespace echelon::sched
