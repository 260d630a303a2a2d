#include "echelon/sched/dispatcher.h"

#include <algorithm>

namespace echelon::sched {

Dispatcher::Dispatcher(const DispatcherOptions& options, const Clock* clock)
    : options_(options), clock_(clock), max_staleness_(options.max_staleness) {}

std::string WorkerName(const std::string& actor_id) { return actor_id.substr(0, actor_id.find('#')); }

std::map<std::string, int64_t> TokensByFate(const DispatchCounts& c) {
  return {{"consumed", static_cast<int64_t>(c.tokens_consumed)}, {"stale", static_cast<int64_t>(c.tokens_stale)},
          {"filtered", static_cast<int64_t>(c.tokens_filtered)}, {"preempted", static_cast<int64_t>(c.tokens_preempted)},
          {"refused", static_cast<int64_t>(c.tokens_refused)}};
}

std::optional<WorkItem> Dispatcher::Acquire(const std::string& actor, int64_t held_version) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked();
  const std::string worker = WorkerName(actor);
  if (auto held = worker_leases_.find(worker);
      options_.max_leases_per_worker > 0 && held != worker_leases_.end() && held->second >= options_.max_leases_per_worker) {
    ++lease_capped_;
    capped_workers_.insert(worker);
    return std::nullopt;
  }
  WorkItem item;
  if (options_.lookahead > 0) {
    std::optional<std::pair<uint64_t, bool>> chosen = ChooseLocked(worker, held_version);
    if (!chosen) return std::nullopt;
    item.group_id = chosen->first;
    item.reissue = chosen->second;
    if (!item.reissue) admitted_staleness_[item.group_id] = max_staleness_;
  } else if (!reissue_queue_.empty()) {
    item.group_id = reissue_queue_.front();
    item.reissue = true;
    reissue_queue_.pop_front();
  } else if (CapacityLocked() > 0) {
    item.group_id = next_group_++;
    admitted_staleness_[item.group_id] = max_staleness_;
  } else {
    return std::nullopt;
  }
  item.lease_id = next_lease_++;
  item.dispatch_version = version_;
  const double now = clock_->Now();
  running_[item.group_id] = Lease{item.lease_id, actor, now + options_.lease_seconds, now, version_};
  // What the learner kept of a re-issued group is lost unless the new hand-out Carries it.
  if (auto kept = kept_waiting_.find(item.group_id); kept != kept_waiting_.end()) {
    counts_.tokens_preempted += static_cast<uint64_t>(kept->second);
    carriable_[item.group_id] = kept->second;
    kept_waiting_.erase(kept);
  }
  ++worker_leases_[worker];
  ++counts_.handed_out;
  return item;
}

SubmitResult Dispatcher::Submit(uint64_t group_id, uint64_t lease_id, const std::string& actor, int64_t tokens,
                                int64_t behavior_version) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked();
  // A count no group can hold is not counted (it comes from the worker).
  if (tokens < 0 || (options_.max_group_tokens > 0 && tokens > options_.max_group_tokens)) tokens = 0;
  if (group_id >= next_group_) return RefuseLocked(SubmitResult::kUnknownGroup);
  auto run = running_.find(group_id);
  if (run != running_.end()) {
    if (run->second.lease_id != lease_id) return RefuseLocked(SubmitResult::kNotLeaseHolder, tokens);
    if (run->second.actor != actor) return RefuseLocked(SubmitResult::kForeignLease);
    // A version the worker claims is checked elsewhere; here it only moves its own lag, and a
    // lie about it can only lose the worker work.
    // A resumed group's version is its prefix's, drawn by another worker: no lag of this one's.
    const double lag = behavior_version >= 0 && behavior_version <= run->second.version && run->second.carried == 0
                           ? static_cast<double>(run->second.version - behavior_version)
                           : -1.0;
    std::pair<double, int64_t>& held = held_[WorkerName(actor)];
    held.first += clock_->Now() - run->second.handed_at;
    ++held.second;
    forecast_.ObserveGroup(WorkerName(actor), PromptKey(group_id),
                           static_cast<double>(std::max<int64_t>(0, tokens - run->second.carried)),
                           clock_->Now() - run->second.handed_at, lag);
    if (run->second.carried > 0) pending_carried_[group_id] = run->second.carried;
    EndLeaseLocked(run);
    pending_[group_id] = lease_id;
    pending_tokens_[group_id] = tokens;
    return SubmitResult::kAccepted;
  }
  // Not running: pending, settled, or waiting for re-issue. Only the lease that already
  // submitted is told "already settled"; any other lease lost the group to a re-issue.
  auto pending = pending_.find(group_id);
  auto settled = settled_.find(group_id);
  const bool same_lease = (pending != pending_.end() && pending->second == lease_id) ||
                          (settled != settled_.end() && settled->second == lease_id);
  return same_lease ? RefuseLocked(SubmitResult::kAlreadySettled) : RefuseLocked(SubmitResult::kNotLeaseHolder, tokens);
}

bool Dispatcher::Renew(uint64_t group_id, uint64_t lease_id, const std::string& actor, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked();
  auto run = running_.find(group_id);
  if (run == running_.end()) return false;
  Lease& lease = run->second;
  if (lease.lease_id != lease_id || lease.actor != actor || tokens <= lease.tokens) return false;
  if (options_.max_group_tokens > 0 && tokens > options_.max_group_tokens) return false;
  lease.tokens = tokens;
  const double life_end = lease.handed_at + options_.max_lease_life_factor * options_.lease_seconds;
  lease.deadline = std::max(lease.deadline, std::min(clock_->Now() + options_.lease_seconds, life_end));
  ++renewals_;
  return true;
}

bool Dispatcher::Holds(uint64_t group_id, uint64_t lease_id, const std::string& actor) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto run = running_.find(group_id);
  return run != running_.end() && run->second.lease_id == lease_id && run->second.actor == actor &&
         clock_->Now() <= run->second.deadline;
}

void Dispatcher::KeepPrefix(uint64_t group_id, uint64_t lease_id, int64_t tokens, int64_t oldest_version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto run = running_.find(group_id);
  if (run == running_.end() || run->second.lease_id != lease_id || tokens < run->second.carried) return;
  if (options_.max_group_tokens > 0 && tokens > options_.max_group_tokens) return;
  run->second.kept = tokens;
  if (oldest_version >= 0) kept_oldest_[group_id] = oldest_version;
}

void Dispatcher::Carry(uint64_t group_id, uint64_t lease_id, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto run = running_.find(group_id);
  auto carriable = carriable_.find(group_id);
  if (run == running_.end() || run->second.lease_id != lease_id || carriable == carriable_.end() || tokens <= 0) return;
  tokens = std::min(tokens, carriable->second);
  carriable_.erase(carriable);
  counts_.tokens_preempted -= static_cast<uint64_t>(tokens);
  ++counts_.resumed;
  counts_.tokens_carried += static_cast<uint64_t>(tokens);
  run->second.carried = run->second.kept = tokens;
}

void Dispatcher::Reissue(uint64_t group_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.erase(group_id) == 0) return;
  // The prefix it continued from is still the learner's, and waits with the group.
  int64_t carried = 0;
  if (auto it = pending_carried_.find(group_id); it != pending_carried_.end()) {
    carried = it->second;
    kept_waiting_[group_id] = carried;
    pending_carried_.erase(it);
  }
  counts_.tokens_refused += static_cast<uint64_t>(std::max<int64_t>(0, pending_tokens_[group_id] - carried));
  pending_tokens_.erase(group_id);
  reissue_queue_.push_back(group_id);
  ++counts_.reissued;
}

void Dispatcher::Settle(uint64_t group_id, Outcome outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(group_id);
  if (it == pending_.end()) return;
  settled_[group_id] = it->second;
  pending_.erase(it);
  admitted_staleness_.erase(group_id);
  const auto tokens = static_cast<uint64_t>(pending_tokens_[group_id]);
  pending_tokens_.erase(group_id);
  pending_carried_.erase(group_id);
  kept_oldest_.erase(group_id);
  switch (outcome) {
    case Outcome::kConsumed: ++counts_.consumed, counts_.tokens_consumed += tokens; break;
    case Outcome::kDroppedStale: ++counts_.dropped_stale, counts_.tokens_stale += tokens; break;
    case Outcome::kFiltered: ++counts_.filtered, counts_.tokens_filtered += tokens; break;
  }
}

bool Dispatcher::Release(uint64_t group_id, uint64_t lease_id, const std::string& actor) {
  std::lock_guard<std::mutex> lock(mu_);
  auto run = running_.find(group_id);
  if (run == running_.end() || run->second.lease_id != lease_id || run->second.actor != actor) return false;
  ReissueLocked(run);
  return true;
}

int Dispatcher::Evict(const std::string& actor) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked();
  int evicted = 0;
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->second.actor == actor) {
      ReissueLocked(it);
      ++evicted;
    }
    it = next;
  }
  return evicted;
}

int Dispatcher::ExpireLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  return ExpireLeasesLocked();
}

void Dispatcher::SetVersion(int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  if (version > version_) forecast_.ObserveVersion(version, clock_->Now());
  version_ = std::max(version_, version);
}

std::map<std::string, double> Dispatcher::WorkerGroupSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, double> out;
  for (const auto& [worker, held] : held_) out[worker] = held.first / static_cast<double>(held.second);
  return out;
}

std::optional<double> Dispatcher::PredictSeconds(const std::string& actor, uint64_t group_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return forecast_.GroupSeconds(WorkerName(actor), PromptKey(group_id));
}

uint64_t Dispatcher::PromptKey(uint64_t group_id) const {
  return options_.prompt_key ? options_.prompt_key(group_id) : group_id;
}

std::optional<std::pair<uint64_t, bool>> Dispatcher::ChooseLocked(const std::string& worker, int64_t held_version) {
  const bool admit = CapacityLocked() > 0;
  while (admit && static_cast<int64_t>(drawn_.size()) < options_.lookahead) drawn_.push_back(next_group_++);
  // Candidates in order of waiting: re-issues (no admission needed), then the drawn ones.
  std::vector<std::pair<uint64_t, bool>> candidates;
  for (uint64_t g : reissue_queue_) candidates.emplace_back(g, true);
  if (admit)
    for (uint64_t g : drawn_) candidates.emplace_back(g, false);
  if (candidates.empty()) return std::nullopt;
  // The worker's lag: exact when it said which snapshot it holds (one newer than the learner's
  // is a lie that can only cost it work: taken as no lag).
  std::optional<double> lag;
  if (held_version >= 0) lag = static_cast<double>(std::max<int64_t>(0, version_ - held_version));
  std::optional<size_t> best;
  double best_slack = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const uint64_t g = candidates[i].first;
    if (passed_over_[g] >= kMaxPassOvers && forecast_.AmongTheFastest(worker)) {  // waited long enough
      best = i;
      break;
    }
    // A re-issue continued from what was kept of it: its remaining tokens, its oldest's deadline
    // (a prefix too old to be continued, oldest + S <= v, is dropped on hand-out: a fresh group).
    std::optional<CompletionForecast::Prefix> prefix;
    if (const auto kept = kept_waiting_.find(g); kept != kept_waiting_.end()) {
      const auto oldest = kept_oldest_.find(g);
      const int64_t behind = oldest != kept_oldest_.end() ? std::max<int64_t>(0, version_ - oldest->second) : 0;
      if (behind < max_staleness_)
        prefix = CompletionForecast::Prefix{static_cast<double>(kept->second), static_cast<double>(behind)};
    }
    const double slack = forecast_.Slack(worker, PromptKey(g), max_staleness_, clock_->Now(), lag, prefix);
    if (slack >= 0 && (!best || slack < best_slack)) best = i, best_slack = slack;
  }
  for (size_t i = 0; i < candidates.size(); ++i)
    if (!best || i < *best) ++passed_over_[candidates[i].first];
  if (!best) {
    ++counts_.predicted_late;
    return std::nullopt;
  }
  const auto [group, reissue] = candidates[*best];
  passed_over_.erase(group);
  std::deque<uint64_t>& from = reissue ? reissue_queue_ : drawn_;
  from.erase(std::find(from.begin(), from.end(), group));
  return candidates[*best];
}

int64_t Dispatcher::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

void Dispatcher::SetMaxStaleness(int64_t max_staleness) {
  std::lock_guard<std::mutex> lock(mu_);
  max_staleness_ = max_staleness;
}

int64_t Dispatcher::max_staleness() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_staleness_;
}

int64_t Dispatcher::AdmittedStaleness(uint64_t group_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = admitted_staleness_.find(group_id);
  return it != admitted_staleness_.end() ? it->second : max_staleness_;
}

int64_t Dispatcher::Capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return CapacityLocked();
}

DispatchCounts Dispatcher::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  DispatchCounts c = counts_;
  c.outstanding = running_.size();
  c.pending = pending_.size();
  c.awaiting_reissue = reissue_queue_.size();
  return c;
}

DispatcherState Dispatcher::Export() const {
  std::lock_guard<std::mutex> lock(mu_);
  DispatcherState s;
  s.version = version_;
  s.next_group = next_group_;
  s.next_lease = next_lease_;
  s.counts = counts_;
  s.unsettled.assign(reissue_queue_.begin(), reissue_queue_.end());
  std::vector<uint64_t> live;
  for (const auto& [group, lease] : running_) live.push_back(group);
  for (const auto& [group, lease] : pending_) live.push_back(group);
  std::sort(live.begin(), live.end());
  s.unsettled.insert(s.unsettled.end(), live.begin(), live.end());
  s.counts.outstanding = running_.size();
  s.counts.pending = pending_.size();
  s.counts.awaiting_reissue = reissue_queue_.size();
  s.drawn.assign(drawn_.begin(), drawn_.end());
  return s;
}

Status Dispatcher::Restore(const DispatcherState& state, uint64_t lease_base) {
  std::vector<uint64_t> seen = state.unsettled;
  seen.insert(seen.end(), state.drawn.begin(), state.drawn.end());
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
    return DataLoss("dispatcher state lists a group twice among unsettled and drawn groups");
  if (!seen.empty() && seen.back() >= state.next_group)
    return DataLoss("dispatcher state lists group " + std::to_string(seen.back()) +
                    " as unsettled or drawn but only " + std::to_string(state.next_group) + " were ever drawn");
  if (state.version < 0) return DataLoss("dispatcher state has a negative version");
  const DispatchCounts& c = state.counts;
  // Every hand-out ended (consumed, dropped, filtered, re-issued) or is one of the unsettled
  // ones, which were outstanding or pending when saved.
  if (c.handed_out != c.consumed + c.dropped_stale + c.filtered + c.reissued + c.outstanding + c.pending ||
      c.outstanding + c.pending + c.awaiting_reissue != state.unsettled.size())
    return DataLoss("dispatcher counts do not add up (handed_out " + std::to_string(c.handed_out) + ")");
  std::lock_guard<std::mutex> lock(mu_);
  version_ = state.version;
  next_group_ = state.next_group;
  next_lease_ = std::max(state.next_lease, lease_base);
  counts_ = state.counts;
  counts_.reissued += c.outstanding + c.pending;
  counts_.outstanding = counts_.pending = counts_.awaiting_reissue = 0;
  running_.clear();
  worker_leases_.clear();
  pending_.clear();
  pending_tokens_.clear();
  settled_.clear();
  passed_over_.clear();
  kept_waiting_.clear();
  kept_oldest_.clear();
  carriable_.clear();
  pending_carried_.clear();
  reissue_queue_.assign(state.unsettled.begin(), state.unsettled.end());
  drawn_.assign(state.drawn.begin(), state.drawn.end());
  return Status::Ok();
}

int Dispatcher::ExpireLeasesLocked() {
  const double now = clock_->Now();
  int expired = 0;
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (now > it->second.deadline) {
      ReissueLocked(it);
      ++expired;
    }
    it = next;
  }
  return expired;
}

int64_t Dispatcher::CapacityLocked() const {
  const int64_t limit = (max_staleness_ + version_ + 1) * options_.batch_groups;
  const int64_t live = static_cast<int64_t>(counts_.consumed + pending_.size() + running_.size() +
                                            reissue_queue_.size());
  return std::max<int64_t>(0, limit - live);
}

void Dispatcher::EndLeaseLocked(std::map<uint64_t, Lease>::iterator it) {
  carriable_.erase(it->first);
  auto w = worker_leases_.find(WorkerName(it->second.actor));
  if (w != worker_leases_.end() && --w->second <= 0) worker_leases_.erase(w);
  running_.erase(it);
}

uint64_t Dispatcher::renewals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return renewals_;
}

uint64_t Dispatcher::lease_capped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_capped_;
}

std::set<std::string> Dispatcher::capped_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capped_workers_;
}

void Dispatcher::ReissueLocked(std::map<uint64_t, Lease>::iterator it) {
  // Progress counts this lease's own tokens; of them, those the learner keeps wait with the group.
  const Lease& lease = it->second;
  counts_.tokens_preempted += static_cast<uint64_t>(std::max<int64_t>(0, lease.tokens - (lease.kept - lease.carried)));
  if (lease.kept > 0) kept_waiting_[it->first] = lease.kept;
  reissue_queue_.push_back(it->first);
  EndLeaseLocked(it);
  ++counts_.reissued;
}

SubmitResult Dispatcher::RefuseLocked(SubmitResult why, int64_t tokens) {
  ++counts_.refused;
  counts_.tokens_refused += static_cast<uint64_t>(tokens);
  return why;
}

}  // namespace echelon::sched
