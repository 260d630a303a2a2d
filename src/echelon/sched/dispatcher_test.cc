#include "echelon/sched/dispatcher.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <thread>
#include <vector>

namespace echelon::sched {
namespace {

// Every hand-out ends exactly once, or is still open: the contract's accounting identity.
void ExpectCountsAddUp(const Dispatcher& d) {
  DispatchCounts c = d.counts();
  EXPECT_EQ(c.handed_out, c.consumed + c.dropped_stale + c.reissued + c.outstanding + c.pending);
}

DispatcherOptions Options(int64_t s, int64_t b, double lease = 10) {
  DispatcherOptions o;
  o.max_staleness = s;
  o.batch_groups = b;
  o.lease_seconds = lease;
  o.max_leases_per_worker = 0;  // these tests take many leases with one actor
  return o;
}

// Lease hoarding: a worker that acquires and never submits held the whole admission window
// (and, with nothing submitted, tripped the learner's stall abort). Its actors together now
// hold at most max_leases_per_worker leases; other workers still get work, and a lease that
// ends (submitted, expired) frees a place.
TEST(DispatcherLeases, OneWorkerHoldsAtMostItsCap) {
  SimulatedClock clock;
  DispatcherOptions o = Options(/*s=*/1, /*b=*/16, /*lease=*/10);
  o.max_leases_per_worker = 3;
  Dispatcher d(o, &clock);
  std::vector<WorkItem> hoarded;
  for (int i = 0; i < 10; ++i) {
    // Two connections of the same worker share its cap.
    if (auto w = d.Acquire(i % 2 ? "hoarder#1" : "hoarder#2")) hoarded.push_back(*w);
  }
  EXPECT_EQ(hoarded.size(), 3u);
  EXPECT_EQ(d.lease_capped(), 7u);
  EXPECT_EQ(d.capped_workers(), std::set<std::string>{"hoarder"});
  // The window (32 groups) is still open to everyone else.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(d.Acquire("honest#1").has_value());
  EXPECT_EQ(d.Capacity(), 32 - 6);
  // A submitted lease frees a place; so does an expired one.
  EXPECT_EQ(d.Submit(hoarded[0].group_id, hoarded[0].lease_id, "hoarder#2"), SubmitResult::kAccepted);
  EXPECT_TRUE(d.Acquire("hoarder#1").has_value());
  EXPECT_FALSE(d.Acquire("hoarder#1").has_value());
  clock.Advance(11);
  EXPECT_EQ(d.ExpireLeases(), 6);
  EXPECT_TRUE(d.Acquire("hoarder#3").has_value());
  ExpectCountsAddUp(d);
}

TEST(DispatcherCapacity, LiteralValuesOfTheAdmissionRule) {
  struct Case { int64_t s, v, b, expected; };
  const Case cases[] = {{0, 0, 1, 1}, {0, 0, 4, 4}, {2, 0, 4, 12}, {2, 3, 4, 24},
                        {1, 5, 3, 21}, {8, 0, 2, 18}, {4, 2, 32, 224}};
  for (const Case& c : cases) {
    SimulatedClock clock;
    Dispatcher d(Options(c.s, c.b), &clock);
    d.SetVersion(c.v);
    EXPECT_EQ(d.Capacity(), c.expected) << "S=" << c.s << " v=" << c.v << " B=" << c.b;
  }
}

TEST(DispatcherCapacity, AcquireStopsExactlyAtTheLimit) {
  for (int64_t s : {0, 1, 2, 4, 8}) {
    for (int64_t b : {1, 3, 32}) {
      for (int64_t v : {0, 1, 5}) {
        SimulatedClock clock;
        Dispatcher d(Options(s, b), &clock);
        d.SetVersion(v);
        int64_t granted = 0;
        while (d.Acquire("a")) ++granted;
        EXPECT_EQ(granted, (s + v + 1) * b) << "S=" << s << " v=" << v << " B=" << b;
        EXPECT_EQ(d.Capacity(), 0);
        ExpectCountsAddUp(d);
      }
    }
  }
}

TEST(DispatcherCapacity, ConsumedKeepsItsSlotDroppedFreesIt) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/1, /*b=*/2), &clock);
  std::vector<WorkItem> items;
  while (auto w = d.Acquire("a")) items.push_back(*w);
  ASSERT_EQ(items.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(d.Submit(items[i].group_id, items[i].lease_id, "a"), SubmitResult::kAccepted);
  }
  d.Settle(items[0].group_id, Outcome::kConsumed);
  d.Settle(items[1].group_id, Outcome::kConsumed);
  EXPECT_EQ(d.Capacity(), 0);  // consumed groups still count against (S+v+1)*B
  d.Settle(items[2].group_id, Outcome::kDroppedStale);
  EXPECT_EQ(d.Capacity(), 1);  // a dropped group frees its slot
  d.SetVersion(1);
  EXPECT_EQ(d.Capacity(), 3);  // (1+1+1)*2 - (2 consumed + 1 running)
  ExpectCountsAddUp(d);
}

TEST(Dispatcher, ScriptedLeaseExpiryReissueAndRefusals) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/0, /*b=*/2, /*lease=*/10), &clock);
  auto g0 = d.Acquire("a0");
  auto g1 = d.Acquire("a1");
  ASSERT_TRUE(g0 && g1);
  EXPECT_EQ(g0->group_id, 0u);
  EXPECT_EQ(g1->group_id, 1u);
  EXPECT_FALSE(g0->reissue);
  EXPECT_FALSE(d.Acquire("a2"));  // S=0, B=2: two groups in flight at v=0
  EXPECT_EQ(d.Submit(0, g0->lease_id, "a0"), SubmitResult::kAccepted);

  clock.Set(11);  // a1's lease (deadline 10) has expired
  auto again = d.Acquire("a2");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->group_id, 1u);  // same group, so the same prompt
  EXPECT_TRUE(again->reissue);
  EXPECT_NE(again->lease_id, g1->lease_id);
  DispatchCounts c = d.counts();
  EXPECT_EQ(c.handed_out, 3u);
  EXPECT_EQ(c.reissued, 1u);
  EXPECT_EQ(c.outstanding, 1u);
  EXPECT_EQ(c.pending, 1u);

  EXPECT_EQ(d.Submit(1, g1->lease_id, "a1"), SubmitResult::kNotLeaseHolder);  // late, after re-issue
  EXPECT_EQ(d.Submit(1, again->lease_id, "a2"), SubmitResult::kAccepted);
  EXPECT_EQ(d.Submit(1, again->lease_id, "a2"), SubmitResult::kAlreadySettled);  // duplicate
  d.Settle(0, Outcome::kConsumed);
  d.Settle(1, Outcome::kConsumed);
  d.Settle(0, Outcome::kConsumed);  // settled at most once: ignored
  EXPECT_EQ(d.Submit(0, g0->lease_id, "a0"), SubmitResult::kAlreadySettled);
  EXPECT_EQ(d.Submit(1, g1->lease_id, "a1"), SubmitResult::kNotLeaseHolder);
  EXPECT_EQ(d.Submit(99, 1, "a0"), SubmitResult::kUnknownGroup);

  c = d.counts();
  EXPECT_EQ(c.consumed, 2u);
  EXPECT_EQ(c.refused, 5u);
  EXPECT_EQ(c.pending, 0u);
  ExpectCountsAddUp(d);
  EXPECT_FALSE(d.Acquire("a0"));  // consumed groups keep their slots until v advances
  d.SetVersion(1);
  auto g2 = d.Acquire("a0");
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->group_id, 2u);
  EXPECT_EQ(g2->dispatch_version, 1);
}

TEST(Dispatcher, LeaseHoldsUntilItsDeadlineInclusive) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/0, /*b=*/2, /*lease=*/10), &clock);
  auto a = d.Acquire("a");
  auto b = d.Acquire("b");
  clock.Set(10);
  EXPECT_EQ(d.Submit(a->group_id, a->lease_id, "a"), SubmitResult::kAccepted);
  clock.Set(10.5);
  EXPECT_EQ(d.Submit(b->group_id, b->lease_id, "b"), SubmitResult::kNotLeaseHolder);
  EXPECT_EQ(d.counts().reissued, 1u);
  EXPECT_EQ(d.counts().awaiting_reissue, 1u);
  EXPECT_EQ(d.ExpireLeases(), 0);  // already collected by Submit
}

TEST(Dispatcher, ALeaseSubmittedByAnotherActorIsForeignAndStaysWithItsHolder) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/0, /*b=*/2, /*lease=*/10), &clock);
  auto a = d.Acquire("a");
  EXPECT_EQ(d.Submit(a->group_id, a->lease_id, "b"), SubmitResult::kForeignLease);
  EXPECT_EQ(d.Submit(a->group_id, a->lease_id, "a"), SubmitResult::kAccepted);
  EXPECT_EQ(d.counts().refused, 1u);
}

TEST(Dispatcher, AForgedSubmissionIsReissuedOnceAndCountedAsReissued) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/0, /*b=*/2, /*lease=*/10), &clock);
  auto a = d.Acquire("a");
  ASSERT_EQ(d.Submit(a->group_id, a->lease_id, "a"), SubmitResult::kAccepted);
  d.Reissue(a->group_id);
  d.Reissue(a->group_id);  // no longer pending: ignored
  EXPECT_EQ(d.counts().reissued, 1u);
  EXPECT_EQ(d.counts().awaiting_reissue, 1u);
  auto again = d.Acquire("b");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->group_id, a->group_id);
  EXPECT_TRUE(again->reissue);
  EXPECT_EQ(d.Submit(a->group_id, a->lease_id, "a"), SubmitResult::kNotLeaseHolder);
  EXPECT_EQ(d.Submit(again->group_id, again->lease_id, "b"), SubmitResult::kAccepted);
}

TEST(Dispatcher, EvictReissuesOnlyThatActorsWorkInOrderBeforeNewGroups) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/3, /*b=*/2), &clock);  // capacity 8
  auto a0 = d.Acquire("a");
  auto a1 = d.Acquire("a");
  auto b0 = d.Acquire("b");
  EXPECT_EQ(d.Evict("a"), 2);
  EXPECT_EQ(d.Evict("nobody"), 0);
  DispatchCounts c = d.counts();
  EXPECT_EQ(c.reissued, 2u);
  EXPECT_EQ(c.awaiting_reissue, 2u);
  EXPECT_EQ(d.Capacity(), 5);  // groups awaiting re-issue keep their slots
  auto r0 = d.Acquire("b");
  auto r1 = d.Acquire("b");
  auto fresh = d.Acquire("b");
  EXPECT_EQ(r0->group_id, a0->group_id);
  EXPECT_EQ(r1->group_id, a1->group_id);
  EXPECT_TRUE(r0->reissue && r1->reissue);
  EXPECT_EQ(fresh->group_id, 3u);
  EXPECT_FALSE(fresh->reissue);
  EXPECT_EQ(d.Submit(a0->group_id, a0->lease_id, "a"), SubmitResult::kNotLeaseHolder);
  EXPECT_EQ(d.Submit(b0->group_id, b0->lease_id, "b"), SubmitResult::kAccepted);
  ExpectCountsAddUp(d);
}

TEST(Dispatcher, SettleIgnoresGroupsThatWereNotSubmitted) {
  SimulatedClock clock;
  Dispatcher d(Options(0, 1), &clock);
  auto w = d.Acquire("a");
  d.Settle(w->group_id, Outcome::kConsumed);
  d.Settle(42, Outcome::kDroppedStale);
  EXPECT_EQ(d.counts().consumed, 0u);
  EXPECT_EQ(d.counts().dropped_stale, 0u);
  EXPECT_EQ(d.Submit(w->group_id, w->lease_id, "a"), SubmitResult::kAccepted);
  ExpectCountsAddUp(d);
}

TEST(Dispatcher, VersionIsMonotonic) {
  SimulatedClock clock;
  Dispatcher d(Options(0, 1), &clock);
  d.SetVersion(3);
  d.SetVersion(2);
  EXPECT_EQ(d.version(), 3);
}

TEST(Dispatcher, ConcurrentActorsGetDistinctGroups) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/999, /*b=*/1), &clock);  // capacity 1000
  std::vector<std::vector<uint64_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&d, &got, t] {
      while (auto w = d.Acquire("actor-" + std::to_string(t))) {
        if (d.Submit(w->group_id, w->lease_id, "actor-" + std::to_string(t)) == SubmitResult::kAccepted) {
          got[t].push_back(w->group_id);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (const auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(*all.rbegin(), 999u);
  EXPECT_EQ(d.counts().pending, 1000u);
  ExpectCountsAddUp(d);
}

}  // namespace
}  // namespace echelon::sched

namespace echelon::sched {
namespace {

TEST(DispatcherRestore, UnsettledGroupsAreReissuedOnceAndCountsStillAddUp) {
  SimulatedClock clock;
  Dispatcher d(Options(/*s=*/2, /*b=*/2, /*lease=*/5), &clock);
  std::vector<WorkItem> items;
  for (int i = 0; i < 6; ++i) items.push_back(*d.Acquire("a"));
  ASSERT_EQ(d.Submit(items[0].group_id, items[0].lease_id, "a"), SubmitResult::kAccepted);
  ASSERT_EQ(d.Submit(items[1].group_id, items[1].lease_id, "a"), SubmitResult::kAccepted);
  ASSERT_EQ(d.Submit(items[2].group_id, items[2].lease_id, "a"), SubmitResult::kAccepted);
  d.Settle(items[0].group_id, Outcome::kConsumed);
  d.Settle(items[1].group_id, Outcome::kConsumed);
  d.SetVersion(1);
  clock.Advance(6);  // groups 3, 4, 5 expire -> awaiting re-issue
  d.ExpireLeases();
  ASSERT_TRUE(d.Acquire("b").has_value());  // group 3 again, running
  const DispatcherState saved = d.Export();
  EXPECT_EQ(saved.version, 1);
  EXPECT_EQ(saved.next_group, 6u);
  // Awaiting re-issue first (4, 5), then running and pending by id (2 pending, 3 running).
  EXPECT_EQ(saved.unsettled, (std::vector<uint64_t>{4, 5, 2, 3}));

  SimulatedClock clock2;
  Dispatcher r(Options(2, 2, 5), &clock2);
  ASSERT_TRUE(r.Restore(saved, /*lease_base=*/1000).ok());
  ExpectCountsAddUp(r);
  EXPECT_EQ(r.version(), 1);
  EXPECT_EQ(r.counts().consumed, 2u);
  EXPECT_EQ(r.counts().awaiting_reissue, 4u);
  // The old leases are dead: their holders are refused, whatever they held.
  EXPECT_EQ(r.Submit(items[2].group_id, items[2].lease_id, "a"), SubmitResult::kNotLeaseHolder);
  // Re-issued in the saved order, with fresh lease ids, before any new group.
  std::vector<uint64_t> order;
  for (int i = 0; i < 4; ++i) {
    std::optional<WorkItem> w = r.Acquire("c");
    ASSERT_TRUE(w.has_value());
    EXPECT_TRUE(w->reissue);
    EXPECT_GE(w->lease_id, 1000u);
    order.push_back(w->group_id);
    EXPECT_EQ(r.Submit(w->group_id, w->lease_id, "c"), SubmitResult::kAccepted);
    r.Settle(w->group_id, Outcome::kConsumed);
  }
  EXPECT_EQ(order, saved.unsettled);
  // Admission continues where it was: (S + v + 1) * B = 8 live slots, 6 consumed.
  EXPECT_EQ(r.Capacity(), 2);
  EXPECT_EQ(r.Acquire("c")->group_id, 6u);
  ExpectCountsAddUp(r);
  // Each group settled exactly once overall: 2 before, 4 after the restore.
  EXPECT_EQ(r.counts().consumed, 6u);
}

TEST(DispatcherRestore, InconsistentStateIsRefused) {
  SimulatedClock clock;
  Dispatcher d(Options(1, 1), &clock);
  d.Acquire("a");
  DispatcherState good = d.Export();
  DispatcherState s = good;
  s.unsettled = {0, 0};
  s.counts.outstanding = 2;
  EXPECT_FALSE(Dispatcher(Options(1, 1), &clock).Restore(s, 1).ok());
  s = good;
  s.unsettled = {7};
  EXPECT_NE(Dispatcher(Options(1, 1), &clock).Restore(s, 1).message().find("group 7"), std::string::npos);
  s = good;
  s.counts.handed_out = 5;
  EXPECT_NE(Dispatcher(Options(1, 1), &clock).Restore(s, 1).message().find("add up"), std::string::npos);
  EXPECT_TRUE(Dispatcher(Options(1, 1), &clock).Restore(good, 1).ok());
}

}  // namespace
}  // namespace echelon::sched

namespace echelon::sched {
namespace {

// A group on a slow worker that reports progress keeps its lease for 5 leases' time; one that
// falls silent loses it within a lease of its last report; reports that do not grow, come from
// another actor or another lease, or count past the group's most tokens renew nothing; and no
// progress keeps a lease past the life limit.
TEST(DispatcherLeases, ProgressRenewsALeaseAndSilenceEndsIt) {
  SimulatedClock clock;
  DispatcherOptions o = Options(/*s=*/4, /*b=*/2, /*lease=*/10);
  o.max_group_tokens = 1000;
  Dispatcher d(o, &clock);
  const WorkItem slow = *d.Acquire("slow#1");
  const WorkItem silent = *d.Acquire("silent#1");
  int64_t tokens = 0;
  for (int second = 1; second <= 50; ++second) {  // 5 x lease_seconds, a report every second
    clock.Advance(1);
    EXPECT_TRUE(d.Renew(slow.group_id, slow.lease_id, "slow#1", tokens += 10)) << "second " << second;
    d.ExpireLeases();
    EXPECT_EQ(d.counts().reissued, second >= 11 ? 1u : 0u) << "second " << second << ": only the silent group expires";
  }
  EXPECT_EQ(d.counts().reissued, 1u);
  EXPECT_EQ(d.Submit(slow.group_id, slow.lease_id, "slow#1"), SubmitResult::kAccepted) << "never re-issued";
  EXPECT_EQ(d.Submit(silent.group_id, silent.lease_id, "silent#1"), SubmitResult::kNotLeaseHolder);

  const WorkItem w = *d.Acquire("worker#1");
  EXPECT_FALSE(d.Renew(w.group_id, w.lease_id, "thief#1", 10)) << "another actor";
  EXPECT_FALSE(d.Renew(w.group_id, w.lease_id + 1, "worker#1", 10)) << "another lease";
  EXPECT_FALSE(d.Renew(w.group_id, w.lease_id, "worker#1", 1001)) << "more tokens than a group holds";
  EXPECT_TRUE(d.Renew(w.group_id, w.lease_id, "worker#1", 10));
  EXPECT_FALSE(d.Renew(w.group_id, w.lease_id, "worker#1", 10)) << "no growth";
  // Stalled progress: the lease ends a lease after the last growing report.
  clock.Advance(9);
  EXPECT_FALSE(d.Renew(w.group_id, w.lease_id, "worker#1", 10));
  clock.Advance(1.5);
  EXPECT_EQ(d.ExpireLeases(), 1);

  // The life limit: growing reports renew up to kMaxLeaseLifeFactor leases after the hand-out.
  const WorkItem liar = *d.Acquire("liar#1");
  const double handed = clock.Now();
  const uint64_t reissued = d.counts().reissued;
  for (int64_t t = 1; clock.Now() - handed < 10 * kMaxLeaseLifeFactor + 20; ++t) {
    clock.Advance(1);
    if (!d.Renew(liar.group_id, liar.lease_id, "liar#1", t)) break;  // expired
  }
  EXPECT_EQ(d.counts().reissued, reissued + 1);
  EXPECT_NEAR(clock.Now() - handed, 10 * kMaxLeaseLifeFactor + 1, 1.0);
  EXPECT_GE(d.renewals(), 50u);
  ExpectCountsAddUp(d);
}

// Deadline-aware dispatch, taught by two finished groups: the fast worker did a long prompt
// (group 0, 2,000 tokens) in 20 s, 100 tokens/s; the slow one a short prompt (group 1, 200) in
// 8 s, 25 tokens/s; the learner takes `update` seconds an update, and with S = 2 a group must be
// back within 0.8 x 2 x update seconds (kForecastSafety).
struct TwoSpeeds {
  SimulatedClock clock;
  Dispatcher d;
  TwoSpeeds(std::function<uint64_t(uint64_t)> key, double update) : d(Make(std::move(key)), &clock) {
    std::optional<WorkItem> a = d.Acquire("fast#1"), b = d.Acquire("slow#1");  // groups 0 and 1
    clock.Advance(8);
    EXPECT_EQ(d.Submit(b->group_id, b->lease_id, "slow#1", 200), SubmitResult::kAccepted);
    clock.Advance(12);
    EXPECT_EQ(d.Submit(a->group_id, a->lease_id, "fast#1", 2000), SubmitResult::kAccepted);
    d.Settle(0, Outcome::kConsumed);
    d.Settle(1, Outcome::kConsumed);
    d.SetVersion(1);
    clock.Advance(update);
    d.SetVersion(2);
  }
  static DispatcherOptions Make(std::function<uint64_t(uint64_t)> key) {
    DispatcherOptions o = Options(/*s=*/2, /*b=*/8, /*lease=*/25);
    o.lookahead = 8;
    o.prompt_key = std::move(key);
    return o;
  }
};

// With 13 s an update a group has 20.8 s. The slow worker would take 80 s over a long prompt: it
// only gets short ones (8 s); the fast one gets the long ones, where it has the least time to
// spare (20 s), not the short ones (2 s).
TEST(DeadlineDispatch, APredictedLateGroupIsNotHandedToTheSlowWorker) {
  TwoSpeeds t([](uint64_t g) { return g % 2; }, 13);  // even groups: the long prompt, odd: the short
  EXPECT_EQ(*t.d.PredictSeconds("slow#2", 2), 80);
  EXPECT_EQ(*t.d.PredictSeconds("fast#2", 3), 2);
  for (int i = 0; i < 6; ++i) {
    std::optional<WorkItem> s = t.d.Acquire("slow#1");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->group_id % 2, 1u) << "a long prompt for the slow worker";
    std::optional<WorkItem> f = t.d.Acquire("fast#1");
    ASSERT_TRUE(f);
    EXPECT_EQ(f->group_id % 2, 0u) << "a short prompt for the fast worker, a long one waiting";
  }
  EXPECT_EQ(t.d.counts().predicted_late, 0u);
  ExpectCountsAddUp(t.d);
}

// A worker that says which snapshot it holds is judged by its real lag, not its running mean
// (none yet here): one version behind, the fast worker has 0.8 x 13 s left, too little for a
// long prompt (20 s) and enough for a short one; two behind, nothing fits; a claim newer than
// the learner's is taken as no lag.
TEST(DeadlineDispatch, AWorkerThatSaysItsSnapshotIsJudgedByItsRealLag) {
  TwoSpeeds t([](uint64_t g) { return g % 2; }, 13);
  std::optional<WorkItem> w = t.d.Acquire("fast#1", /*held_version=*/1);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->group_id % 2, 1u) << "a short prompt: a long one would be late from a snapshot a version old";
  EXPECT_FALSE(t.d.Acquire("fast#1", /*held_version=*/0)) << "two versions behind with S = 2: nothing fits";
  EXPECT_EQ(t.d.counts().predicted_late, 1u);
  w = t.d.Acquire("fast#1", /*held_version=*/2);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->group_id % 2, 0u) << "the newest snapshot: the long prompt";
  w = t.d.Acquire("fast#1", /*held_version=*/9);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->group_id % 2, 0u);
  ExpectCountsAddUp(t.d);
}

// A group continued from what was kept of it (resumable groups) is forecast by what is left,
// against its oldest kept token's deadline. The fast worker's long group (2,000 tokens) is
// handed back with 1,800 kept: the slow worker finishes the other 200 in 8 s of its 20.8, so it
// takes it. Another comes back with 1,500 kept, its oldest token a version old: 500 tokens
// (20 s) fit the 20.8 s of a fresh group but not the 10.4 s left to that token, so the slow
// worker takes a short prompt instead. One whose oldest token is S versions old cannot be
// continued (the intake drops it): forecast as the fresh long group it becomes.
TEST(DeadlineDispatch, AResumedGroupIsForecastByWhatIsLeftAgainstItsOldestTokensDeadline) {
  TwoSpeeds t([](uint64_t g) { return g % 2; }, 13);  // even groups: the long prompt, odd: the short
  const auto handed_back = [&](int64_t kept, int64_t oldest) {
    std::optional<WorkItem> f = t.d.Acquire("fast#1");
    EXPECT_TRUE(f && f->group_id % 2 == 0) << "the fast worker takes a long prompt";
    t.d.KeepPrefix(f->group_id, f->lease_id, kept, oldest);
    EXPECT_TRUE(t.d.Release(f->group_id, f->lease_id, "fast#1"));
    return f->group_id;
  };
  const uint64_t nearly_done = handed_back(1800, /*oldest=*/2);
  std::optional<WorkItem> s = t.d.Acquire("slow#1");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->group_id, nearly_done) << "200 tokens left: 8 s on the slow worker";

  const uint64_t older = handed_back(1500, /*oldest=*/1);
  s = t.d.Acquire("slow#1");
  ASSERT_TRUE(s);
  EXPECT_NE(s->group_id, older) << "500 tokens left (20 s), but 10.4 s to its oldest token's deadline";
  EXPECT_EQ(s->group_id % 2, 1u);

  const uint64_t too_old = handed_back(1900, /*oldest=*/0);
  s = t.d.Acquire("slow#1");
  ASSERT_TRUE(s);
  EXPECT_NE(s->group_id, too_old) << "it starts over: 2,000 tokens, 80 s";
  EXPECT_NE(s->group_id, older);
  ExpectCountsAddUp(t.d);
}

// With 12 s an update (19.2 s to spare) the long prompt is late on both workers: neither gets
// anything, counted; once a group has been passed over kMaxPassOvers times the fast worker
// takes it (no prompt waits for ever) but never the slow one, on which it would be later still.
TEST(DeadlineDispatch, NothingThatWouldBeLateButNoGroupWaitsForEver) {
  TwoSpeeds t([](uint64_t g) { return g == 1 ? 1 : 0; }, 12);  // every group but 1 the long prompt
  std::optional<WorkItem> fast;
  int asked = 0;
  while (!fast && asked < 4 * kMaxPassOvers) {
    EXPECT_FALSE(t.d.Acquire("slow#1")) << "ask " << asked;
    fast = t.d.Acquire("fast#1");
    asked += 2;
  }
  ASSERT_TRUE(fast);
  EXPECT_EQ(fast->group_id, 2u);  // the longest waiting
  EXPECT_EQ(asked, kMaxPassOvers + 2);  // a pass-over per refused ask, either worker's
  EXPECT_EQ(t.d.counts().predicted_late, static_cast<uint64_t>(kMaxPassOvers + 1));
  EXPECT_FALSE(t.d.Acquire("slow#1"));
}

// Groups drawn ahead and never handed out survive a restart (they are neither lost nor counted
// as hand-outs); tokens consumed and wasted are counted by cause.
TEST(DeadlineDispatch, DrawnGroupsSurviveARestoreAndTokensAreCountedByCause) {
  TwoSpeeds t([](uint64_t g) { return g % 2; }, 13);
  std::optional<WorkItem> s = t.d.Acquire("slow#1");  // group 3, a short one
  ASSERT_TRUE(s);
  EXPECT_TRUE(t.d.Renew(s->group_id, s->lease_id, "slow#1", 150));
  t.clock.Advance(30);  // past the 25 s lease: re-issued, its progress lost
  EXPECT_EQ(t.d.ExpireLeases(), 1);
  EXPECT_EQ(t.d.counts().tokens_preempted, 150u);
  DispatchCounts c = t.d.counts();
  EXPECT_EQ(c.tokens_consumed, 2200u);
  DispatcherState state = t.d.Export();
  EXPECT_EQ(state.drawn.size(), 7u);  // 2 and 4..9
  Dispatcher back(TwoSpeeds::Make([](uint64_t g) { return g % 2; }), &t.clock);
  ASSERT_TRUE(back.Restore(state, 100).ok());
  std::set<uint64_t> handed;
  for (int i = 0; i < 8; ++i)
    if (auto w = back.Acquire("a#1")) handed.insert(w->group_id);
  EXPECT_EQ(handed, (std::set<uint64_t>{2, 3, 4, 5, 6, 7, 8, 9}));  // the re-issue and the drawn
  ExpectCountsAddUp(back);
  state.drawn.push_back(state.unsettled.front());
  EXPECT_FALSE(Dispatcher(TwoSpeeds::Make(nullptr), &t.clock).Restore(state, 100).ok());  // listed twice
}

// A progress report lost with its lease counts as preempted tokens; a refused submission's and
// a stale group's tokens under their causes; a count past max_group_tokens is not counted.
TEST(DeadlineDispatch, WastedTokensByCause) {
  SimulatedClock clock;
  DispatcherOptions o = Options(/*s=*/1, /*b=*/4, /*lease=*/10);
  o.max_group_tokens = 1000;
  Dispatcher d(o, &clock);
  std::optional<WorkItem> a = d.Acquire("a#1"), b = d.Acquire("b#1"), c = d.Acquire("c#1");
  EXPECT_TRUE(d.Renew(a->group_id, a->lease_id, "a#1", 300));
  EXPECT_EQ(d.Evict("a#1"), 1);
  EXPECT_EQ(d.Submit(a->group_id, a->lease_id, "a#1", 400), SubmitResult::kNotLeaseHolder);  // late
  EXPECT_EQ(d.Submit(b->group_id, b->lease_id, "b#1", 500), SubmitResult::kAccepted);
  d.Settle(b->group_id, Outcome::kDroppedStale);
  EXPECT_EQ(d.Submit(c->group_id, c->lease_id, "c#1", 5000), SubmitResult::kAccepted);  // more than a group holds
  d.Settle(c->group_id, Outcome::kConsumed);
  const DispatchCounts n = d.counts();
  EXPECT_EQ(n.tokens_preempted, 300u);
  EXPECT_EQ(n.tokens_refused, 400u);
  EXPECT_EQ(n.tokens_stale, 500u);
  EXPECT_EQ(n.tokens_consumed, 0u);
}

}  // namespace
}  // namespace echelon::sched
