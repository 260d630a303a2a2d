#include "echelon/plan/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "echelon/plan/simulation.h"

namespace echelon::plan {
namespace sim {
namespace {

// The prompt group `group` stands for (simulate.prompts: a dataset seen again and again).
uint64_t PromptOf(uint64_t group, int64_t prompts) {
  return prompts > 0 ? group % static_cast<uint64_t>(prompts) : group;
}

}  // namespace

Simulation::Simulation(const Plan& plan, const SimOptions& opt)
    : plan_(plan), cfg_(plan_.config), opt_(opt), dispatcher_(DispatchOptions(plan), &clock_),
      intake_(plan.inputs.max_staleness, plan.inputs.groups_per_step, &dispatcher_), rng_(plan.config.sim.seed) {
  if (opt_.on_intake) intake_.set_observer(opt_.on_intake);
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
  deadline_ = cfg_.sim.dispatch == "deadline";
}

Result<SimResult> Simulation::Run() {
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

sched::DispatcherOptions Simulation::DispatchOptions(const Plan& plan) {
  sched::DispatcherOptions o;
  o.max_staleness = plan.inputs.max_staleness;
  o.batch_groups = plan.inputs.groups_per_step;
  o.lease_seconds = plan.config.sim.lease_seconds;
  // Simulated workers are honest and run decode.slots groups at once (more than the real
  // learner's per-worker cap for a large GPU class): no cap, or Pump would stop at one.
  o.max_leases_per_worker = 0;
  if (plan.config.sim.dispatch == "deadline") o.lookahead = sched::kDeadlineLookahead;
  o.prompt_key = [prompts = plan.config.sim.prompts](uint64_t g) { return PromptOf(g, prompts); };
  return o;
}

double Simulation::PromptLength(uint64_t prompt) const {
  const double mean = cfg_.shape.completion_tokens;
  const double sigma = cfg_.sim.length_sigma;
  if (sigma <= 0) return mean;
  // Drawn from the prompt alone (and the seed), so every dispatch rule sees the same dataset.
  std::mt19937_64 gen(cfg_.sim.seed * 0x9E3779B97F4A7C15ULL + prompt);
  std::lognormal_distribution<double> length(std::log(mean) - sigma * sigma / 2, sigma);
  const double cap = cfg_.sim.length_max_tokens > 0 ? cfg_.sim.length_max_tokens : 10 * mean;
  return std::min(length(gen), cap);
}

bool Simulation::Billed(const Worker& w) const {
  return w.state == WorkerState::kStarting || w.state == WorkerState::kJoining || w.state == WorkerState::kActive;
}

void Simulation::Push(Event e) {
  e.seq = seq_++;
  events_.push(e);
}

void Simulation::AdvanceTo(double t) {
  cost_ += spend_per_second_ * (t - now_);
  now_ = t;
  clock_.Set(t);
}

void Simulation::Handle(const Event& e) {
  switch (e.type) {
    case EventType::kGroupDone: return OnGroupDone(e);
    case EventType::kLearnerDone: return OnLearnerDone();
    case EventType::kLearnerFree:
      overhead_ = false;
      return TryLearner();
    case EventType::kSnapshotArrive: return OnSnapshot(e);
    case EventType::kNotice: return OnNotice(e);
    case EventType::kFail: return OnFail(e);
    case EventType::kEvict:
      dispatcher_.Evict(EvictName(e));  // the identity the worker had when it failed
      Pump();
      return;
    case EventType::kReturn: return OnReturn(e.worker);
    case EventType::kReady: return OnReady(e);
  }
}

void Simulation::Pump() {
  if (deadline_) return PumpDeadline();
  while (!idle_.empty())
    if (!TakeWork(*idle_.begin())) return;
}

// A worker the forecast passes over gets nothing while another may take work, so every idle
// worker is asked in turn; when nothing runs anywhere (no event would call Pump again) the
// rounds repeat until a passed-over group is handed out anyway (sched::kMaxPassOvers).
void Simulation::PumpDeadline() {
  for (int quiet = 0; !idle_.empty() && quiet <= sched::kMaxPassOvers;) {
    bool handed = false;
    for (const int id : std::vector<int>(idle_.begin(), idle_.end()))
      while (idle_.count(id) > 0 && TakeWork(id)) handed = true;
    if (handed || dispatcher_.counts().outstanding > 0) return;
    ++quiet;
  }
}

bool Simulation::TakeWork(int id) {
  std::optional<sched::WorkItem> item = dispatcher_.Acquire(workers_[id].actor, workers_[id].held);
  if (!item) return false;
  Worker& w = workers_[id];
  if (--w.free_slots == 0) idle_.erase(id);
  if (w.held >= item->dispatch_version - S_) {
    StartGroup(id, *item);
  } else {
    w.waiting.push_back(*item);
  }
  return true;
}

void Simulation::StartGroup(int id, const sched::WorkItem& item) {
  Worker& w = workers_[id];
  const double scale = PromptLength(PromptOf(item.group_id, cfg_.sim.prompts)) / cfg_.shape.completion_tokens;
  const double noise = cfg_.sim.throughput_cv > 0 ? noise_(rng_) : 1.0;
  const double tokens = cfg_.shape.group_size * cfg_.shape.completion_tokens * scale * noise;
  double seconds = Cls(w).decode.group_seconds * scale * noise;
  // A failed worker's group continues from its prefix while it can still be consumed (the
  // learner's TrajectoryIntake rule); otherwise the prefix is lost.
  Worker::Running run{now_, now_ + seconds, tokens, item.lease_id, 0, w.held};
  if (auto p = prefixes_.find(item.group_id); p != prefixes_.end()) {
    if (p->second.version + S_ > item.dispatch_version && p->second.tokens < tokens) {
      const double left = 1 - p->second.tokens / tokens;
      seconds *= left;
      run = {now_, now_ + seconds, tokens * left, item.lease_id, p->second.tokens, p->second.version};
      dispatcher_.Carry(item.group_id, item.lease_id, static_cast<int64_t>(std::llround(p->second.tokens)));
    } else {
      result_.tokens_preempted += p->second.tokens;
    }
    prefixes_.erase(p);
  }
  w.running[item.group_id] = run;
  Event e{now_ + seconds, 0, EventType::kGroupDone, id, w.epoch};
  e.group = item.group_id;
  e.lease = item.lease_id;
  e.version = run.version;
  Push(e);
}

void Simulation::OnGroupDone(const Event& e) {
  Worker& w = workers_[e.worker];
  if (e.epoch != w.epoch) return;  // the worker failed meanwhile; the group is re-issued
  if (w.running.count(e.group) == 0) return;  // handed back at a preemption notice
  const double made = w.running[e.group].tokens;
  const double tokens = made + w.running[e.group].carried;  // the whole group's
  w.running.erase(e.group);
  result_.tokens_generated += made;
  if (dispatcher_.Submit(e.group, e.lease, w.actor, static_cast<int64_t>(std::llround(tokens)), e.version) ==
      sched::SubmitResult::kAccepted) {
    intake_.Add(e.group, e.version);
    if (opt_.on_arrival) opt_.on_arrival(now_, e.group, e.version);
  } else {
    ++result_.groups_wasted;
    result_.tokens_refused += tokens;
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

void Simulation::TryLearner() {
  if (training_ || overhead_ || version_ >= steps_) return;
  const sched::IntakeDecision d = intake_.Assemble(version_);

  if (d.batch.empty()) {
    if (!d.dropped.empty()) Pump();  // dropped groups free their admission slots
    return;
  }
  intake_.Commit(d);
  step_record_ = obs::StepRecord();
  double stale_sum = 0;
  int64_t stale_max = 0;
  for (const sched::IntakeGroup& g : d.batch) {
    const int64_t staleness = version_ - g.behavior_version;
    ++result_.staleness_hist[staleness];
    ++step_record_.staleness_hist[staleness];
    stale_sum += staleness;
    stale_max = std::max(stale_max, staleness);
    step_record_.consumed_groups.push_back(g.group_id);
  }
  training_ = true;
  step_start_ = now_;
  step_record_.staleness_mean = stale_sum / B_;
  step_record_.staleness_max = stale_max;
  if (!d.dropped.empty()) Pump();
  Push({now_ + plan_.inputs.train_seconds, 0, EventType::kLearnerDone, -1, 0});
}

void Simulation::OnLearnerDone() {
  training_ = false;
  ++version_;
  dispatcher_.SetVersion(version_);
  const double previous_end = step_end_.empty() ? 0.0 : step_end_.back();
  step_end_.push_back(now_);
  step_cost_.push_back(cost_);
  const size_t changes_before = result_.price_changes.size();
  ApplyPriceChanges();
  if (opt_.on_step) opt_.on_step(Record(previous_end, changes_before).ToJson());
  if (version_ >= steps_) return;
  if (plan_.inputs.overhead_seconds > 0) {  // publishing, metrics, evaluation: the learner is not training
    overhead_ = true;
    Push({now_ + plan_.inputs.overhead_seconds, 0, EventType::kLearnerFree, -1, 0});
  }
  if (version_ % kappa_ == 0) Publish(version_);
  Pump();
  TryLearner();
}

obs::StepRecord Simulation::Record(double previous_end, size_t changes_before) {
  obs::StepRecord& r = step_record_;
  r.step = version_ - 1;
  r.version = version_;
  r.wall_s = now_;
  r.step_s = now_ - previous_end;
  r.wait_s = step_start_ - previous_end;
  r.train_s = plan_.inputs.train_seconds;
  r.staleness_bound = S_;
  const sched::DispatchCounts c = dispatcher_.counts();
  r.groups_issued = static_cast<int64_t>(c.handed_out);
  r.groups_consumed = static_cast<int64_t>(c.consumed);
  r.groups_dropped_stale = static_cast<int64_t>(c.dropped_stale);
  r.groups_reissued = static_cast<int64_t>(c.reissued);
  r.groups_in_flight = static_cast<int64_t>(c.outstanding + c.pending);
  if (deadline_) r.groups_predicted_late = static_cast<int64_t>(c.predicted_late);
  if (cfg_.sim.resume) r.groups_resumed = static_cast<int64_t>(c.resumed);
  r.tokens_by_fate = sched::TokensByFate(c);
  r.tokens_by_fate["preempted"] = static_cast<int64_t>(result_.tokens_preempted);  // the dispatcher sees no progress here
  r.learner_busy_frac = version_ * plan_.inputs.train_seconds / std::max(now_, 1e-9);
  r.active_workers = billed_count_;
  r.billed_by_class = BilledByClass();
  r.cost = cost_;
  for (size_t k = changes_before; k < result_.price_changes.size(); ++k)
    r.price_changes.push_back(PriceChangeJson(result_.price_changes[k]));
  return r;
}

void Simulation::Publish(int64_t version) {
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

void Simulation::RequestSnapshot(int id, int64_t version) {
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

void Simulation::OnSnapshot(const Event& e) {
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

void Simulation::Finish() {
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
  r.tokens_consumed = static_cast<double>(r.counts.tokens_consumed);
  r.tokens_stale = static_cast<double>(r.counts.tokens_stale);
  r.final_billed_by_class = BilledByClass();
}

}  // namespace sim


Result<SimResult> Simulate(const Plan& plan, const SimOptions& options) {
  sim::Simulation sim(plan, options);
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
          {"groups_dropped_stale", r.counts.dropped_stale},
          {"groups_consumed", r.counts.consumed},
          {"groups_issued", r.counts.handed_out},
          {"groups_reissued", r.counts.reissued},
          {"groups_wasted", r.groups_wasted},
          {"groups_predicted_late", r.counts.predicted_late},
          {"groups_resumed", r.counts.resumed},
          {"tokens_generated", r.tokens_generated},
          {"tokens_consumed", r.tokens_consumed},
          {"tokens_stale", r.tokens_stale},
          {"tokens_preempted", r.tokens_preempted},
          {"tokens_refused", r.tokens_refused},
          {"wasted_fraction", r.wasted_fraction()},
          {"cost_per_million_consumed_tokens", r.tokens_consumed > 0 ? r.cost_total / r.tokens_consumed * 1e6 : 0.0},
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
