#include "echelon/sched/batch_assembler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

namespace echelon::sched {
namespace {

std::vector<uint64_t> Ids(const std::vector<IntakeGroup>& groups) {
  std::vector<uint64_t> ids;
  for (const IntakeGroup& g : groups) ids.push_back(g.group_id);
  return ids;
}

TEST(BatchAssembler, DropsExactlyTheGroupsBeyondTheBound) {
  BatchAssembler a(/*max_staleness=*/2, /*batch_groups=*/10, nullptr);
  for (uint64_t g = 0; g < 6; ++g) a.Add(g, static_cast<int64_t>(g));  // versions 0..5
  const IntakeDecision d = a.Assemble(/*step=*/5);
  // 5 - x > 2 for x = 0, 1, 2; kept: 3, 4, 5.
  EXPECT_EQ(Ids(d.dropped), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_TRUE(d.batch.empty());
  EXPECT_EQ(a.waiting(), 3u);
}

TEST(BatchAssembler, TakesTheOldestBGroupsInGroupIdOrder) {
  BatchAssembler a(/*max_staleness=*/4, /*batch_groups=*/3, nullptr);
  // (group, version) in arrival order: the oldest versions are 1 (group 7) and 2 (groups 3, 9).
  const std::vector<std::pair<uint64_t, int64_t>> arrivals = {{9, 2}, {1, 4}, {7, 1}, {3, 2}, {5, 3}};
  for (const auto& [g, v] : arrivals) a.Add(g, v);
  const IntakeDecision d = a.Assemble(/*step=*/4);
  EXPECT_TRUE(d.dropped.empty());
  EXPECT_EQ(Ids(d.batch), (std::vector<uint64_t>{3, 7, 9}));
  EXPECT_EQ(d.batch[1].behavior_version, 1);
  EXPECT_EQ(a.waiting(), 2u);
  // Not enough for another batch.
  EXPECT_TRUE(a.Assemble(4).batch.empty());
}

TEST(BatchAssembler, SettlesDropsAtOnceAndTheBatchOnCommit) {
  SimulatedClock clock;
  Dispatcher d({/*max_staleness=*/0, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock);
  BatchAssembler a(0, 2, &d);
  std::vector<WorkItem> items;
  while (auto w = d.Acquire("a")) items.push_back(*w);
  ASSERT_EQ(items.size(), 2u);
  for (const WorkItem& w : items) {
    ASSERT_EQ(d.Submit(w.group_id, w.lease_id, "a"), SubmitResult::kAccepted);
    a.Add(w.group_id, 0);
  }
  const IntakeDecision first = a.Assemble(0);
  ASSERT_EQ(first.batch.size(), 2u);
  EXPECT_EQ(d.counts().pending, 2u);  // taken, not yet consumed: the update may still fail
  a.Commit(first);
  EXPECT_EQ(d.counts().consumed, 2u);
  d.SetVersion(1);
  items.clear();
  while (auto w = d.Acquire("a")) items.push_back(*w);
  ASSERT_EQ(items.size(), 2u);
  ASSERT_EQ(d.Submit(items[0].group_id, items[0].lease_id, "a"), SubmitResult::kAccepted);
  a.Add(items[0].group_id, /*behavior_version=*/0);  // generated with the old policy
  const IntakeDecision second = a.Assemble(1);     // S = 0: unusable at step 1
  EXPECT_EQ(Ids(second.dropped), std::vector<uint64_t>{items[0].group_id});
  const DispatchCounts c = d.counts();
  EXPECT_EQ(c.dropped_stale, 1u);
  EXPECT_EQ(c.handed_out, c.consumed + c.dropped_stale + c.reissued + c.outstanding + c.pending);
}

// S lowered from 4 to 1 while 5 groups of version 0 are in flight: the window admits nothing
// new until consumption catches up, and every one of the 5 is consumed (the last at staleness 4,
// under the S it was issued with), none dropped; a group issued after the change has S = 1.
// Raising S again extends a waiting group's deadline.
TEST(BatchAssembler, LoweringStalenessDropsNoGroupIssuedBeforeIt) {
  SimulatedClock clock;
  Dispatcher d({/*max_staleness=*/4, /*batch_groups=*/1, /*lease_seconds=*/100}, &clock);
  BatchAssembler a(4, 1, &d);
  std::vector<WorkItem> items;
  while (auto w = d.Acquire("a")) items.push_back(*w);
  ASSERT_EQ(items.size(), 5u);  // (S + v + 1) B
  for (const WorkItem& w : items) {
    ASSERT_EQ(d.Submit(w.group_id, w.lease_id, "a"), SubmitResult::kAccepted);
    a.Add(w.group_id, /*behavior_version=*/0);
  }
  d.SetMaxStaleness(1);
  a.SetMaxStaleness(1);
  EXPECT_EQ(d.AdmittedStaleness(items[4].group_id), 4);
  for (int64_t t = 0; t < 5; ++t) {
    const IntakeDecision step = a.Assemble(t);
    EXPECT_TRUE(step.dropped.empty()) << "step " << t;
    ASSERT_EQ(step.batch.size(), 1u) << "step " << t;
    a.Commit(step);
    d.SetVersion(t + 1);
    // The window (S + v + 1) B = v + 2 against 5 issued: nothing new until v = 4.
    EXPECT_EQ(d.Capacity(), std::max<int64_t>(0, t + 3 - 5)) << "step " << t;
  }
  EXPECT_EQ(d.counts().consumed, 5u);
  EXPECT_EQ(d.counts().dropped_stale, 0u);
  // Version 5: two new groups under S = 1, generated with version 3 (a lagging actor).
  std::optional<WorkItem> late = d.Acquire("a"), later = d.Acquire("a");
  ASSERT_TRUE(late && later);
  EXPECT_EQ(d.AdmittedStaleness(late->group_id), 1);
  ASSERT_EQ(d.Submit(late->group_id, late->lease_id, "a"), SubmitResult::kAccepted);
  ASSERT_EQ(d.Submit(later->group_id, later->lease_id, "a"), SubmitResult::kAccepted);
  a.Add(late->group_id, 3);
  a.Add(later->group_id, 3);
  a.SetMaxStaleness(2);
  const IntakeDecision raised = a.Assemble(5);  // 5 - 3 = 2: within the raised S
  EXPECT_TRUE(raised.dropped.empty());
  EXPECT_EQ(Ids(raised.batch), std::vector<uint64_t>{late->group_id});
  a.Commit(raised);
  a.SetMaxStaleness(1);
  const IntakeDecision lowered = a.Assemble(6);  // 6 - 3 = 3: beyond both the S it was issued with and the current
  EXPECT_EQ(Ids(lowered.dropped), std::vector<uint64_t>{later->group_id});
  const DispatchCounts c = d.counts();
  EXPECT_EQ(c.consumed, 6u);
  EXPECT_EQ(c.dropped_stale, 1u);
  EXPECT_EQ(c.handed_out, c.consumed + c.dropped_stale + c.reissued + c.outstanding + c.pending);
}

TEST(BatchAssembler, ObserverSeesEveryDecisionThatDroppedOrTook) {
  BatchAssembler a(1, 2, nullptr);
  std::vector<IntakeDecision> seen;
  a.set_observer([&](const IntakeDecision& d) { seen.push_back(d); });
  a.Add(1, 0);
  EXPECT_TRUE(a.Assemble(0).batch.empty());  // nothing dropped or taken: not reported
  a.Add(2, 0);
  a.Assemble(0);
  a.Add(3, 0);
  a.Assemble(2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].step, 0);
  EXPECT_EQ(Ids(seen[0].batch), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(Ids(seen[1].dropped), std::vector<uint64_t>{3});
}

// Why oldest first: with the same arrivals, taking the oldest groups never drops more than
// taking them in arrival order, and here drops fewer.
TEST(BatchAssembler, OldestFirstDropsNoMoreThanArrivalOrder) {
  const int64_t S = 2, B = 4;
  std::mt19937 rng(3);
  int64_t total_oldest = 0, total_arrival = 0;
  for (int trial = 0; trial < 200; ++trial) {
    // Each step, a random number of groups arrives with random versions within reach.
    std::vector<std::vector<std::pair<uint64_t, int64_t>>> per_step(12);
    uint64_t next = 0;
    for (int64_t t = 0; t < 12; ++t)
      for (int k = std::uniform_int_distribution<int>(2, 7)(rng); k > 0; --k)
        per_step[t].push_back({next++, std::max<int64_t>(0, t - std::uniform_int_distribution<int64_t>(0, S)(rng))});
    // The rule under test.
    BatchAssembler a(S, B, nullptr);
    int64_t dropped_oldest = 0;
    // The alternative: a FIFO that drops stale groups and takes the first B.
    std::vector<std::pair<uint64_t, int64_t>> fifo;
    int64_t dropped_arrival = 0;
    for (int64_t t = 0; t < 12; ++t) {
      for (const auto& [g, v] : per_step[t]) {
        a.Add(g, v);
        fifo.push_back({g, v});
      }
      dropped_oldest += static_cast<int64_t>(a.Assemble(t).dropped.size());
      std::vector<std::pair<uint64_t, int64_t>> kept;
      for (const auto& e : fifo) {
        if (t - e.second > S) {
          ++dropped_arrival;
        } else {
          kept.push_back(e);
        }
      }
      if (static_cast<int64_t>(kept.size()) >= B) kept.erase(kept.begin(), kept.begin() + B);
      fifo = kept;
    }
    EXPECT_LE(dropped_oldest, dropped_arrival) << "trial " << trial;
    total_oldest += dropped_oldest;
    total_arrival += dropped_arrival;
  }
  EXPECT_LT(total_oldest, total_arrival);
}

}  // namespace
}  // namespace echelon::sched
