#include "echelon/plan/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "echelon/plan/planner.h"
#include "echelon/plan/testing.h"

namespace echelon::plan {
namespace {

// A controlled run: measured rates so T_gen is exact, a learner step given in seconds.
PlanConfig TestConfig() {
  return TwoClassTestConfig(/*slow_group_seconds=*/20, /*slow_price_per_hour=*/0.40, /*seed=*/3);
}

TEST(SimulatorLockStep, SZeroReproducesLockStepTimingExactly) {
  PlanConfig c = TestConfig();
  c.max_staleness = 0;
  c.publish_period = 1;
  c.workers = {{"w", "g", 8, 0.5, 4 * 1000 / 20.0, 1, 1000, 1000, 0}};  // 8 slots, T_gen = 20 s
  c.groups_per_step = 12;  // two waves: ceil(12 / 8) * 20 s
  c.target_utilization = 1.0;
  Plan plan = MustPlan(c);
  ASSERT_EQ(plan.classes[0].count, 8);
  const double t_gen = 40, t_train = 10;
  const double t_bcast = SnapshotSeconds(c.link, 2e8, 1000, 8, 1000);
  EXPECT_DOUBLE_EQ(plan.prediction.step_seconds, t_train + t_bcast + t_gen);

  std::vector<double> ends;
  SimOptions opt;
  opt.steps = 50;
  opt.on_step = [&](const nlohmann::json& j) { ends.push_back(j["wall_s"].get<double>()); };
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(ends.size(), 50u);
  // Version 0 is on every worker at t = 0; every later batch waits for its snapshot.
  for (size_t k = 0; k < ends.size(); ++k)
    EXPECT_NEAR(ends[k], (k + 1) * (t_gen + t_train) + k * t_bcast, 1e-9 * ends[k]) << "step " << k + 1;
  EXPECT_NEAR(r->steady_step_seconds, plan.prediction.step_seconds, 1e-9 * plan.prediction.step_seconds);
  EXPECT_EQ(r->staleness_hist, (std::vector<int64_t>{50 * 12}));  // all on-policy
  EXPECT_EQ(r->counts.dropped_stale, 0u);
}

// A simulated worker runs its class's decode.slots groups at once: the learner's per-worker
// lease cap (sched::kMaxLeasesPerWorker, 8) is for untrusted workers and must not throttle it
// (with it, 16 slots ran in waves of 8 and Pump stopped at the capped worker).
TEST(SimulatorLockStep, WorkersWithMoreSlotsThanTheLeaseCapRunThemAll) {
  PlanConfig c = TestConfig();
  c.max_staleness = 0;
  c.publish_period = 1;
  c.workers = {{"w", "g", 1, 0.5, 16 * 4 * 1000 / 20.0, 16, 1000, 1000, 0}};  // one GPU, 16 groups at once
  c.groups_per_step = 16;  // one wave
  c.target_utilization = 1.0;
  Plan plan = MustPlan(c);
  ASSERT_EQ(plan.classes[0].count, 1);
  ASSERT_EQ(plan.classes[0].decode.slots, 16);
  SimOptions opt;
  opt.steps = 5;
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NEAR(r->steady_step_seconds, plan.prediction.step_seconds, 1e-9 * plan.prediction.step_seconds);
}

void ExpectAgreement(const PlanConfig& c, double tolerance) {
  Plan plan = MustPlan(c);
  SimOptions opt;
  opt.steps = c.steps;
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const CapacityPrediction& p = plan.prediction;
  EXPECT_TRUE(p.fresh);
  EXPECT_NEAR(r->steady_utilization / p.utilization, 1, tolerance)
      << "sim " << r->steady_utilization << " plan " << p.utilization << " S=" << plan.inputs.max_staleness;
  EXPECT_NEAR(r->steady_cost_per_step / p.cost_per_step, 1, tolerance)
      << "sim " << r->steady_cost_per_step << " plan " << p.cost_per_step;
  EXPECT_EQ(r->counts.dropped_stale, 0u);
}

TEST(SimulatorAgreement, PlannerMatchesSteadyStateWithinFivePercent) {
  for (double target : {0.6, 0.8, 0.9}) {
    for (double cv : {0.0, 0.2}) {
      PlanConfig c = TestConfig();
      c.target_utilization = target;
      c.sim.throughput_cv = cv;
      SCOPED_TRACE("target " + std::to_string(target) + " cv " + std::to_string(cv));
      ExpectAgreement(c, 0.05);
    }
  }
}

TEST(SimulatorAgreement, HoldsAtLargerScaleWithHeterogeneousWorkers) {
  PlanConfig c = TestConfig();
  c.groups_per_step = 64;
  c.workers[0].available = 400;
  c.workers[1].available = 100;
  c.sim.throughput_cv = 0.15;
  ExpectAgreement(c, 0.05);
}

TEST(SimulatorFailures, RunCompletesCountsAddUpAndActivationReplacesWorkers) {
  PlanConfig c = TestConfig();
  c.workers[0].failures_per_hour = 2;  // a worker fails every 30 minutes on average
  c.workers[1].failures_per_hour = 2;
  c.sim.restart_seconds = 300;
  c.sim.startup_seconds = 20;
  c.sim.detect_seconds = 15;
  c.sim.throughput_cv = 0.1;
  c.steps = 400;
  Plan plan = MustPlan(c);
  SimOptions opt;
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SimResult& s = r.value();
  EXPECT_GT(s.failures, 10u);
  EXPECT_GT(s.activations, 0u);  // spares were started
  EXPECT_GT(s.counts.reissued, 0u);  // the failed workers' groups went out again
  const sched::DispatchCounts& k = s.counts;
  EXPECT_EQ(k.handed_out, k.consumed + k.dropped_stale + k.reissued + k.outstanding + k.pending);
  EXPECT_EQ(k.consumed, static_cast<uint64_t>(400 * c.groups_per_step));
  int64_t hist = 0;
  for (int64_t v : s.staleness_hist) hist += v;
  EXPECT_EQ(hist, 400 * c.groups_per_step);
  // Replacements keep the learner near its target despite losing workers.
  EXPECT_GT(s.steady_utilization, 0.8 * plan.prediction.utilization);
}

TEST(SimulatorFailures, FixedPoolRejoinsWithoutActivation) {
  PlanConfig c = TestConfig();
  c.workers[0].failures_per_hour = 4;
  c.sim.restart_seconds = 100;
  c.sim.startup_seconds = 10;
  Plan plan = MustPlan(c);
  SimOptions opt;
  opt.workers = 30;
  opt.steps = 100;
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->initial_workers, 30);
  EXPECT_GT(r->failures, 0u);
  EXPECT_LE(r->activations, r->failures);  // rejoins only, no spares
  EXPECT_LE(r->peak_workers, 30);
}

// Two GPU types: "slow" (g) is the cheaper throughput until g's price rises at step 60.
PlanConfig PriceChangeConfig(bool reactivate) {
  PlanConfig c = TestConfig();
  c.prices.Add(GpuSpec{"h", 80, 2000, 300, 1.0, "test", "test"});
  c.workers[1].gpu = "h";
  c.max_staleness = 6;
  c.publish_period = 1;
  c.sim.reactivate = reactivate;
  c.sim.price_changes.push_back({60, "g", 1.00});
  return c;
}

TEST(SimulatorPriceChanges, PriceRiseOfTheActiveTypeSwitchesToTheCheaperFeasibleSet) {
  Plan plan = MustPlan(PriceChangeConfig(true));
  // 0.72 groups/s wanted: 15 slow at $0.40 ($6.00/h) beat 3 fast at $2.50 ($7.50/h).
  ASSERT_EQ(plan.classes[0].count, 15);
  ASSERT_EQ(plan.classes[1].count, 0);
  std::vector<nlohmann::json> timeline;
  SimOptions opt;
  opt.steps = 200;
  opt.on_step = [&](const nlohmann::json& j) { timeline.push_back(j); };
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->price_changes.size(), 1u);
  const PriceChangeRecord& pc = r->price_changes[0];
  EXPECT_EQ(pc.at_step, 60);
  EXPECT_TRUE(pc.reactivated);
  EXPECT_EQ(pc.classes, std::vector<std::string>{"slow"});
  EXPECT_EQ(pc.billed_before, (std::map<std::string, int64_t>{{"fast", 0}, {"slow", 15}}));

  // The activation at the change is the optimum at the new prices, found independently: at
  // $1.00/h slow costs $20 per group/s against fast's $10, so 3 fast ($7.50/h) beat any mix
  // (2 fast + 5 slow: $10.00/h; 15 slow: $15.00/h).
  EXPECT_EQ(pc.target, (std::map<std::string, int64_t>{{"fast", 3}, {"slow", 0}}));
  EXPECT_EQ(pc.method, "exact");
  EXPECT_TRUE(pc.feasible);
  EXPECT_DOUBLE_EQ(pc.target_cost_per_hour, 7.5);
  ASSERT_EQ(timeline.size(), 200u);
  EXPECT_EQ(timeline[59]["price_changes"].size(), 1u);  // reported on step 60's record
  EXPECT_FALSE(timeline[58].contains("price_changes"));
  // Make-before-break: the slow workers stay until the fast ones have booted and joined.
  EXPECT_EQ(timeline[59]["billed_by_class"]["slow"].get<int64_t>(), 15);
  EXPECT_EQ(timeline[59]["billed_by_class"]["fast"].get<int64_t>(), 3);
  for (size_t k = 90; k < timeline.size(); ++k) {
    EXPECT_EQ(timeline[k]["billed_by_class"]["slow"].get<int64_t>(), 0) << "step " << k + 1;
    EXPECT_EQ(timeline[k]["billed_by_class"]["fast"].get<int64_t>(), 3) << "step " << k + 1;
  }
  EXPECT_EQ(r->final_billed_by_class, (std::map<std::string, int64_t>{{"fast", 3}, {"slow", 0}}));
  // The learner keeps its pace through the switch.
  const double before = (timeline[59]["wall_s"].get<double>() - timeline[29]["wall_s"].get<double>()) / 30;
  const double during = (timeline[89]["wall_s"].get<double>() - timeline[59]["wall_s"].get<double>()) / 30;
  EXPECT_LT(during, 1.05 * before);

  // Against the same run that keeps its workers: the switch costs less per step after it.
  Result<SimResult> kept = Simulate(MustPlan(PriceChangeConfig(false)), [&] {
    SimOptions o;
    o.steps = 200;
    o.on_step = [&](const nlohmann::json& j) { timeline.push_back(j); };
    return o;
  }());
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  ASSERT_EQ(kept->price_changes.size(), 1u);
  EXPECT_FALSE(kept->price_changes[0].reactivated);
  const nlohmann::json& k100 = timeline[200 + 99];
  const nlohmann::json& k200 = timeline[200 + 199];
  EXPECT_EQ(k200["billed_by_class"]["slow"].get<int64_t>(), 15);
  const double kept_cost = (k200["cost"].get<double>() - k100["cost"].get<double>()) / 100;
  const double switched_cost = (timeline[199]["cost"].get<double>() - timeline[99]["cost"].get<double>()) / 100;
  EXPECT_LT(switched_cost, 0.9 * kept_cost);
}

TEST(SimulatorPriceChanges, KeepsTheRunningSetWhenItIsTheCheapestUsableOne) {
  // The 8B catalogue behind a 1 Gbit/s learner uplink, the consumer cards on 20 Mbit/s home
  // uplinks: 1 RTX 5090, 2 RTX 4090 and 3 A100s run (the A100s relay the snapshot at
  // 10 Gbit/s). A100s rise to $5/h: the cheapest throughput is then consumer cards, but among
  // themselves they relay too slowly for S = 6 (every copy beyond the origin's one per 16 s of
  // snapshot goes through 20 Mbit/s), and A100s alone cost $20/h; the running set still works
  // and costs $16.57/h, so it stays.
  Result<PlanConfig> c = LoadPlanConfig(std::string(ECHELON_TEST_DATA) + "/../../configs/simulate-qwen3-8b.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  c->link.origin_uplink_mbps = 1000;
  for (WorkerOfferConfig& w : c->workers)
    if (w.gpu != "a100") w.uplink_mbps = 20;
  c->sim.price_changes.push_back({100, "a100", 5.0});
  Plan plan = MustPlan(c.value());
  SimOptions opt;
  opt.steps = 150;
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->price_changes.size(), 1u);
  const PriceChangeRecord& pc = r->price_changes[0];
  EXPECT_EQ(pc.method, "kept");
  EXPECT_EQ(pc.target, pc.billed_before);
  EXPECT_NEAR(pc.target_cost_per_hour, 1 * 0.89 + 2 * 0.34 + 3 * 5.0, 1e-9);
}

TEST(SimulatorOverhead, LearnerOverheadMatchesTheCapacityModel) {
  PlanConfig c = TestConfig();
  c.learner_overhead_seconds = 3;
  c.target_utilization = 0.95;
  Plan plan = MustPlan(c);
  SimOptions opt;
  opt.steps = 200;
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NEAR(plan.prediction.step_seconds, 13, 1e-9);  // learner-bound: 10 s + 3 s
  EXPECT_NEAR(r->steady_step_seconds / plan.prediction.step_seconds, 1, 0.05);
  EXPECT_NEAR(r->steady_utilization, 10.0 / 13, 0.05);
}

TEST(SimulatorDeterminism, SameSeedSameRun) {
  PlanConfig c = TestConfig();
  c.sim.throughput_cv = 0.3;
  c.workers[0].failures_per_hour = 1;
  Plan plan = MustPlan(c);
  SimOptions opt;
  opt.steps = 100;
  Result<SimResult> a = Simulate(plan, opt), b = Simulate(plan, opt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sim_seconds, b->sim_seconds);
  EXPECT_EQ(a->staleness_hist, b->staleness_hist);
  EXPECT_EQ(a->cost_total, b->cost_total);
}

// Deadline-aware dispatch on configs/simulate-mixed-fleet.yaml (fast and four-times-slower spot
// workers, heavy-tailed response lengths, S = 2): on the same seed it wastes fewer of the
// generated tokens than first come, first served (which hands a slow worker long prompts that
// come back stale) and consumes more, and the tokens add up either way.
TEST(SimulatorDeadlineDispatch, WastesLessThanFirstComeFirstServedOnAMixedFleet) {
  Result<Plan> plan = MakePlanFromFile(std::string(ECHELON_TEST_DATA) + "/../../configs/simulate-mixed-fleet.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  std::map<std::string, SimResult> runs;
  for (const std::string dispatch : {"fifo", "deadline"}) {
    Plan p = plan.value();
    p.config.sim.dispatch = dispatch;
    SimOptions opt;
    opt.steps = 120;
    Result<SimResult> r = Simulate(p, opt);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const SimResult& s = r.value();
    EXPECT_EQ(s.counts.consumed, 120u * 64);
    EXPECT_GT(s.tokens_consumed, 0);
    EXPECT_LE(s.tokens_consumed + s.tokens_stale + s.tokens_preempted + s.tokens_refused, s.tokens_generated * (1 + 1e-9))
        << dispatch;
    runs[dispatch] = s;
  }
  EXPECT_EQ(runs["fifo"].counts.predicted_late, 0u);
  EXPECT_GT(runs["deadline"].counts.predicted_late, 0u);
  EXPECT_LT(runs["deadline"].wasted_fraction(), 0.5 * runs["fifo"].wasted_fraction());
  EXPECT_GT(runs["deadline"].tokens_consumed, runs["fifo"].tokens_consumed);
}

// Resumable groups on the same fleet (S = 4, deadline-aware dispatch, one seed): a preempted
// worker's groups continue from what it reported, so less is lost to preemption than when they
// start over; with a 30 s preemption notice on the spot class its actors report everything and
// hand the groups back at once, so more are continued. The tokens add up every time.
TEST(SimulatorResumableGroups, PreemptedGroupsContinueAndANoticeLosesLess) {
  Result<Plan> plan = MakePlanFromFile(std::string(ECHELON_TEST_DATA) + "/../../configs/simulate-mixed-fleet.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  std::map<std::string, SimResult> runs;
  for (const std::string mode : {"off", "on", "notice"}) {
    Plan p = plan.value();
    p.config.sim.dispatch = "deadline";
    p.config.sim.resume = mode != "off";
    p.inputs.max_staleness = 4;
    if (mode == "notice")
      for (WorkerClass& c : p.classes)
        if (c.failures_per_hour > 1) c.preemption_notice_seconds = 30;
    SimOptions opt;
    opt.steps = 120;
    Result<SimResult> r = Simulate(p, opt);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const SimResult& x = r.value();
    EXPECT_EQ(x.counts.consumed, 120u * 64);
    EXPECT_GT(x.failures, 0u);
    EXPECT_LE(x.tokens_consumed + x.tokens_stale + x.tokens_preempted + x.tokens_refused, x.tokens_generated * (1 + 1e-9))
        << mode;
    runs[mode] = x;
  }
  EXPECT_EQ(runs["off"].counts.resumed, 0u);
  EXPECT_GT(runs["on"].counts.resumed, 0u);
  EXPECT_GT(runs["notice"].counts.resumed, runs["on"].counts.resumed);
  EXPECT_LT(runs["on"].tokens_preempted, runs["off"].tokens_preempted);
  EXPECT_LT(runs["notice"].tokens_preempted, runs["off"].tokens_preempted);
}

}  // namespace
}  // namespace echelon::plan
