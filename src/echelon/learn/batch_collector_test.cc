// BatchCollector: step 1 of every update.
#include "echelon/learn/batch_collector.h"

#include <gtest/gtest.h>

namespace echelon::learn {
namespace {

// Always B fresh groups of the current version waiting: a learner that never waits.
class Flood : public ArrivalQueue {
 public:
  std::vector<contract::GroupRollout> Drain(double) override {
    std::vector<contract::GroupRollout> out(4);
    for (contract::GroupRollout& g : out) g.group_id = next_++;
    return out;
  }

 private:
  uint64_t next_ = 0;
};

TEST(BatchCollectorTest, AnInterruptIsHonouredWhileGroupsKeepArriving) {
  SimulatedClock clock;
  sched::Dispatcher dispatcher({/*max_staleness=*/1, /*batch_groups=*/4, /*lease_seconds=*/10}, &clock);
  Flood flood;
  CollectorOptions o;
  o.max_staleness = 1;
  o.batch_groups = 4;
  BatchCollector collector(o, &dispatcher, &flood, nullptr, &clock);
  std::atomic<bool> interrupt{false};
  Result<std::optional<CollectedBatch>> got = collector.Collect(0, &interrupt);
  ASSERT_TRUE(got.ok() && got->has_value());  // a batch is ready at once
  interrupt = true;
  got = collector.Collect(0, &interrupt);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());  // stopped, although another batch was ready
}

// Regression: silent actors were evicted (and expired leases re-issued) only while the learner
// waited, so with actors faster than the learner a killed actor kept its leases for the whole
// run.
TEST(BatchCollectorTest, SilentActorsAreEvictedWhenABatchIsAlwaysReady) {
  SimulatedClock clock;
  // Flood's groups are of version 0: a bound of 8 keeps them usable for the three updates.
  sched::Dispatcher dispatcher({/*max_staleness=*/8, /*batch_groups=*/4, /*lease_seconds=*/10}, &clock);
  Flood flood;
  CollectorOptions o;
  o.max_staleness = 8;
  o.batch_groups = 4;
  int sweeps = 0;
  BatchCollector collector(o, &dispatcher, &flood, [&] { ++sweeps; return std::vector<std::string>{}; }, &clock);
  for (int64_t step = 0; step < 3; ++step) {
    Result<std::optional<CollectedBatch>> got = collector.Collect(step, nullptr);
    ASSERT_TRUE(got.ok() && got->has_value());
    collector.Commit(got->value());
  }
  EXPECT_EQ(sweeps, 3) << "one liveness sweep per update, although every batch was ready at once";
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// Dynamic sampling: groups whose rewards have no spread are settled as filtered on arrival and
// never enter a batch; the dispatcher's counts add up with them and their admission slots go to
// new prompts; past the limit they fill the batch.
TEST(BatchCollectorTest, DynamicSamplingFiltersGroupsWithoutASpread) {
  SimulatedClock clock;
  sched::Dispatcher dispatcher({/*max_staleness=*/0, /*batch_groups=*/2, /*lease_seconds=*/100}, &clock);
  // Hands over what arrived; once empty, raises `dry` (so Collect returns when nothing is left).
  struct Queue : ArrivalQueue {
    std::vector<contract::GroupRollout> Drain(double) override {
      if (groups.empty()) *dry = true;
      return std::exchange(groups, {});
    }
    Status failure() const override { return Status::Ok(); }
    std::atomic<bool>* dry = nullptr;
    std::vector<contract::GroupRollout> groups;
  } queue;
  std::atomic<bool> dry{false};
  queue.dry = &dry;
  // Hands out a group and submits it with these rewards.
  const auto arrive = [&](std::vector<double> rewards) {
    const sched::WorkItem w = *dispatcher.Acquire("a#1");
    EXPECT_EQ(dispatcher.Submit(w.group_id, w.lease_id, "a#1"), sched::SubmitResult::kAccepted);
    contract::GroupRollout g;
    g.group_id = w.group_id;
    g.lease_id = w.lease_id;
    g.behavior_version = w.dispatch_version;
    for (double r : rewards) g.episodes.push_back(data::Episode{{}, r, false, {}});
    queue.groups.push_back(g);
  };
  CollectorOptions o;
  o.batch_groups = 2;
  o.dynamic_sampling = true;
  o.max_filtered_per_batch = 2;  // 4 groups per update
  BatchCollector collector(o, &dispatcher, &queue, nullptr, &clock);
  const auto collect = [&](int64_t step) {
    dry = false;
    return collector.Collect(step, &dry).value();
  };
  arrive({1, 1, 1});
  arrive({0, 1, 0});
  EXPECT_EQ(dispatcher.Capacity(), 0) << "S = 0, B = 2: two groups in flight fill the window";
  EXPECT_FALSE(collect(0).has_value());
  EXPECT_EQ(dispatcher.counts().filtered, 1u);
  EXPECT_EQ(dispatcher.Capacity(), 1) << "the filtered group's slot went back to admission";
  arrive({0.5, 0.5, 0.5});
  EXPECT_FALSE(collect(0).has_value());
  arrive({1, 0, 0});
  const std::optional<CollectedBatch> first = collect(0);
  ASSERT_TRUE(first.has_value());
  const CollectedBatch& b = *first;
  ASSERT_EQ(b.groups.size(), 2u);
  for (const contract::GroupRollout& g : b.groups) EXPECT_FALSE(ZeroSpread(g));
  EXPECT_EQ(b.filtered, 2);
  collector.Commit(b);
  const sched::DispatchCounts c = dispatcher.counts();
  EXPECT_EQ(c.filtered, 2u);
  EXPECT_EQ(c.consumed, 2u);
  EXPECT_EQ(c.handed_out, c.consumed + c.dropped_stale + c.filtered + c.reissued + c.outstanding + c.pending);
  // Past the limit (4 filtered for one update) a group without a spread enters the batch.
  dispatcher.SetVersion(1);
  for (int i = 0; i < 4; ++i) {
    arrive({0, 0});
    EXPECT_FALSE(collect(1).has_value());
  }
  arrive({2, 2});
  EXPECT_FALSE(collect(1).has_value());
  arrive({1, 2});
  const std::optional<CollectedBatch> second = collect(1);
  ASSERT_TRUE(second.has_value());
  const CollectedBatch& last = *second;
  EXPECT_EQ(last.filtered, 4);
  ASSERT_EQ(last.groups.size(), 2u);
  EXPECT_NE(ZeroSpread(last.groups[0]), ZeroSpread(last.groups[1]));
}

}  // namespace
}  // namespace echelon::learn
