#include "echelon/sched/batch_assembler.h"

#include <algorithm>
#include <cstddef>
#include <tuple>

namespace echelon::sched {

BatchAssembler::BatchAssembler(int64_t max_staleness, int64_t batch_groups, Dispatcher* dispatcher)
    : max_staleness_(max_staleness), batch_groups_(batch_groups), dispatcher_(dispatcher) {}

void BatchAssembler::Add(uint64_t group_id, int64_t behavior_version) {
  const int64_t admitted = dispatcher_ != nullptr ? dispatcher_->AdmittedStaleness(group_id) : max_staleness_;
  waiting_.push_back({behavior_version, group_id, admitted});
  sorted_ = false;
}

int64_t BatchAssembler::Deadline(const Waiting& w) const {
  return w.behavior_version + std::max(w.admitted_staleness, max_staleness_);
}

IntakeDecision BatchAssembler::Assemble(int64_t step) {
  IntakeDecision d;
  d.step = step;
  if (!sorted_) {
    std::sort(waiting_.begin(), waiting_.end(), [this](const Waiting& a, const Waiting& b) {
      return std::make_tuple(Deadline(a), a.behavior_version, a.group_id) <
             std::make_tuple(Deadline(b), b.behavior_version, b.group_id);
    });
    sorted_ = true;  // removing a prefix below keeps the order
  }
  size_t expired = 0;
  for (; expired < waiting_.size() && Deadline(waiting_[expired]) < step; ++expired) {
    const Waiting& w = waiting_[expired];
    if (dispatcher_ != nullptr) dispatcher_->Settle(w.group_id, Outcome::kDroppedStale);
    d.dropped.push_back({w.group_id, w.behavior_version});
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(expired));
  if (static_cast<int64_t>(waiting_.size()) >= batch_groups_) {
    for (int64_t i = 0; i < batch_groups_; ++i) d.batch.push_back({waiting_[i].group_id, waiting_[i].behavior_version});
    waiting_.erase(waiting_.begin(), waiting_.begin() + batch_groups_);
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
