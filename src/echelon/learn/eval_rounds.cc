#include "echelon/learn/eval_rounds.h"

#include <algorithm>

namespace echelon::learn {

namespace {
const RealClock kRealClock;
}  // namespace

double PassAtK(int64_t n, int64_t c, int64_t k) {
  // C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i); zero when fewer than k failed.
  if (n - c < k) return 1.0;
  double none = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) none *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - none;
}

EvalRounds::EvalRounds(std::vector<EvalSet> sets, const EvalRoundsOptions& options, const Clock* clock)
    : sets_(std::move(sets)), options_(options), clock_(clock != nullptr ? clock : &kRealClock) {}

void EvalRounds::Open(const contract::Snapshot& snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Round& r : rounds_)
    if (r.snapshot.version == snapshot.version) return;
  Round round;
  round.snapshot = snapshot;
  round.opened_at = clock_->Now();
  const int64_t index = static_cast<int64_t>(rounds_.size());
  for (size_t s = 0; s < sets_.size(); ++s) {
    const size_t n = sets_[s].task->HeldOut().size();
    round.successes.emplace_back(n, -1);
    for (size_t p = 0; p < n; ++p) {
      const uint64_t id = kEvalGroupBit | next_id_++;
      Item& item = items_[id];
      item.round = index;
      item.set = s;
      item.prompt = p;
      queue_.push_back(id);
      ++round.missing;
    }
  }
  rounds_.push_back(std::move(round));
}

void EvalRounds::ExpireLocked() {
  const double now = clock_->Now();
  std::vector<uint64_t> back;
  for (auto& [id, item] : items_)
    if (item.lease_id != 0 && now > item.deadline) {
      item.lease_id = 0;
      item.actor.clear();
      back.push_back(id);
      ++reissued_;
    }
  // Items whose lease ended go first, oldest id first.
  queue_.insert(queue_.begin(), back.begin(), back.end());
}

std::optional<EvalRounds::Handed> EvalRounds::Acquire(const std::string& actor, int64_t held_version) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked();
  for (auto q = queue_.begin(); q != queue_.end();) {
    auto it = items_.find(*q);
    if (it == items_.end() || it->second.lease_id != 0) {  // recorded, or handed meanwhile
      q = queue_.erase(q);
      continue;
    }
    if (held_version >= 0 && rounds_[static_cast<size_t>(it->second.round)].snapshot.version != held_version) {
      ++q;
      continue;
    }
    queue_.erase(q);
    const uint64_t id = it->first;
    Item& item = it->second;
    item.lease_id = next_lease_++;
    item.actor = actor;
    item.handed_at = clock_->Now();
    item.deadline = item.handed_at + options_.lease_seconds;
    const EvalSet& set = sets_[item.set];
    return Handed{id, item.lease_id, rounds_[static_cast<size_t>(item.round)].snapshot.version, &set,
                  set.task->HeldOut()[item.prompt]};
  }
  return std::nullopt;
}

EvalRounds::Item* EvalRounds::FindLocked(uint64_t id, uint64_t lease_id, const std::string& actor) {
  ExpireLocked();
  auto it = items_.find(id);
  if (it == items_.end() || lease_id == 0 || it->second.lease_id != lease_id || it->second.actor != actor)
    return nullptr;
  return &it->second;
}

std::optional<EvalRounds::Handed> EvalRounds::Holder(uint64_t id, uint64_t lease_id, const std::string& actor) {
  std::lock_guard<std::mutex> lock(mu_);
  const Item* item = FindLocked(id, lease_id, actor);
  if (item == nullptr) return std::nullopt;
  const EvalSet& set = sets_[item->set];
  return Handed{id, lease_id, rounds_[static_cast<size_t>(item->round)].snapshot.version, &set,
                set.task->HeldOut()[item->prompt]};
}

void EvalRounds::Record(uint64_t id, uint64_t lease_id, const std::string& actor, int64_t successes) {
  std::lock_guard<std::mutex> lock(mu_);
  const Item* item = FindLocked(id, lease_id, actor);
  if (item == nullptr) return;
  Round& round = rounds_[static_cast<size_t>(item->round)];
  const EvalSet& set = sets_[item->set];
  round.successes[item->set][item->prompt] = std::clamp<int64_t>(successes, 0, set.k);
  items_.erase(id);
  if (--round.missing > 0) return;
  for (size_t s = 0; s < sets_.size(); ++s) {
    EvalSetResult r{sets_[s].name, round.snapshot.version, static_cast<int64_t>(round.successes[s].size()), sets_[s].k};
    for (int64_t c : round.successes[s]) {
      r.mean_at_k += static_cast<double>(c) / static_cast<double>(r.k);
      r.pass_at_k += PassAtK(r.k, c, r.k);
    }
    if (r.prompts > 0) {
      r.mean_at_k /= static_cast<double>(r.prompts);
      r.pass_at_k /= static_cast<double>(r.prompts);
    }
    r.seconds = clock_->Now() - round.opened_at;
    finished_.push_back(std::move(r));
  }
  round.snapshot = contract::Snapshot{round.snapshot.version, nullptr, nullptr};  // its bytes are no longer needed
}

void EvalRounds::Requeue(uint64_t id, uint64_t lease_id, const std::string& actor) {
  std::lock_guard<std::mutex> lock(mu_);
  Item* item = FindLocked(id, lease_id, actor);
  if (item == nullptr) return;
  item->lease_id = 0;
  item->actor.clear();
  queue_.push_front(id);
  ++reissued_;
}

void EvalRounds::Renew(uint64_t id, uint64_t lease_id, const std::string& actor) {
  std::lock_guard<std::mutex> lock(mu_);
  Item* item = FindLocked(id, lease_id, actor);
  if (item == nullptr) return;
  item->deadline = std::min(clock_->Now() + options_.lease_seconds,
                            item->handed_at + options_.max_lease_life_factor * options_.lease_seconds);
}

contract::Snapshot EvalRounds::Pinned(int64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Round& r : rounds_)
    if (r.snapshot.version == version && r.snapshot.weights) return r.snapshot;
  return contract::Snapshot{};
}

std::vector<EvalSetResult> EvalRounds::TakeFinished() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<EvalSetResult> out;
  out.swap(finished_);
  return out;
}

int64_t EvalRounds::open_rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Round& r : rounds_) n += r.missing > 0 ? 1 : 0;
  return n;
}

int64_t EvalRounds::reissued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reissued_;
}

}  // namespace echelon::learn
