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
