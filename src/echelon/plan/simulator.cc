#include "echelon/plan/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <string>

#include "echelon/common/clock.h"
#include "echelon/sched/staleness_gate.h"

namespace echelon::plan {
namespace {

enum class EventType { kGroupDone, kLearnerDone, kLearnerFree, kSnapshotArrive, kFail, kEvict, kReturn, kReady };

struct Event {
  double t;
  uint64_t seq;  // ties resolve in scheduling order, so runs are deterministic
  EventType type;
  int worker;
  uint64_t epoch;
  uint64_t group = 0, lease = 0;
  int64_t version = 0;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

enum class WorkerState { kInactive, kStarting, kJoining, kActive, kDown };

struct Worker {
  int cls = 0;
  WorkerState state = WorkerState::kInactive;
  uint64_t epoch = 0;  // bumped at every activation and failure; stale events carry old ones
  std::string actor;   // dispatcher identity, new per epoch
  int64_t free_slots = 0;
  int64_t held = -1;   // newest snapshot version held
  bool downloading = false;
  bool draining = false;  // surplus: gets no new work, retires when its groups are done
  int64_t wanted = -1;  // newest published version not yet being downloaded
  std::vector<sched::WorkItem> waiting;  // leased, waiting for a fresh enough snapshot
};

class Simulation {
 public:
  Simulation(const Plan& plan, const SimOptions& opt)
      : plan_(plan), cfg_(plan_.config), opt_(opt), gate_(plan.inputs.max_staleness),
        dispatcher_(DispatchOptions(plan), &clock_), rng_(plan.config.sim.seed) {
    steps_ = opt.steps > 0 ? opt.steps : cfg_.steps;
    fixed_workers_ = opt.workers >= 0 ? opt.workers : cfg_.sim.workers;
    S_ = plan.inputs.max_staleness;
    B_ = plan.inputs.groups_per_step;
    kappa_ = plan.inputs.publish_period;
    const double cv = cfg_.sim.throughput_cv;
    const double sigma2 = std::log(1 + cv * cv);
    noise_ = std::lognormal_distribution<double>(-sigma2 / 2, std::sqrt(sigma2));
    result_.staleness_hist.assign(S_ + 1, 0);
    billed_by_class_.assign(plan_.classes.size(), 0);
    target_.assign(plan_.classes.size(), 0);
    rate_.assign(plan_.classes.size(), 0);
  }

  Result<SimResult> Run() {
    const auto wall0 = std::chrono::steady_clock::now();
    ECHELON_RETURN_IF_ERROR(CreateWorkers());
    Pump();
    TryLearner();
    while (version_ < steps_) {
      if (events_.empty())
        return FailedPrecondition("simulation stalled at learner step " + std::to_string(version_) +
                                  ": no worker can make progress (no usable worker classes?)");
      Event e = events_.top();
      events_.pop();
      ++result_.events;
      AdvanceTo(e.t);
      Handle(e);
    }
    Finish();
    result_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return result_;
  }

 private:
  static sched::DispatcherOptions DispatchOptions(const Plan& plan) {
    sched::DispatcherOptions o;
    o.max_staleness = plan.inputs.max_staleness;
    o.batch_groups = plan.inputs.groups_per_step;
    o.lease_seconds = plan.config.sim.lease_seconds;
    return o;
  }

  const WorkerClass& Cls(const Worker& w) const { return plan_.classes[w.cls]; }
  bool Billed(const Worker& w) const {
    return w.state == WorkerState::kStarting || w.state == WorkerState::kJoining || w.state == WorkerState::kActive;
  }

  void Push(Event e) {
    e.seq = seq_++;
    events_.push(e);
  }

  void AdvanceTo(double t) {
    cost_ += spend_per_second_ * (t - now_);
    now_ = t;
    clock_.Set(t);
  }

  void SetBilled(Worker& w, bool on) {
    const double rate = Cls(w).price_per_hour / 3600;
    spend_per_second_ += on ? rate : -rate;
    billed_count_ += on ? 1 : -1;
    billed_by_class_[w.cls] += on ? 1 : -1;
    result_.peak_workers = std::max(result_.peak_workers, billed_count_);
  }

  // Instances per class: the catalogue's, or N spread over classes by availability.
  Status CreateWorkers() {
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

  std::vector<int64_t> SpreadFixed(int64_t n, std::vector<int64_t>* instances) {
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

  // Starts billing and a new identity; schedules the worker's next failure.
  void BeginEpoch(int id, WorkerState state) {
    Worker& w = workers_[id];
    ++w.epoch;
    w.actor = "w" + std::to_string(id) + "." + std::to_string(w.epoch);
    w.state = state;
    w.downloading = false;
    w.draining = false;
    w.wanted = -1;
    w.waiting.clear();
    SetBilled(w, true);
    const double f = Cls(w).failures_per_hour / 3600;
    if (f > 0) {
      std::exponential_distribution<double> life(f);
      Push({now_ + life(rng_), 0, EventType::kFail, id, w.epoch});
    }
  }

  void Handle(const Event& e) {
    switch (e.type) {
      case EventType::kGroupDone: return OnGroupDone(e);
      case EventType::kLearnerDone: return OnLearnerDone();
      case EventType::kLearnerFree:
        overhead_ = false;
        return TryLearner();
      case EventType::kSnapshotArrive: return OnSnapshot(e);
      case EventType::kFail: return OnFail(e);
      case EventType::kEvict:
        dispatcher_.Evict(EvictName(e));  // the identity the worker had when it failed
        Pump();
        return;
      case EventType::kReturn: return OnReturn(e.worker);
      case EventType::kReady: return OnReady(e);
    }
  }

  std::string EvictName(const Event& e) const { return "w" + std::to_string(e.worker) + "." + std::to_string(e.epoch); }

  // Hands admitted work to idle slots, lowest worker id first.
  void Pump() {
    while (!idle_.empty()) {
      const int id = *idle_.begin();
      std::optional<sched::WorkItem> item = dispatcher_.Acquire(workers_[id].actor);
      if (!item) return;
      Worker& w = workers_[id];
      if (--w.free_slots == 0) idle_.erase(id);
      if (w.held >= item->dispatch_version - S_) {
        StartGroup(id, *item);
      } else {
        w.waiting.push_back(*item);
      }
    }
  }

  void StartGroup(int id, const sched::WorkItem& item) {
    Worker& w = workers_[id];
    const double seconds = Cls(w).decode.group_seconds * (cfg_.sim.throughput_cv > 0 ? noise_(rng_) : 1.0);
    Event e{now_ + seconds, 0, EventType::kGroupDone, id, w.epoch};
    e.group = item.group_id;
    e.lease = item.lease_id;
    e.version = w.held;
    Push(e);
  }

  void OnGroupDone(const Event& e) {
    Worker& w = workers_[e.worker];
    if (e.epoch != w.epoch) return;  // the worker failed meanwhile; the group is re-issued
    if (dispatcher_.Submit(e.group, e.lease) == sched::SubmitResult::kAccepted) {
      buffer_.insert({e.version, e.group});
    } else {
      ++result_.groups_wasted;
    }
    if (w.state == WorkerState::kActive) {
      ++w.free_slots;
      if (!w.draining) {
        idle_.insert(e.worker);
      } else if (w.free_slots == Cls(w).decode.slots && w.waiting.empty()) {
        Retire(e.worker);
      }
    }
    Pump();
    TryLearner();
  }

  void TryLearner() {
    if (training_ || overhead_ || version_ >= steps_) return;
    bool dropped = false;
    while (!buffer_.empty() && !gate_.Admits(buffer_.begin()->first, version_)) {
      dispatcher_.Settle(buffer_.begin()->second, sched::Outcome::kDroppedStale);
      buffer_.erase(buffer_.begin());
      ++step_dropped_;
      dropped = true;
    }
    if (dropped) Pump();  // dropped groups free their admission slots
    if (static_cast<int64_t>(buffer_.size()) < B_) return;
    double stale_sum = 0;
    int64_t stale_max = 0;
    for (int64_t i = 0; i < B_; ++i) {
      auto it = buffer_.begin();
      const int64_t staleness = version_ - it->first;
      ++result_.staleness_hist[staleness];
      stale_sum += staleness;
      stale_max = std::max(stale_max, staleness);
      dispatcher_.Settle(it->second, sched::Outcome::kConsumed);
      buffer_.erase(it);
    }
    training_ = true;
    step_start_ = now_;
    step_stale_mean_ = stale_sum / B_;
    step_stale_max_ = stale_max;
    Push({now_ + plan_.inputs.train_seconds, 0, EventType::kLearnerDone, -1, 0});
  }

  void OnLearnerDone() {
    training_ = false;
    ++version_;
    dispatcher_.SetVersion(version_);
    step_end_.push_back(now_);
    step_cost_.push_back(cost_);
    const size_t changes_before = result_.price_changes.size();
    ApplyPriceChanges();
    if (opt_.on_step) {
      nlohmann::json record = {
          {"step", version_}, {"start", step_start_}, {"end", now_},
          {"wait_s", step_start_ - (step_end_.size() > 1 ? step_end_[step_end_.size() - 2] : 0.0)},
          {"dropped_stale", step_dropped_}, {"staleness_mean", step_stale_mean_}, {"staleness_max", step_stale_max_},
          {"active_workers", billed_count_}, {"billed_by_class", BilledByClass()}, {"cost", cost_}};
      for (size_t k = changes_before; k < result_.price_changes.size(); ++k)
        record["price_changes"].push_back(PriceChangeJson(result_.price_changes[k]));
      opt_.on_step(record);
    }
    step_dropped_ = 0;
    if (version_ >= steps_) return;
    if (plan_.inputs.overhead_seconds > 0) {  // publishing, metrics, evaluation: the learner is not training
      overhead_ = true;
      Push({now_ + plan_.inputs.overhead_seconds, 0, EventType::kLearnerFree, -1, 0});
    }
    if (version_ % kappa_ == 0) Publish(version_);
    Pump();
    TryLearner();
  }

  std::map<std::string, int64_t> BilledByClass() const {
    std::map<std::string, int64_t> out;
    for (size_t j = 0; j < plan_.classes.size(); ++j) out[plan_.classes[j].name] = billed_by_class_[j];
    return out;
  }

  // simulate.price_changes due by now: new prices for every class on that GPU (running
  // workers are billed at the new price from now on), then activation again, as the
  // learner's activation loop would on a price update.
  void ApplyPriceChanges() {
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

  void Publish(int64_t version) {
    published_ = version;
    receivers_ = 0;
    double up = 0;
    for (const Worker& w : workers_) {
      if (w.state == WorkerState::kActive || w.state == WorkerState::kJoining) {
        ++receivers_;
        up += Cls(w).uplink_mbps;
      }
    }
    relay_up_ = receivers_ > 0 ? up / receivers_ : 0;
    for (size_t id = 0; id < workers_.size(); ++id) {
      const WorkerState st = workers_[id].state;
      if (st == WorkerState::kActive || st == WorkerState::kJoining) RequestSnapshot(static_cast<int>(id), version);
    }
  }

  void RequestSnapshot(int id, int64_t version) {
    Worker& w = workers_[id];
    if (w.downloading) {
      w.wanted = std::max(w.wanted, version);
      return;
    }
    w.downloading = true;
    const double seconds = SnapshotSeconds(cfg_.link, plan_.inputs.snapshot_bytes, Cls(w).downlink_mbps,
                                           std::max<int64_t>(1, receivers_), relay_up_ > 0 ? relay_up_ : Cls(w).uplink_mbps);
    Event e{now_ + seconds, 0, EventType::kSnapshotArrive, id, w.epoch};
    e.version = version;
    Push(e);
  }

  void OnSnapshot(const Event& e) {
    Worker& w = workers_[e.worker];
    if (e.epoch != w.epoch) return;
    w.downloading = false;
    w.held = std::max(w.held, e.version);
    if (w.wanted > w.held) RequestSnapshot(e.worker, w.wanted);
    w.wanted = -1;
    bool joined = false;
    if (w.state == WorkerState::kJoining) {
      w.state = WorkerState::kActive;
      w.free_slots = Cls(w).decode.slots;
      idle_.insert(e.worker);
      joined = true;
    }
    std::vector<sched::WorkItem> still;
    std::vector<sched::WorkItem> ready;
    for (const sched::WorkItem& item : w.waiting) (w.held >= item.dispatch_version - S_ ? ready : still).push_back(item);
    w.waiting = std::move(still);
    for (const sched::WorkItem& item : ready) StartGroup(e.worker, item);
    if (joined && Reactivating()) RetireSurplus();  // a replacement is ready: the worker it replaces may go
    Pump();
  }

  void OnFail(const Event& e) {
    Worker& w = workers_[e.worker];
    if (e.epoch != w.epoch || !Billed(w)) return;
    ++result_.failures;
    SetBilled(w, false);
    Push({now_ + cfg_.sim.detect_seconds, 0, EventType::kEvict, e.worker, w.epoch});
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

  void OnReturn(int id) {
    Worker& w = workers_[id];
    if (w.state != WorkerState::kDown) return;
    w.state = WorkerState::kInactive;
    if (Reactivating()) {
      Reactivate();
    } else {
      Activate(id);  // fixed pool: the worker simply rejoins
    }
  }

  bool Reactivating() const { return cfg_.sim.reactivate && fixed_workers_ == 0; }

  void Activate(int id) {
    BeginEpoch(id, WorkerState::kStarting);
    ++result_.activations;
    Push({now_ + cfg_.sim.startup_seconds, 0, EventType::kReady, id, workers_[id].epoch});
  }

  void OnReady(const Event& e) {
    Worker& w = workers_[e.worker];
    if (e.epoch != w.epoch || w.state != WorkerState::kStarting) return;
    w.state = WorkerState::kJoining;
    w.held = -1;
    RequestSnapshot(e.worker, published_);
  }

  // The learner's activation loop: the cheapest set over the workers available now (at the
  // current prices, usable classes only; the running set if that is cheaper); start what is
  // missing (a draining worker of a wanted class first), then retire surplus.
  Activation Reactivate() {
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

  // Workers above the activation target leave, make-before-break: a booting one stops at
  // once (it makes nothing yet); a ready one only while the other ready workers still meet
  // the demand, so replacements are working before the workers they replace go. An idle one
  // leaves now, a busy one drains (no new work) and leaves when its groups are done.
  void RetireSurplus() {
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

  void Retire(int id) {
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

  void Finish() {
    SimResult& r = result_;
    r.steps = steps_;
    r.sim_seconds = now_;
    r.cost_total = cost_;
    r.utilization = steps_ * plan_.inputs.train_seconds / now_;
    r.warmup_steps = cfg_.sim.warmup_steps >= 0 ? std::min(cfg_.sim.warmup_steps, steps_ - 1) : steps_ / 5;
    const int64_t k0 = r.warmup_steps;
    const double t0 = k0 > 0 ? step_end_[k0 - 1] : 0.0;
    const double c0 = k0 > 0 ? step_cost_[k0 - 1] : 0.0;
    r.steady_step_seconds = (now_ - t0) / (steps_ - k0);
    r.steady_utilization = plan_.inputs.train_seconds / r.steady_step_seconds;
    r.steady_cost_per_step = (cost_ - c0) / (steps_ - k0);
    r.rollouts_per_second = static_cast<double>(steps_ * B_ * cfg_.shape.group_size) / now_;
    r.counts = dispatcher_.counts();
    r.final_billed_by_class = BilledByClass();
  }

  Plan plan_;  // a copy: prices change during the run
  const PlanConfig& cfg_;
  SimOptions opt_;
  SimulatedClock clock_;
  sched::StalenessGate gate_;
  sched::Dispatcher dispatcher_;
  std::mt19937_64 rng_;
  std::lognormal_distribution<double> noise_;
  int64_t steps_ = 0, fixed_workers_ = 0, S_ = 0, B_ = 1, kappa_ = 1;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  double cost_ = 0, spend_per_second_ = 0;
  int64_t billed_count_ = 0;
  std::vector<int64_t> billed_by_class_;
  std::vector<int64_t> target_;  // the last activation's counts per class
  std::vector<double> rate_;     // the last activation's offer rate per class (groups/s)
  size_t next_price_change_ = 0;

  std::vector<Worker> workers_;
  std::set<int> idle_;  // workers with a free slot

  // learner
  int64_t version_ = 0;
  bool training_ = false;
  bool overhead_ = false;  // after an update, for learner.overhead_seconds
  std::set<std::pair<int64_t, uint64_t>> buffer_;  // (behaviour version, group): oldest first
  int64_t published_ = 0;
  int64_t receivers_ = 0;
  double relay_up_ = 0;
  double step_start_ = 0, step_stale_mean_ = 0;
  int64_t step_stale_max_ = 0, step_dropped_ = 0;
  std::vector<double> step_end_, step_cost_;

  SimResult result_;
};

}  // namespace

Result<SimResult> Simulate(const Plan& plan, const SimOptions& options) {
  Simulation sim(plan, options);
  return sim.Run();
}

nlohmann::json PriceChangeJson(const PriceChangeRecord& c) {
  nlohmann::json j = {{"at_step", c.at_step}, {"time", c.time}, {"gpu", c.gpu}, {"price_per_hour", c.price_per_hour},
                      {"classes", c.classes}, {"billed_before", c.billed_before}, {"reactivated", c.reactivated}};
  if (c.reactivated) {
    j["target"] = c.target;
    j["method"] = c.method;
    j["feasible"] = c.feasible;
    j["target_workers_cost_per_hour"] = c.target_cost_per_hour;
  }
  return j;
}

nlohmann::json SimResultJson(const SimResult& r) {
  return {{"steps", r.steps},
          {"sim_seconds", r.sim_seconds},
          {"utilization", r.utilization},
          {"steady_utilization", r.steady_utilization},
          {"steady_step_seconds", r.steady_step_seconds},
          {"steady_cost_per_step", r.steady_cost_per_step},
          {"warmup_steps", r.warmup_steps},
          {"cost_total", r.cost_total},
          {"rollouts_per_second", r.rollouts_per_second},
          {"staleness_hist", r.staleness_hist},
          {"dropped_stale", r.counts.dropped_stale},
          {"consumed", r.counts.consumed},
          {"handed_out", r.counts.handed_out},
          {"reissued", r.counts.reissued},
          {"groups_wasted", r.groups_wasted},
          {"failures", r.failures},
          {"activations", r.activations},
          {"retirements", r.retirements},
          {"initial_workers", r.initial_workers},
          {"peak_workers", r.peak_workers},
          {"final_billed_by_class", r.final_billed_by_class},
          {"price_changes", [&] {
             nlohmann::json a = nlohmann::json::array();
             for (const PriceChangeRecord& c : r.price_changes) a.push_back(PriceChangeJson(c));
             return a;
           }()},
          {"events", r.events},
          {"wall_seconds", r.wall_seconds}};
}

}  // namespace echelon::plan
