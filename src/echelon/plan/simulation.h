// The discrete-event simulation behind plan::Simulate (plan/simulator.h): its events, its
// workers and the Simulation class, shared by simulator.cc (the event loop, the learner and the
// snapshots) and simulation_fleet.cc (failures, activation, retirement and price changes).
// Internal to the simulator: nothing else includes it.
//
// Thread contract: single-threaded, like Simulate.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/obs/step_record.h"
#include "echelon/plan/simulator.h"
#include "echelon/sched/batch_assembler.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::plan::sim {

enum class EventType { kGroupDone, kLearnerDone, kLearnerFree, kSnapshotArrive, kNotice, kFail, kEvict, kReturn, kReady };

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
  // Running groups: group id -> start and end times and its completion tokens.
  struct Running {
    double start = 0, end = 0, tokens = 0;  // tokens: this worker's part of the group
    uint64_t lease = 0;
    double carried = 0;       // tokens it continued from (a resumed group)
    int64_t version = 0;      // the group's oldest token's version
  };
  std::map<uint64_t, Running> running;
};

class Simulation {
 public:
  Simulation(const Plan& plan, const SimOptions& opt);
  Result<SimResult> Run();

 private:
  static sched::DispatcherOptions DispatchOptions(const Plan& plan);
  const WorkerClass& Cls(const Worker& w) const { return plan_.classes[w.cls]; }
  bool Billed(const Worker& w) const;
  void Push(Event e);
  void AdvanceTo(double t);
  void SetBilled(Worker& w, bool on);

  // Instances per class: the catalogue's, or N spread over classes by availability.
  Status CreateWorkers();
  std::vector<int64_t> SpreadFixed(int64_t n, std::vector<int64_t>* instances);

  // Starts billing and a new identity; schedules the worker's next failure.
  void BeginEpoch(int id, WorkerState state);
  void Handle(const Event& e);
  std::string EvictName(const Event& e) const { return "w" + std::to_string(e.worker) + "." + std::to_string(e.epoch); }

  // Hands admitted work to idle slots, lowest worker id first.
  void Pump();
  void PumpDeadline();  // the same under deadline-aware dispatch (simulate.dispatch)
  // Asks the dispatcher for work for worker `id` and starts it (or holds it for a fresh enough
  // snapshot); false when it got none.
  bool TakeWork(int id);
  // Mean completion tokens per sample of a prompt (simulate.length_sigma), fixed by the seed.
  double PromptLength(uint64_t prompt) const;
  void StartGroup(int id, const sched::WorkItem& item);
  void OnGroupDone(const Event& e);

  // The learner takes its next batch as soon as it is free and B admissible groups wait
  // (sched/batch_assembler.h: the learner loop's own rule).
  void TryLearner();
  void OnLearnerDone();

  // The update that just ended, in the learner's metrics record (obs/step_record.h).
  obs::StepRecord Record(double previous_end, size_t changes_before);
  std::map<std::string, int64_t> BilledByClass() const;

  // simulate.price_changes due by now: new prices for every class on that GPU (running
  // workers are billed at the new price from now on), then activation again, as the
  // learner's activation loop would on a price update.
  void ApplyPriceChanges();
  void Publish(int64_t version);
  void RequestSnapshot(int id, int64_t version);
  void OnSnapshot(const Event& e);
  void OnNotice(const Event& e);  // a preemption notice (workers[].preemption_notice_seconds)
  void OnFail(const Event& e);
  // Ends the worker's running groups (a failure, or a notice: then all they drew is reported),
  // counting what is lost and keeping the rest as prefixes (simulate.resume).
  void StopGroups(Worker& w, bool noticed);
  void OnReturn(int id);
  bool Reactivating() const { return cfg_.sim.reactivate && fixed_workers_ == 0; }
  void Activate(int id);
  void OnReady(const Event& e);

  // The learner's activation loop: the cheapest set over the workers available now (at the
  // current prices, usable classes only; the running set if that is cheaper); start what is
  // missing (a draining worker of a wanted class first), then retire surplus.
  Activation Reactivate();

  // Workers above the activation target leave, make-before-break: a booting one stops at
  // once (it makes nothing yet); a ready one only while the other ready workers still meet
  // the demand, so replacements are working before the workers they replace go. An idle one
  // leaves now, a busy one drains (no new work) and leaves when its groups are done.
  void RetireSurplus();
  void Retire(int id);
  void Finish();

  Plan plan_;  // a copy: prices change during the run
  const PlanConfig& cfg_;
  SimOptions opt_;
  SimulatedClock clock_;
  sched::Dispatcher dispatcher_;
  // Resumable groups (simulate.resume): what a failed worker had reported of each group.
  struct Prefix {
    double tokens = 0;
    int64_t version = 0;  // its oldest token's
  };
  std::map<uint64_t, Prefix> prefixes_;
  sched::BatchAssembler intake_;  // submitted groups waiting for the learner
  std::mt19937_64 rng_;
  std::lognormal_distribution<double> noise_;
  bool deadline_ = false;  // simulate.dispatch: deadline
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
  int64_t published_ = 0;
  int64_t receivers_ = 0;
  double relay_up_ = 0;
  double step_start_ = 0;
  obs::StepRecord step_record_;  // the update in progress
  std::vector<double> step_end_, step_cost_;
  SimResult result_;
};

}  // namespace echelon::plan::sim
