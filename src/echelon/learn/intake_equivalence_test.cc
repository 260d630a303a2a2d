// The learner loop and the simulator consume rollouts by one rule (sched::BatchAssembler).
// This test holds the real loop's first step, BatchCollector, to the simulator's decisions:
// the simulator runs a heterogeneous fleet with noisy generation times, and every group it
// accepts (time, id, behaviour version) is replayed into a BatchCollector on simulated time,
// with each update taking the simulator's T_train. Both must drop and take exactly the same
// groups at the same steps.
#include <gtest/gtest.h>

#include <deque>
#include <vector>

#include "echelon/learn/batch_collector.h"
#include "echelon/plan/simulator.h"
#include "echelon/plan/testing.h"

namespace echelon::learn {
namespace {

struct Arrival {
  double time;
  uint64_t group_id;
  int64_t behavior_version;
};

// Arrivals at their simulated times: Drain returns what has arrived by now, first moving the
// clock to the next arrival when it falls within the timeout.
class ScriptedArrivals : public ArrivalQueue {
 public:
  ScriptedArrivals(std::deque<Arrival> arrivals, SimulatedClock* clock) : pending_(std::move(arrivals)), clock_(clock) {}
  std::vector<contract::GroupRollout> Drain(double timeout_seconds) override {
    const double now = clock_->Now();
    if (!pending_.empty() && pending_.front().time > now) {
      if (pending_.front().time <= now + timeout_seconds) {
        clock_->Set(pending_.front().time);
      } else {
        clock_->Set(now + timeout_seconds);
      }
    }
    std::vector<contract::GroupRollout> out;
    while (!pending_.empty() && pending_.front().time <= clock_->Now()) {
      contract::GroupRollout g;
      g.group_id = pending_.front().group_id;
      g.behavior_version = pending_.front().behavior_version;
      out.push_back(g);
      pending_.pop_front();
    }
    return out;
  }

 private:
  std::deque<Arrival> pending_;
  SimulatedClock* clock_;
};

void ExpectSameDecisions(const std::vector<sched::IntakeDecision>& sim, const std::vector<sched::IntakeDecision>& real) {
  ASSERT_EQ(sim.size(), real.size());
  for (size_t i = 0; i < sim.size(); ++i) {
    EXPECT_EQ(sim[i].step, real[i].step) << "decision " << i;
    EXPECT_EQ(sim[i].dropped, real[i].dropped) << "decision " << i << " (step " << sim[i].step << ")";
    EXPECT_EQ(sim[i].batch, real[i].batch) << "decision " << i << " (step " << sim[i].step << ")";
  }
}

TEST(IntakeEquivalence, LearnerLoopAndSimulatorTakeTheSameDecisions) {
  struct Case {
    uint64_t seed;
    int64_t staleness, workers;
    double train_seconds;
  };
  // A small pool keeps the learner waiting for its B-th group; a large pool and a slow update
  // let groups queue up, so the rule chooses among more than B of them.
  for (const Case& k : {Case{1, 1, 12, 10}, Case{2, 1, 12, 10}, Case{3, 3, 40, 60}, Case{4, 2, 60, 60}}) {
    const uint64_t seed = k.seed;
    // Slow workers (40 s a group against a 10 s update) make stale groups; noise spreads arrivals.
    plan::PlanConfig c = plan::TwoClassTestConfig(/*slow_group_seconds=*/40, /*slow_price_per_hour=*/0.1, seed);
    c.max_staleness = k.staleness;
    c.publish_period = 1;
    c.sim.throughput_cv = 0.6;
    c.sim.workers = k.workers;  // a fixed pool of both classes
    c.learner_step_seconds = k.train_seconds;
    const plan::Plan plan = plan::MustPlan(c);
    const int64_t steps = 120;

    std::deque<Arrival> arrivals;
    std::vector<sched::IntakeDecision> sim_decisions;
    plan::SimOptions opt;
    opt.steps = steps;
    opt.on_arrival = [&](double t, uint64_t g, int64_t v) { arrivals.push_back({t, g, v}); };
    opt.on_intake = [&](const sched::IntakeDecision& d) { sim_decisions.push_back(d); };
    Result<plan::SimResult> r = plan::Simulate(plan, opt);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_GT(r->counts.dropped_stale, 0u) << "seed " << seed << ": no stale drops, the test would prove little";

    SimulatedClock clock;
    ScriptedArrivals queue(arrivals, &clock);
    CollectorOptions co;
    co.max_staleness = plan.inputs.max_staleness;
    co.batch_groups = plan.inputs.groups_per_step;
    co.stall_timeout_seconds = 1e9;
    sched::Dispatcher dispatcher({co.max_staleness, co.batch_groups, 1e9}, &clock);  // knows no group: settles nothing
    BatchCollector collector(co, &dispatcher, &queue, nullptr, &clock);
    std::vector<sched::IntakeDecision> real_decisions;
    collector.assembler().set_observer([&](const sched::IntakeDecision& d) { real_decisions.push_back(d); });
    for (int64_t t = 0; t < steps; ++t) {
      Result<std::optional<CollectedBatch>> b = collector.Collect(t, nullptr);
      ASSERT_TRUE(b.ok() && b.value().has_value()) << "step " << t;
      clock.Advance(plan.inputs.train_seconds);  // the update, as the simulator times it
      collector.Commit(*b.value());
    }
    ASSERT_GE(sim_decisions.size(), static_cast<size_t>(steps));  // every batch, and the drops
    ExpectSameDecisions(sim_decisions, real_decisions);
  }
}

}  // namespace
}  // namespace echelon::learn
