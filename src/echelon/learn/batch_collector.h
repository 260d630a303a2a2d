// BatchCollector: the first step of every learner update. It waits for submitted groups
// (ArrivalQueue), applies the consume rule (sched::BatchAssembler: drop t - x > S, then the B
// oldest groups), and on every pass, a batch ready or not, keeps the dispatcher honest: expired
// leases and silent actors are re-issued. It gives up when nothing arrives for stall_timeout_seconds.
//
// Dynamic sampling (DAPO; rl.dynamic_sampling): a group whose episodes all have the same reward
// (the task's score, before any shaping) teaches nothing, so it is settled as filtered when it
// arrives and never waits for a batch; its admission slot goes to a new prompt, so the batch
// fills with groups that have a spread, within the same staleness bound. After
// max_filtered_per_batch x B such groups for one update (a task the policy has mastered, or
// cannot start on) zero-spread groups enter the batch again, with a warning, rather than the
// run drawing prompts forever.
//
// All waiting is on the injected Clock and the queue's Drain timeout, so a test runs the
// collector on simulated time (learn/intake_equivalence_test.cc feeds it the simulator's
// arrivals and gets the simulator's decisions).
//
//   BatchCollector collector(options, &dispatcher, &intake, &transport, &clock);
//   ECHELON_ASSIGN_OR_RETURN(std::optional<CollectedBatch> b, collector.Collect(t, &interrupted));
//   if (!b) break;                       // interrupted
//   ... update ...;  collector.Commit(*b);
//
// Thread contract: owned by the learner thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/sched/batch_assembler.h"
#include "echelon/sched/tunables.h"

namespace echelon::learn {

struct CollectorOptions {
  int64_t max_staleness = 0;  // S
  int64_t batch_groups = 1;   // B
  double stall_timeout_seconds = sched::kDefaultStallTimeoutSeconds;
  double poll_seconds = sched::kLearnerPollSeconds;
  bool dynamic_sampling = false;
  int64_t max_filtered_per_batch = 8;  // x B groups filtered for one update, then none more
};

// The groups of one update, in group-id order, and the rule's decision that chose them.
struct CollectedBatch {
  sched::IntakeDecision decision;
  std::vector<contract::GroupRollout> groups;
  double wait_seconds = 0;  // from the start of Collect until the batch was there
  int64_t filtered = 0;     // groups dynamic sampling dropped while this batch was collected
};

// Whether every episode of `g` has the same reward (no advantage anywhere in the group).
bool ZeroSpread(const contract::GroupRollout& g);

class BatchCollector {
 public:
  // `evict_silent` returns the actors gone silent (may be empty); the dispatcher re-issues
  // their groups. Every pointer outlives the collector.
  BatchCollector(const CollectorOptions& options, sched::Dispatcher* dispatcher, ArrivalQueue* arrivals,
                 std::function<std::vector<std::string>()> evict_silent, const Clock* clock);

  // The batch for update `step`; nullopt when `interrupt` was raised first; Aborted after
  // stall_timeout_seconds without an arrival.
  Result<std::optional<CollectedBatch>> Collect(int64_t step, const std::atomic<bool>* interrupt);
  // The update on `batch` succeeded: its groups are consumed.
  void Commit(const CollectedBatch& batch) { assembler_.Commit(batch.decision); }

  sched::BatchAssembler& assembler() { return assembler_; }

 private:
  const CollectorOptions options_;
  sched::Dispatcher* dispatcher_;
  ArrivalQueue* arrivals_;
  std::function<std::vector<std::string>()> evict_silent_;
  const Clock* clock_;
  sched::BatchAssembler assembler_;
  std::map<uint64_t, contract::GroupRollout> waiting_;  // the assembler's groups, by id
  double last_arrival_;
  int64_t filtered_ = 0;  // since the last batch
  bool warned_ = false;   // the filter limit was reached (said once)
};

}  // namespace echelon::learn
