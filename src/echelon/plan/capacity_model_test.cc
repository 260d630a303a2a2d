#include "echelon/plan/capacity_model.h"

#include <gtest/gtest.h>

#include "echelon/plan/link_model.h"

namespace echelon::plan {
namespace {

WorkerClass Class(int64_t count, int64_t slots, double group_seconds, double price) {
  WorkerClass c;
  c.name = "w";
  c.count = c.available = count;
  c.price_per_hour = price;
  c.decode = MeasuredDecode(/*tokens_per_s=*/slots * 4 * 1000 / group_seconds, slots, RolloutShape{4, 0, 1000});
  c.downlink_mbps = 1000;
  c.uplink_mbps = 1000;
  return c;
}

CapacityInputs Inputs(int64_t s, int64_t kappa) {
  CapacityInputs in;
  in.shape = RolloutShape{4, 0, 1000};
  in.groups_per_step = 8;
  in.train_seconds = 10;
  in.learner_price_per_hour = 36;
  in.max_staleness = s;
  in.publish_period = kappa;
  in.snapshot_bytes = 0;  // instant broadcast unless a test sets it
  return in;
}

TEST(CapacityModel, WorkerBoundUtilisationIsSupplyOverDemand) {
  // 6 workers x 1 slot, 20 s per group: 0.3 groups/s; the learner wants 8 / 10 s = 0.8.
  CapacityPrediction p = PredictCapacity(Inputs(4, 1), {Class(6, 1, 20, 1.0)});
  EXPECT_DOUBLE_EQ(p.supply_groups_per_s, 0.3);
  EXPECT_DOUBLE_EQ(p.step_seconds, 8 / 0.3);
  EXPECT_DOUBLE_EQ(p.utilization, 10 / (8 / 0.3));
  EXPECT_DOUBLE_EQ(p.cost_per_step, (8 / 0.3) * (36 + 6) / 3600);
}

TEST(CapacityModel, LearnerBoundUtilisationIsOne) {
  CapacityPrediction p = PredictCapacity(Inputs(4, 1), {Class(30, 1, 20, 1.0)});  // 1.5 groups/s
  EXPECT_DOUBLE_EQ(p.step_seconds, 10);
  EXPECT_DOUBLE_EQ(p.utilization, 1);
}

TEST(CapacityModel, ShallowWindowThrottlesSupply) {
  // S*B = 8 slots may run, of 30: supply scales by 8/30.
  CapacityPrediction p = PredictCapacity(Inputs(1, 1), {Class(30, 1, 20, 1.0)});
  EXPECT_TRUE(p.window_limited);
  EXPECT_DOUBLE_EQ(p.supply_groups_per_s, 1.5 * 8 / 30);
}

TEST(CapacityModel, SZeroIsLockStep) {
  CapacityInputs in = Inputs(0, 1);
  in.snapshot_bytes = 125e6;  // 1 Gbit: 1 s down each 1000 Mbit/s link; 8 x 1 Gbit share 10 Gbit/s in 0.8 s
  in.link.mode = BroadcastMode::kStar;
  in.link.origin_uplink_mbps = 10000;
  // 8 slots for 8 groups: one wave of 20 s after a 1 s download.
  CapacityPrediction p = PredictCapacity(in, {Class(8, 1, 20, 1.0)});
  EXPECT_DOUBLE_EQ(p.step_seconds, 10 + 1 + 20);
  // 4 slots for 8 groups: two waves.
  p = PredictCapacity(in, {Class(4, 1, 20, 1.0)});
  EXPECT_DOUBLE_EQ(p.step_seconds, 10 + 1 + 40);
}

TEST(CapacityModel, FreshnessBoundAddsSnapshotLagAndGenerationVersions) {
  // step 10 s, broadcast 15 s (2 versions), generation 20 s (2 versions), queue allowance q:
  // kappa <= S + 1 - 2 - 2 - q.
  const int64_t q = kQueueAllowanceSteps;
  EXPECT_EQ(MaxFreshPublishPeriod(4 + q, 10, 15, 20), 1);
  EXPECT_EQ(MaxFreshPublishPeriod(6 + q, 10, 15, 20), 3);
  EXPECT_EQ(MaxFreshPublishPeriod(3 + q, 10, 15, 20), 0);  // no kappa is fresh
  // Fast links and generation: kappa = S - 1 - q.
  EXPECT_EQ(MaxFreshPublishPeriod(5 + q, 10, 1, 9), 4);
}

TEST(CapacityModel, LearnerOverheadLengthensTheStepButIsNotBusyTime) {
  CapacityInputs in = Inputs(4, 1);
  in.overhead_seconds = 2;
  // Learner-bound (1.5 groups/s against 0.8 wanted): T_train + T_over, U = 10 / 12.
  CapacityPrediction p = PredictCapacity(in, {Class(30, 1, 20, 1.0)});
  EXPECT_DOUBLE_EQ(p.step_seconds, 12);
  EXPECT_DOUBLE_EQ(p.utilization, 10.0 / 12);
  // Worker-bound (0.3 groups/s): the overhead hides behind generation.
  p = PredictCapacity(in, {Class(6, 1, 20, 1.0)});
  EXPECT_DOUBLE_EQ(p.step_seconds, 8 / 0.3);
  // Lock-step: generation starts after the update, alongside the overhead.
  in = Inputs(0, 1);
  in.overhead_seconds = 2;
  EXPECT_DOUBLE_EQ(PredictCapacity(in, {Class(8, 1, 20, 1.0)}).step_seconds, 10 + 20);
  in.overhead_seconds = 25;
  EXPECT_DOUBLE_EQ(PredictCapacity(in, {Class(8, 1, 20, 1.0)}).step_seconds, 10 + 25);
}

TEST(CapacityModel, ClassMinArrivalStalenessCountsWholeStepsOfBroadcastAndGeneration) {
  EXPECT_EQ(ClassMinArrivalStaleness(10, 0, 9), 0);     // back within the step it started
  EXPECT_EQ(ClassMinArrivalStaleness(10, 15, 20), 3);   // 35 s: 3 whole steps
  EXPECT_EQ(ClassMinArrivalStaleness(10, 0, 61), 6);
  EXPECT_EQ(ClassMinArrivalStaleness(10, 0, 19.9999999999), 2);  // float dust is not a step short
}

TEST(LinkModel, StarGrowsLinearlyRelayStaysNearlyFlat) {
  LinkSpec star{BroadcastMode::kStar, 1000, 4};
  LinkSpec relay{BroadcastMode::kRelay, 1000, 4};
  const double gb = 1e9;
  EXPECT_DOUBLE_EQ(SnapshotSeconds(star, gb, 1000, 1, 1000), 8);
  EXPECT_DOUBLE_EQ(SnapshotSeconds(star, gb, 1000, 64, 1000), 64 * 8);
  const double chunk_s = 4 * 1048576 * 8 / 1e9;
  // 8 receivers: 8/9 of a transfer by capacity, but the origin must send every byte once.
  EXPECT_DOUBLE_EQ(SnapshotSeconds(relay, gb, 1000, 8, 1000), 8 + 3 * chunk_s);
  const double r1024 = SnapshotSeconds(relay, gb, 1000, 1024, 1000);
  EXPECT_DOUBLE_EQ(r1024, 8 + 10 * chunk_s);
  EXPECT_LT(r1024 / SnapshotSeconds(relay, gb, 1000, 8, 1000), 1.05);
  // Slow relays: n copies through the receivers' uplinks (100 Mbit/s) and the origin's.
  EXPECT_DOUBLE_EQ(SnapshotSeconds(relay, gb, 1000, 90, 100), 90 * 8e9 / (1000e6 + 90 * 100e6) + 6 * 10 * chunk_s);
  // A slow downlink bounds its own worker.
  EXPECT_DOUBLE_EQ(SnapshotSeconds(relay, gb, 100, 8, 1000), 80 + 3 * 10 * chunk_s);
  EXPECT_EQ(SnapshotSeconds(relay, 0, 1000, 8, 1000), 0);
}

// Receivers that upload nothing (relay uplink 0): the origin alone carries every copy, and the
// time stays a number (0 x a division by zero once made it NaN).
TEST(LinkModel, ReceiversThatUploadNothingLeaveTheOriginToCarryEveryCopy) {
  LinkSpec relay{BroadcastMode::kRelay, 1000, 4};
  const double gb = 1e9;
  const double chunk_s = 4 * 1048576 * 8 / 1e9;
  EXPECT_DOUBLE_EQ(SnapshotSeconds(relay, gb, 1000, 1, 0), 8);
  EXPECT_DOUBLE_EQ(SnapshotSeconds(relay, gb, 1000, 0, 0), 8);
  EXPECT_DOUBLE_EQ(SnapshotSeconds(relay, gb, 1000, 8, 0), 64 + 3 * chunk_s);
}

TEST(CapacityModel, AvailabilityDiscountsFailures) {
  WorkerClass c = Class(1, 1, 36, 1.0);
  EXPECT_DOUBLE_EQ(Availability(c, 10, 100), 1);
  c.failures_per_hour = 1;  // per failure: half a group (18 s) lost, 110 s away
  EXPECT_DOUBLE_EQ(Availability(c, 10, 100), (1 - 18.0 / 3600) / (1 + 110.0 / 3600));
}

}  // namespace
}  // namespace echelon::plan
