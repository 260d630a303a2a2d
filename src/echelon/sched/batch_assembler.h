// BatchAssembler: the learner's consume rule, written once for the learner loop
// (learn/learner_run.h) and the simulator (plan/simulator.h), so both take the same
// decisions from the same arrivals.
//
// Submitted groups wait here. Building update t -> t+1 (Assemble(t)):
//   1. every waiting group with t - x > S (x its behaviour version) is dropped and settled
//      as dropped-stale in the dispatcher: it can never be used again;
//   2. once B groups are admissible, the B with the earliest deadlines x + S (then the lowest
//      behaviour version, then the lowest group id) form the batch, returned in group-id
//      order; the others wait.
// A group's S is the larger of the current one (SetMaxStaleness) and the one the dispatcher
// first handed it out under (Dispatcher::AdmittedStaleness), so lowering S never drops a group
// issued before; with one S throughout, earliest deadline is oldest first.
// Earliest deadline, not arrival order: a group stays usable until update x + S, its deadline.
// Taking the earliest deadlines first (EDF) drops the fewest groups: a younger group left
// waiting outlives an older one, so any order that leaves an older group behind can only
// lose more work to the staleness bound. The cost is a slightly higher mean staleness of
// consumed groups, which the bound S already allows. Group-id order inside the batch makes an
// update a function of its groups alone, whatever order they arrived in.
// The batch's groups are settled as consumed by Commit, after the update succeeded: groups
// of an update that failed stay pending and a resumed run re-issues them.
//
//   BatchAssembler intake(/*max_staleness=*/2, /*batch_groups=*/32, &dispatcher);
//   intake.Add(group_id, behavior_version);            // as groups arrive
//   IntakeDecision d = intake.Assemble(t);             // d.batch empty: wait for more
//   ... update on d.batch ...;  intake.Commit(d);
//
// Thread contract: not thread-safe; owned by the learner thread (or the simulation).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "echelon/sched/dispatcher.h"

namespace echelon::sched {

struct IntakeGroup {
  uint64_t group_id = 0;
  int64_t behavior_version = 0;
  bool operator==(const IntakeGroup& o) const {
    return group_id == o.group_id && behavior_version == o.behavior_version;
  }
};

// What one Assemble(step) decided.
struct IntakeDecision {
  int64_t step = 0;
  std::vector<IntakeGroup> dropped;  // settled dropped-stale, oldest first
  std::vector<IntakeGroup> batch;    // empty, or exactly B groups in group-id order
};

class BatchAssembler {
 public:
  // `dispatcher` may be null (then nothing is settled; tests of the rule alone).
  BatchAssembler(int64_t max_staleness, int64_t batch_groups, Dispatcher* dispatcher);
  BatchAssembler(const BatchAssembler&) = delete;
  BatchAssembler& operator=(const BatchAssembler&) = delete;

  // A group the dispatcher accepted from its lease holder; it waits for the learner.
  void Add(uint64_t group_id, int64_t behavior_version);
  // Drops what update `step` cannot use and, when B admissible groups wait, takes the batch.
  IntakeDecision Assemble(int64_t step);
  // The update on `decision.batch` is done: its groups are consumed.
  void Commit(const IntakeDecision& decision);

  size_t waiting() const { return waiting_.size(); }
  int64_t max_staleness() const { return max_staleness_; }
  void SetMaxStaleness(int64_t max_staleness) {
    max_staleness_ = max_staleness;
    sorted_ = false;
  }
  int64_t batch_groups() const { return batch_groups_; }
  // Every decision that dropped or took something, as it is made (traces and tests).
  void set_observer(std::function<void(const IntakeDecision&)> observer) { observer_ = std::move(observer); }

 private:
  struct Waiting {
    int64_t behavior_version;
    uint64_t group_id;
    int64_t admitted_staleness;  // S at the group's first hand-out
  };
  int64_t Deadline(const Waiting& w) const;  // the last update that may consume it

  int64_t max_staleness_;
  const int64_t batch_groups_;
  Dispatcher* const dispatcher_;
  std::vector<Waiting> waiting_;  // in deadline order while sorted_ (Assemble runs every poll)
  bool sorted_ = true;
  std::function<void(const IntakeDecision&)> observer_;
};

}  // namespace echelon::sched
