// Simulator: a discrete-event simulation of a whole asynchronous run, at any scale, driving
// the real sched::Dispatcher (admission window, leases, re-issue) and the consume rule
// against a SimulatedClock, so it makes the same decisions as the learner does.
//
// What is modelled:
//  - the learner: takes its batches by the learner loop's own rule (sched::BatchAssembler:
//    drop t - x > S, then the B oldest groups), trains T_train, bumps the version, publishes
//    a snapshot every kappa versions;
//  - workers of heterogeneous classes, each running `slots` groups at once; a group takes
//    T_gen of its class times a lognormal factor (mean 1, cv simulate.throughput_cv);
//  - snapshot delivery over each worker's link (link_model.h, star or relay); a worker
//    downloads one snapshot at a time and skips to the newest when several were published;
//  - actors use the newest snapshot they hold; a group whose dispatch version is more than S
//    ahead of it would certainly be dropped, so the actor waits for a newer snapshot first;
//  - failures (spot preemption): exponential with the class's failures_per_hour; the
//    worker's groups are re-issued (Dispatcher::Evict) after simulate.detect_seconds; it is
//    back after simulate.restart_seconds; activation is re-run on every failure and return,
//    activating spares (boot simulate.startup_seconds, then a full snapshot download) and
//    retiring surplus, as the real learner's activation loop would;
//  - price changes (simulate.price_changes): at the end of update at_step the classes on that
//    GPU cost the new price and activation is re-run at the new prices;
//  - retiring is make-before-break: a surplus worker leaves only while the other ready
//    workers still meet the demand (so its replacement has booted and downloaded first), and
//    a busy one drains (no new work) before it leaves;
//  - the learner's overhead per update (learner.overhead_seconds): it trains T_train, then
//    publishes and is unavailable for T_over while the workers keep generating;
//  - cost: every active (or booting, or draining) worker and the learner are billed by the
//    second.
// The initially activated workers hold version 0 at t = 0 (pre-warmed).
//
//   ECHELON_ASSIGN_OR_RETURN(Plan plan, MakePlan(config));
//   SimOptions opt;  opt.steps = 1000;  opt.on_step = [&](const nlohmann::json& j) { out << j.dump() << "\n"; };
//   ECHELON_ASSIGN_OR_RETURN(SimResult r, Simulate(plan, opt));   // r.steady_utilization ...
//
// Thread contract: Simulate is a pure function of its inputs (seeded); single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/plan/planner.h"
#include "echelon/sched/batch_assembler.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::plan {

struct SimOptions {
  int64_t steps = 0;    // 0: config rl.steps
  int64_t workers = -1; // -1: config simulate.workers; 0: the plan's activation; N: exactly N workers
  // One timeline record per learner update: obs::StepRecord as JSON, the learner's keys.
  std::function<void(const nlohmann::json&)> on_step;
  // Traces of the learner's intake: every accepted group as it arrives (simulated time,
  // group, behaviour version), and every decision of the consume rule.
  std::function<void(double time, uint64_t group_id, int64_t behavior_version)> on_arrival;
  std::function<void(const sched::IntakeDecision&)> on_intake;
};

// One applied simulate.price_changes entry and the activation it caused.
struct PriceChangeRecord {
  int64_t at_step = 0;
  double time = 0;                       // simulated seconds
  std::string gpu;
  double price_per_hour = 0;
  std::vector<std::string> classes;      // the worker classes on that GPU
  std::map<std::string, int64_t> billed_before;  // workers billed per class just before
  bool reactivated = false;              // false for a fixed pool (--workers N, reactivate: false)
  std::map<std::string, int64_t> target; // the new activation per class
  std::string method;
  bool feasible = false;
  double target_cost_per_hour = 0;       // workers' $/h of the new activation, at the new prices
};

struct SimResult {
  int64_t steps = 0;
  double sim_seconds = 0;
  double utilization = 0;         // whole run: steps * T_train / sim_seconds
  int64_t warmup_steps = 0;
  double steady_step_seconds = 0;   // after warm-up
  double steady_utilization = 0;
  double steady_cost_per_step = 0;
  double cost_total = 0;
  double rollouts_per_second = 0;   // consumed rollouts per simulated second
  std::vector<int64_t> staleness_hist;  // consumed groups by t - x, 0..S
  uint64_t groups_wasted = 0;     // finished by a worker but refused (re-issued meanwhile)
  // Completion tokens: generated (whole groups, and the part of a group a failure cut off),
  // consumed by updates, and wasted by cause; the rest were in flight at the end.
  double tokens_generated = 0, tokens_consumed = 0;
  double tokens_stale = 0;      // of groups dropped as stale
  double tokens_preempted = 0;  // generated before the worker failed
  double tokens_refused = 0;    // of groups finished after their lease ended
  double wasted_fraction() const {
    return tokens_generated > 0 ? (tokens_stale + tokens_preempted + tokens_refused) / tokens_generated : 0;
  }
  uint64_t failures = 0;
  uint64_t activations = 0;       // workers activated after the start
  uint64_t retirements = 0;
  int64_t initial_workers = 0;
  int64_t peak_workers = 0;
  std::map<std::string, int64_t> final_billed_by_class;
  std::vector<PriceChangeRecord> price_changes;
  sched::DispatchCounts counts;
  uint64_t events = 0;
  double wall_seconds = 0;
};

Result<SimResult> Simulate(const Plan& plan, const SimOptions& options);
nlohmann::json SimResultJson(const SimResult& r);
nlohmann::json PriceChangeJson(const PriceChangeRecord& c);

}  // namespace echelon::plan
