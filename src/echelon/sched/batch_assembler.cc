#include "echelon/sched/batch_assembler.h"

#include <algorithm>

#include "echelon/sched/staleness_gate.h"

namespace echelon::sched {

BatchAssembler::BatchAssembler(int64_t max_staleness, int64_t batch_groups, Dispatcher* dispatcher)
    : max_staleness_(max_staleness), batch_groups_(batch_groups), dispatcher_(dispatcher) {}

void BatchAssembler::Add(uint64_t group_id, int64_t behavior_version) {
  waiting_.insert({behavior_version, group_id});
}

IntakeDecision BatchAssembler::Assemble(int64_t step) {
  IntakeDecision d;
  d.step = step;
  const StalenessGate gate(max_staleness_);
  while (!waiting_.empty() && !gate.Admits(waiting_.begin()->first, step)) {
    const auto [version, group] = *waiting_.begin();
    waiting_.erase(waiting_.begin());
    if (dispatcher_ != nullptr) dispatcher_->Settle(group, Outcome::kDroppedStale);
    d.dropped.push_back({group, version});
  }
  if (static_cast<int64_t>(waiting_.size()) >= batch_groups_) {
    for (int64_t i = 0; i < batch_groups_; ++i) {
      const auto [version, group] = *waiting_.begin();
      waiting_.erase(waiting_.begin());
      d.batch.push_back({group, version});
    }
    std::sort(d.batch.begin(), d.batch.end(),
              [](const IntakeGroup& a, const IntakeGroup& b) { return a.group_id < b.group_id; });
  }
  if (observer_ && (!d.dropped.empty() || !d.batch.empty())) observer_(d);
  return d;
}

void BatchAssembler::Commit(const IntakeDecision& decision) {
  if (dispatcher_ == nullptr) return;
  for (const IntakeGroup& g : decision.batch) dispatcher_->Settle(g.group_id, Outcome::kConsumed);
}

}  // namespace echelon::sched
