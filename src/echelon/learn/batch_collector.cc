#include "echelon/learn/batch_collector.h"

#include <spdlog/spdlog.h>

#include <cmath>

namespace echelon::learn {
namespace {

std::string FormatSeconds(double seconds) { return std::to_string(static_cast<int64_t>(std::lround(seconds))) + " s"; }

}  // namespace

bool ZeroSpread(const contract::GroupRollout& g) {
  for (const data::Episode& e : g.episodes)
    if (e.reward != g.episodes.front().reward) return false;
  return true;
}

BatchCollector::BatchCollector(const CollectorOptions& options, sched::Dispatcher* dispatcher, ArrivalQueue* arrivals,
                               std::function<std::vector<std::string>()> evict_silent, const Clock* clock)
    : options_(options),
      dispatcher_(dispatcher),
      arrivals_(arrivals),
      evict_silent_(std::move(evict_silent)),
      clock_(clock),
      assembler_(options.max_staleness, options.batch_groups, dispatcher),
      last_arrival_(clock->Now()) {}

Result<std::optional<CollectedBatch>> BatchCollector::Collect(int64_t step, const std::atomic<bool>* interrupt) {
  const double start = clock_->Now();
  double wait = 0;  // first take what arrived during the update, without waiting
  while (true) {
    // First, not only while waiting: a learner that never waits must still stop when told.
    if (interrupt != nullptr && interrupt->load()) return std::optional<CollectedBatch>();
    std::vector<contract::GroupRollout> got = arrivals_->Drain(wait);
    ECHELON_RETURN_IF_ERROR(arrivals_->failure());
    wait = options_.poll_seconds;
    if (!got.empty()) last_arrival_ = clock_->Now();
    for (contract::GroupRollout& g : got) {
      if (options_.dynamic_sampling && ZeroSpread(g)) {
        if (filtered_ < options_.max_filtered_per_batch * options_.batch_groups) {
          dispatcher_->Settle(g.group_id, sched::Outcome::kFiltered);
          ++filtered_;
          continue;
        }
        if (!warned_) {
          spdlog::warn("dynamic sampling: {} groups without a reward spread for one update (rl.dynamic_sampling_max "
                       "x rl.groups_per_step); such groups now enter the batch of that update (trained at zero advantage)",
                       filtered_);
          warned_ = true;
        }
      }
      assembler_.Add(g.group_id, g.behavior_version);
      const uint64_t id = g.group_id;
      waiting_[id] = std::move(g);
    }
    // Every pass, not only while waiting: with a batch always ready (actors faster than the
    // learner) a dead actor's leases must still be re-issued.
    dispatcher_->ExpireLeases();
    if (evict_silent_)
      for (const std::string& id : evict_silent_()) dispatcher_->Evict(id);
    sched::IntakeDecision d = assembler_.Assemble(step);
    for (const sched::IntakeGroup& g : d.dropped) waiting_.erase(g.group_id);
    if (!d.batch.empty()) {
      CollectedBatch b;
      for (const sched::IntakeGroup& g : d.batch) {
        auto it = waiting_.find(g.group_id);
        b.groups.push_back(std::move(it->second));
        waiting_.erase(it);
      }
      b.decision = std::move(d);
      b.wait_seconds = clock_->Now() - start;
      b.filtered = filtered_;
      filtered_ = 0;
      return std::optional<CollectedBatch>(std::move(b));
    }
    if (clock_->Now() - last_arrival_ > options_.stall_timeout_seconds)
      return Aborted("no rollout arrived for " + FormatSeconds(options_.stall_timeout_seconds) +
                     " (rollout.stall_timeout_seconds); every actor is failing or stuck");
  }
}

}  // namespace echelon::learn
