// Helpers shared by the planner and simulator unit tests (never by the library).
#pragma once

#include <gtest/gtest.h>

#include "echelon/plan/planner.h"

namespace echelon::plan {

// A controlled two-class catalogue: learner 10 s per update, B = 8 groups of 4, 200 MB
// snapshots over a relay, target utilisation 0.9. "slow": 1 slot, `slow_group_seconds` per
// group at `slow_price_per_hour`; "fast": 2 slots, 8 s per group, $2.50/h.
inline PlanConfig TwoClassTestConfig(double slow_group_seconds, double slow_price_per_hour, uint64_t seed) {
  PlanConfig c;
  c.path = "test";
  c.prices.Add(GpuSpec{"g", 80, 2000, 300, 1.0, "test", "test"});
  c.model.params = 1e8;  // 200 MB snapshots: ~1.8 s over the relay
  c.model.kv_bytes_per_token = 1e5;
  c.shape = RolloutShape{4, 0, 1000};
  c.groups_per_step = 8;
  c.steps = 200;
  c.learner_gpu = c.baseline_gpu = "g";
  c.learner_count = 2;
  c.learner_step_seconds = 10;
  c.learner_price_per_hour = 3.0;
  c.baseline_count = 2;
  c.baseline_step_seconds = 12;
  c.baseline_generate_seconds = 30;
  c.target_utilization = 0.9;
  c.link = LinkSpec{BroadcastMode::kRelay, 10000, 4};
  c.workers.push_back({"slow", "g", 40, slow_price_per_hour, 4 * 1000 / slow_group_seconds, 1, 1000, 1000, 0});
  c.workers.push_back({"fast", "g", 10, 2.50, 2 * 4 * 1000 / 8.0, 2, 1000, 1000, 0});
  c.sim.throughput_cv = 0;
  c.sim.seed = seed;
  return c;
}

inline Plan MustPlan(const PlanConfig& c) {
  Result<Plan> p = MakePlan(c);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.value();
}

}  // namespace echelon::plan
