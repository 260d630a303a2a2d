#include "echelon/plan/planner.h"

#include <gtest/gtest.h>

#include "echelon/plan/simulator.h"
#include "echelon/plan/testing.h"

namespace echelon::plan {
namespace {

// Learner: 10 s per update, B = 8 groups of 4, target 0.9 (freshness judged at 10 / 0.9 s).
// "slow": 60 s per group, $0.10/h: the cheapest throughput, but a group spans 5-6 versions.
// "fast": 8 s per group, 2 at once, $2.50/h.
PlanConfig FreshnessConfig() {
  return TwoClassTestConfig(/*slow_group_seconds=*/60, /*slow_price_per_hour=*/0.10, /*seed=*/5);
}

bool NoteMentions(const Plan& p, const std::string& text) {
  for (const std::string& n : p.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

TEST(PlannerFreshness, ClassWhoseGroupsArriveTooStaleIsNeitherCountedNorPicked) {
  PlanConfig c = FreshnessConfig();
  c.max_staleness = 4;
  c.publish_period = 1;
  Plan plan = MustPlan(c);
  // At the target step of 10 / 0.9 s: a ~1.8 s download plus 60 s of generation is 5 whole
  // steps, so every slow group would arrive at least 5 versions old; a fast one (8 s) 0.
  const std::vector<int64_t> arrival = ClassMinArrivalStalenesses(plan, {40, 10});
  EXPECT_EQ(arrival[0], 5);
  EXPECT_EQ(arrival[1], 0);
  EXPECT_EQ(plan.class_fresh, (std::vector<bool>{false, true}));
  EXPECT_EQ(plan.classes[0].count, 0);
  EXPECT_EQ(plan.classes[1].count, 3);  // 0.72 groups/s wanted, 0.25 each
  EXPECT_TRUE(plan.activation.feasible);
  EXPECT_TRUE(plan.prediction.fresh);
  EXPECT_TRUE(NoteMentions(plan, "worker class slow: a group takes 60.0 s")) << plan.notes.size();
  EXPECT_TRUE(NoteMentions(plan, "every group would be at least 5 versions old when it arrives (S = 4)"));
  const FreshActivation fa = ActivateFresh(plan, {40, 10});
  EXPECT_EQ(fa.offers[0].rate, 0);  // not counted towards the demand
  EXPECT_GT(fa.offers[1].rate, 0);
  EXPECT_GT(ActivationOffers(plan, {40, 10})[0].rate, 0);  // only freshness removes it
  const nlohmann::json j = PlanJson(plan);
  EXPECT_FALSE(j["workers"][0]["fresh"].get<bool>());
  EXPECT_TRUE(j["workers"][1]["fresh"].get<bool>());
  // $ per million consumed tokens: $/step over the completion tokens of an update, B x G x L.
  const double consumed = static_cast<double>(c.groups_per_step) * c.shape.group_size * c.shape.completion_tokens;
  EXPECT_DOUBLE_EQ(j["cost_per_million_consumed_tokens"].get<double>(), plan.prediction.cost_per_step / consumed * 1e6);
  EXPECT_NE(PlanTable(plan).find("$/M consumed tokens"), std::string::npos);

  // What activation would have bought without the condition: the cheap slow class, whose
  // groups the freshness bound says arrive too stale.
  std::vector<WorkerClass> blind = plan.classes;
  blind[0].count = 40;
  blind[1].count = 1;
  EXPECT_FALSE(PredictCapacity(plan.inputs, blind).fresh);
}

// 12 cheap workers on 1 Mbit/s uplinks behind a 300 Mbit/s origin: chosen with one fast worker
// (their 0.6 groups/s fall short of 0.72), the 13 receivers' broadcast takes ~16 s and both
// classes arrive too stale for S = 1; three fast workers alone get it in ~5 s and are in time.
// Leaving out every stale class at once left nothing; leaving out the slowest relay first
// keeps the fast class.
TEST(PlannerFreshness, StaleSlowRelayLeavesFirstSoTheOthersStayUsable) {
  PlanConfig c = TwoClassTestConfig(/*slow_group_seconds=*/20, /*slow_price_per_hour=*/0.10, /*seed=*/5);
  c.max_staleness = 1;
  c.publish_period = 1;
  c.link.origin_uplink_mbps = 300;
  c.workers[0].available = 12;
  c.workers[0].uplink_mbps = 1;
  Plan plan = MustPlan(c);
  EXPECT_TRUE(plan.activation.feasible);
  EXPECT_EQ(plan.classes[0].count, 0);
  EXPECT_GT(plan.classes[1].count, 0);
  EXPECT_EQ(plan.class_fresh, (std::vector<bool>{false, true}));
}

TEST(PlannerFreshness, LargerStalenessAdmitsTheSlowClass) {
  PlanConfig c = FreshnessConfig();
  c.max_staleness = 10;
  c.publish_period = 1;
  Plan plan = MustPlan(c);
  EXPECT_GT(plan.classes[0].count, 0);  // usable at S = 10 (and the plan fresh: bound 9) and cheapest
  EXPECT_TRUE(plan.prediction.fresh);
  EXPECT_FALSE(NoteMentions(plan, "worker class slow"));
}

TEST(PlannerFreshness, RecommendedStalenessTradesCostAgainstStaleness) {
  PlanConfig c = FreshnessConfig();
  // A plan is valid when its staleness bound (lag + generation + queue allowance) <= S:
  // 4 with fast workers only, 9 with slow ones.
  c.staleness_cap = 6;  // the slow class never fits: the smallest S where "fast" does
  Plan plan = MustPlan(c);
  EXPECT_EQ(plan.inputs.max_staleness, 4);
  EXPECT_EQ(plan.classes[0].count, 0);
  EXPECT_TRUE(plan.prediction.fresh);
  c.staleness_cap = 10;  // S = 9 admits the slow class at a lower $/step
  Plan wider = MustPlan(c);
  EXPECT_EQ(wider.inputs.max_staleness, 9);
  EXPECT_GT(wider.classes[0].count, 0);
  EXPECT_TRUE(wider.prediction.fresh);
  EXPECT_LT(wider.prediction.cost_per_step, plan.prediction.cost_per_step);
}

TEST(PlannerFreshness, SimulatorReactivationNeverActivatesAStaleClass) {
  PlanConfig c = FreshnessConfig();
  c.max_staleness = 4;
  c.publish_period = 1;
  c.workers[1].failures_per_hour = 6;  // fast workers fail often: activation runs again and again
  c.sim.restart_seconds = 200;
  c.sim.startup_seconds = 10;
  c.sim.detect_seconds = 5;
  Plan plan = MustPlan(c);
  int64_t max_slow = 0;
  SimOptions opt;
  opt.steps = 200;
  opt.on_step = [&](const nlohmann::json& j) {
    max_slow = std::max(max_slow, j["billed_by_class"]["slow"].get<int64_t>());
  };
  Result<SimResult> r = Simulate(plan, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(r->failures, 5u);
  EXPECT_GT(r->activations, 0u);
  EXPECT_EQ(max_slow, 0);
}

}  // namespace
}  // namespace echelon::plan
