// The simulated fleet: workers' lives (boot, failure, return), the learner's activation loop
// (re-activation at the current prices, make-before-break retirement) and price changes.
#include <algorithm>
#include <cmath>

#include "echelon/plan/simulation.h"

namespace echelon::plan::sim {

void Simulation::SetBilled(Worker& w, bool on) {
  const double rate = Cls(w).price_per_hour / 3600;
  spend_per_second_ += on ? rate : -rate;
  billed_count_ += on ? 1 : -1;
  billed_by_class_[w.cls] += on ? 1 : -1;
  result_.peak_workers = std::max(result_.peak_workers, billed_count_);
}

Status Simulation::CreateWorkers() {
  spend_per_second_ = plan_.inputs.learner_price_per_hour / 3600;
  std::vector<int64_t> instances, active;
  for (const WorkerClass& k : plan_.classes) {
    instances.push_back(k.available);
    active.push_back(k.count);
  }
  if (fixed_workers_ > 0) active = SpreadFixed(fixed_workers_, &instances);
  for (size_t j = 0; j < instances.size(); ++j) {
    for (int64_t i = 0; i < instances[j]; ++i) {
      Worker w;
      w.cls = static_cast<int>(j);
      workers_.push_back(w);
      if (i < active[j]) {
        const int id = static_cast<int>(workers_.size()) - 1;
        BeginEpoch(id, WorkerState::kActive);
        Worker& x = workers_[id];
        x.held = 0;
        x.free_slots = Cls(x).decode.slots;
        idle_.insert(id);
      }
    }
  }
  result_.initial_workers = billed_count_;
  target_ = active;
  std::vector<int64_t> available(plan_.classes.size(), 0);
  for (const Worker& w : workers_) ++available[w.cls];
  const std::vector<WorkerOffer> offers = ActivationOffers(plan_, available);
  for (size_t j = 0; j < offers.size(); ++j) rate_[j] = offers[j].rate;
  return billed_count_ > 0 ? Status::Ok() : FailedPrecondition(cfg_.path + ": no worker is active at the start");
}

std::vector<int64_t> Simulation::SpreadFixed(int64_t n, std::vector<int64_t>* instances) {
  std::vector<int64_t> usable(instances->size(), 0);
  int64_t total = 0;
  for (size_t j = 0; j < usable.size(); ++j)
    if (plan_.classes[j].decode.feasible) total += usable[j] = std::max<int64_t>(1, (*instances)[j]);
  std::vector<int64_t> active(usable.size(), 0);
  if (total == 0) return active;
  int64_t given = 0;
  std::vector<std::pair<double, size_t>> remainders;
  for (size_t j = 0; j < usable.size(); ++j) {
    const double share = static_cast<double>(n) * usable[j] / total;
    active[j] = static_cast<int64_t>(std::floor(share));
    given += active[j];
    if (usable[j] > 0) remainders.push_back({share - active[j], j});
  }
  std::sort(remainders.rbegin(), remainders.rend());
  for (size_t r = 0; given < n; r = (r + 1) % remainders.size(), ++given) ++active[remainders[r].second];
  for (size_t j = 0; j < active.size(); ++j) (*instances)[j] = std::max((*instances)[j], active[j]);
  return active;
}

void Simulation::BeginEpoch(int id, WorkerState state) {
  Worker& w = workers_[id];
  ++w.epoch;
  w.actor = "w" + std::to_string(id) + "." + std::to_string(w.epoch);
  w.state = state;
  w.downloading = false;
  w.draining = false;
  w.wanted = -1;
  w.waiting.clear();
  w.running.clear();
  SetBilled(w, true);
  const double f = Cls(w).failures_per_hour / 3600;
  if (f > 0) {
    std::exponential_distribution<double> life(f);
    const double fails = now_ + life(rng_);
    Push({fails, 0, EventType::kFail, id, w.epoch});
    const double notice = Cls(w).preemption_notice_seconds;
    if (notice > 0) Push({std::max(now_, fails - notice), 0, EventType::kNotice, id, w.epoch});
  }
}

std::map<std::string, int64_t> Simulation::BilledByClass() const {
  std::map<std::string, int64_t> out;
  for (size_t j = 0; j < plan_.classes.size(); ++j) out[plan_.classes[j].name] = billed_by_class_[j];
  return out;
}

void Simulation::ApplyPriceChanges() {
  const std::vector<PriceChange>& changes = cfg_.sim.price_changes;
  while (next_price_change_ < changes.size() && changes[next_price_change_].at_step <= version_) {
    const PriceChange& pc = changes[next_price_change_++];
    PriceChangeRecord rec;
    rec.at_step = pc.at_step;
    rec.time = now_;
    rec.gpu = pc.gpu;
    rec.price_per_hour = pc.price_per_hour;
    rec.billed_before = BilledByClass();
    for (size_t j = 0; j < plan_.classes.size(); ++j) {
      WorkerClass& k = plan_.classes[j];
      if (k.gpu != pc.gpu) continue;
      rec.classes.push_back(k.name);
      spend_per_second_ += billed_by_class_[j] * (pc.price_per_hour - k.price_per_hour) / 3600;
      k.price_per_hour = pc.price_per_hour;
    }
    if (Reactivating()) {
      const Activation a = Reactivate();
      rec.reactivated = true;
      rec.method = a.method;
      rec.feasible = a.feasible;
      rec.target_cost_per_hour = a.cost_per_hour;
      for (size_t j = 0; j < plan_.classes.size(); ++j) rec.target[plan_.classes[j].name] = a.counts[j];
    }
    result_.price_changes.push_back(rec);
  }
}

void Simulation::StopGroups(Worker& w, bool noticed) {
  for (const auto& [group, r] : w.running) {  // the part of each running group made so far
    const double done = std::clamp((now_ - r.start) / std::max(r.end - r.start, 1e-9), 0.0, 1.0);
    result_.tokens_generated += r.tokens * done;
    // With resumable groups, what it reported is kept: everything, when it had notice, else as of
    // its last report (every sched::kPrefixSeconds). The group continues from there if it is
    // handed out in time (StartGroup). Its lease still runs until the failure is detected or the
    // lease handed back: the dispatcher is told what is kept of it.
    const double reported = !cfg_.sim.resume ? 0.0
                            : noticed        ? 1.0
                                             : std::floor((now_ - r.start) / sched::kPrefixSeconds) *
                                                   sched::kPrefixSeconds / std::max(r.end - r.start, 1e-9);
    const double kept = r.tokens * std::min(reported, done);
    result_.tokens_preempted += r.tokens * done - kept;
    if (r.carried + kept > 0 && cfg_.sim.resume) {
      prefixes_[group] = {r.carried + kept, r.version};
      dispatcher_.KeepPrefix(group, r.lease, static_cast<int64_t>(std::llround(r.carried + kept)), r.version);
    }
  }
  w.running.clear();
}

// A preemption notice: the worker's actors stop at once, report what their groups drew and hand
// the leases back, so the groups go on elsewhere now; it takes no more work, and stays billed
// until it is gone.
void Simulation::OnNotice(const Event& e) {
  Worker& w = workers_[e.worker];
  if (e.epoch != w.epoch || w.state != WorkerState::kActive) return;
  StopGroups(w, /*noticed=*/true);
  dispatcher_.Evict(w.actor);
  w.waiting.clear();
  w.free_slots = 0;
  w.draining = true;
  idle_.erase(e.worker);
  Pump();
}

void Simulation::OnFail(const Event& e) {
  Worker& w = workers_[e.worker];
  if (e.epoch != w.epoch || !Billed(w)) return;
  ++result_.failures;
  SetBilled(w, false);
  Push({now_ + cfg_.sim.detect_seconds, 0, EventType::kEvict, e.worker, w.epoch});
  StopGroups(w, /*noticed=*/false);
  ++w.epoch;  // in-flight groups and downloads of this worker are lost
  w.state = WorkerState::kDown;
  w.waiting.clear();
  w.downloading = false;
  w.draining = false;
  w.free_slots = 0;
  idle_.erase(e.worker);
  Push({now_ + cfg_.sim.restart_seconds, 0, EventType::kReturn, e.worker, w.epoch});
  if (Reactivating()) Reactivate();
}

void Simulation::OnReturn(int id) {
  Worker& w = workers_[id];
  if (w.state != WorkerState::kDown) return;
  w.state = WorkerState::kInactive;
  if (Reactivating()) {
    Reactivate();
  } else {
    Activate(id);  // fixed pool: the worker simply rejoins
  }
}

void Simulation::Activate(int id) {
  BeginEpoch(id, WorkerState::kStarting);
  ++result_.activations;
  Push({now_ + cfg_.sim.startup_seconds, 0, EventType::kReady, id, workers_[id].epoch});
}

void Simulation::OnReady(const Event& e) {
  Worker& w = workers_[e.worker];
  if (e.epoch != w.epoch || w.state != WorkerState::kStarting) return;
  w.state = WorkerState::kJoining;
  w.held = -1;
  RequestSnapshot(e.worker, published_);
}

Activation Simulation::Reactivate() {
  const size_t n = plan_.classes.size();
  std::vector<int64_t> available(n, 0), running(n, 0);
  for (const Worker& w : workers_) {
    if (w.state != WorkerState::kDown) ++available[w.cls];
    if (Billed(w) && !w.draining) ++running[w.cls];
  }
  const FreshActivation fresh = ActivateFresh(plan_, available, &running);
  const std::vector<WorkerOffer> offers = ActivationOffers(plan_, available);
  for (size_t j = 0; j < n; ++j) rate_[j] = offers[j].rate;
  const Activation& target = fresh.activation;
  target_ = target.counts;
  for (size_t id = 0; id < workers_.size(); ++id) {
    Worker& w = workers_[id];
    const size_t j = static_cast<size_t>(w.cls);
    if (w.draining && running[j] < target_[j]) {
      w.draining = false;
      if (w.free_slots > 0) idle_.insert(static_cast<int>(id));
      ++running[j];
    }
  }
  for (size_t id = 0; id < workers_.size(); ++id) {
    Worker& w = workers_[id];
    const size_t j = static_cast<size_t>(w.cls);
    if (w.state == WorkerState::kInactive && running[j] < target_[j]) {
      Activate(static_cast<int>(id));
      ++running[j];
    }
  }
  RetireSurplus();
  Pump();
  return target;
}

void Simulation::RetireSurplus() {
  const size_t n = plan_.classes.size();
  std::vector<int64_t> running(n, 0);
  double ready = 0;
  for (const Worker& w : workers_) {
    if (!Billed(w) || w.draining) continue;
    ++running[w.cls];
    if (w.state == WorkerState::kActive) ready += rate_[w.cls];
  }
  const double need = plan_.demand_groups_per_s * (1 - 1e-9);
  for (size_t id = 0; id < workers_.size(); ++id) {
    Worker& w = workers_[id];
    const size_t j = static_cast<size_t>(w.cls);
    if ((w.state == WorkerState::kStarting || w.state == WorkerState::kJoining) && running[j] > target_[j]) {
      Retire(static_cast<int>(id));
      --running[j];
    }
  }
  for (bool idle_pass : {true, false}) {
    for (size_t id = 0; id < workers_.size(); ++id) {
      Worker& w = workers_[id];
      const size_t j = static_cast<size_t>(w.cls);
      if (w.state != WorkerState::kActive || w.draining || running[j] <= target_[j]) continue;
      const bool idle = w.free_slots == Cls(w).decode.slots && w.waiting.empty();
      if (idle != idle_pass || ready - rate_[j] < need) continue;
      ready -= rate_[j];
      --running[j];
      if (idle) {
        Retire(static_cast<int>(id));
      } else {
        w.draining = true;
        idle_.erase(static_cast<int>(id));
      }
    }
  }
}

void Simulation::Retire(int id) {
  Worker& w = workers_[id];
  SetBilled(w, false);
  ++w.epoch;  // its pending boot, download or snapshot events no longer apply
  w.state = WorkerState::kInactive;
  w.draining = false;
  w.downloading = false;
  w.waiting.clear();
  idle_.erase(id);
  ++result_.retirements;
}

}  // namespace echelon::plan::sim
