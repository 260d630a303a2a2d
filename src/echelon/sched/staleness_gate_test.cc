#include "echelon/sched/staleness_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "echelon/sched/dispatcher.h"

namespace echelon::sched {
namespace {

TEST(StalenessGate, AdmitsUpToSVersionsBehind) {
  StalenessGate sync(0);
  EXPECT_TRUE(sync.Admits(7, 7));
  EXPECT_FALSE(sync.Admits(6, 7));
  StalenessGate gate(2);
  EXPECT_TRUE(gate.Admits(5, 7));
  EXPECT_FALSE(gate.Admits(4, 7));
}

TEST(StalenessGate, DefaultPublishPeriodIsSMinusOneFlooredAtOne) {
  EXPECT_EQ(DefaultPublishPeriod(0), 1);
  EXPECT_EQ(DefaultPublishPeriod(1), 1);
  EXPECT_EQ(DefaultPublishPeriod(2), 1);
  EXPECT_EQ(DefaultPublishPeriod(3), 2);
  EXPECT_EQ(DefaultPublishPeriod(8), 7);
}

// A discrete-time simulation of actors, the dispatcher and a learner that consumes B groups
// per step through the StalenessGate. Alongside the real Dispatcher it keeps its own model of
// leases, so every hand-out and every submission result is checked against an independent
// reference, and the counts are compared after every operation.
struct SimConfig {
  int64_t s = 0;
  int64_t b = 1;
  uint64_t seed = 1;
  bool snapshot_lag = false;  // generate with the newest snapshot instead of version v
  int64_t steps = 30;         // learner steps to run
};

struct SimReport {
  std::vector<int64_t> staleness;  // of every consumed group
  uint64_t dropped = 0;
  uint64_t max_in_flight = 0;
  uint64_t reissued = 0;  // hand-outs ended by expiry or eviction
  uint64_t refused = 0;   // late submissions
};

class Simulation {
 public:
  explicit Simulation(const SimConfig& cfg)
      : cfg_(cfg), rng_(cfg.seed), gate_(cfg.s), kappa_(DefaultPublishPeriod(cfg.s)) {
    DispatcherOptions o;
    o.max_staleness = cfg.s;
    o.batch_groups = cfg.b;
    o.lease_seconds = kLease;
    dispatcher_ = std::make_unique<Dispatcher>(o, &clock_);
    const int n = Uniform(3, 8);
    for (int i = 0; i < n; ++i) {
      Actor a;
      a.name = "actor-" + std::to_string(i);
      a.mean_seconds = Uniform(1, 10);
      a.abandon_prob = (i % 3 == 0) ? 0.15 : 0.0;  // some actors sometimes walk away
      actors_.push_back(a);
    }
    learner_step_seconds_ = Uniform(1, 4);
  }

  SimReport Run() {
    for (int64_t tick = 1; version_ < cfg_.steps; ++tick) {
      if (tick > 100000) {
        ADD_FAILURE() << "learner starved at version " << version_;
        break;
      }
      clock_.Set(static_cast<double>(tick));
      MaybeEvictOne();
      std::shuffle(actors_.begin(), actors_.end(), rng_);
      for (Actor& a : actors_) StepActor(a);
      StepLearner();
      if (::testing::Test::HasFatalFailure()) return report_;
    }
    Finish();
    return report_;
  }

 private:
  static constexpr double kLease = 12;  // some jobs (up to 15 s) overrun it

  struct Actor {
    std::string name;
    double mean_seconds = 1;
    double abandon_prob = 0;
    bool busy = false;
    bool abandon = false;
    double finish = 0;
    double down_until = 0;
    WorkItem item;
    int64_t behavior_version = 0;
  };
  struct ModelLease {
    uint64_t group;
    std::string actor;
    double deadline;
  };
  struct Rollout {
    uint64_t group;
    int64_t behavior_version;
  };

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  double Real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  double Now() const { return clock_.Now(); }

  // Model of the dispatcher's lease collection: a lease ends once Now() > deadline.
  void ModelCollect() {
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (Now() > it->second.deadline) {
        awaiting_.insert(it->second.group);
        ++model_reissued_;
        it = leases_.erase(it);
      } else {
        ++it;
      }
    }
  }

  uint64_t ModelInFlight() const { return leases_.size() + awaiting_.size() + buffer_.size(); }

  void MaybeEvictOne() {
    if (Real(0, 1) >= 0.02) return;
    Actor& a = actors_[Uniform(0, static_cast<int>(actors_.size()) - 1)];
    ModelCollect();
    int expected = 0;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.actor == a.name) {
        awaiting_.insert(it->second.group);
        ++model_reissued_;
        ++expected;
        it = leases_.erase(it);
      } else {
        ++it;
      }
    }
    EXPECT_EQ(dispatcher_->Evict(a.name), expected);
    a.busy = false;  // the crashed actor's work is lost; it rejoins later
    a.down_until = Now() + Uniform(1, 20);
    Check();
  }

  void StepActor(Actor& a) {
    if (Now() < a.down_until) return;
    if (a.busy && a.finish <= Now()) {
      a.busy = false;
      if (!a.abandon) SubmitFor(a);
    }
    if (!a.busy) AcquireFor(a);
  }

  void SubmitFor(const Actor& a) {
    ModelCollect();
    auto it = leases_.find(a.item.lease_id);
    const bool holder = it != leases_.end();
    SubmitResult got = dispatcher_->Submit(a.item.group_id, a.item.lease_id, a.name);
    if (holder) {
      ASSERT_EQ(got, SubmitResult::kAccepted);
      leases_.erase(it);
      ASSERT_TRUE(accepted_.insert(a.item.group_id).second) << "group accepted twice";
      buffer_.push_back({a.item.group_id, a.behavior_version});
    } else {
      ASSERT_EQ(got, SubmitResult::kNotLeaseHolder);
      ++model_refused_;
    }
    Check();
  }

  void AcquireFor(Actor& a) {
    ModelCollect();
    const int64_t limit = (cfg_.s + version_ + 1) * cfg_.b;
    const int64_t live = static_cast<int64_t>(consumed_.size() + ModelInFlight());
    std::optional<WorkItem> w = dispatcher_->Acquire(a.name);
    if (!awaiting_.empty()) {
      ASSERT_TRUE(w && w->reissue) << "a waiting re-issue must go before new work";
      ASSERT_EQ(awaiting_.erase(w->group_id), 1u);
    } else if (live < limit) {
      ASSERT_TRUE(w && !w->reissue);
      ASSERT_EQ(w->group_id, next_group_++);
    } else {
      ASSERT_FALSE(w) << "admitted beyond (S+v+1)*B";
      return;
    }
    ASSERT_EQ(w->dispatch_version, version_);
    ++model_handed_out_;
    leases_[w->lease_id] = {w->group_id, a.name, Now() + kLease};
    a.busy = true;
    a.item = *w;
    a.finish = Now() + a.mean_seconds * Real(0.5, 1.5);
    a.abandon = Real(0, 1) < a.abandon_prob;
    a.behavior_version = cfg_.snapshot_lag ? snapshot_ : version_;
    Check();
  }

  // Drops what the gate refuses (staleness only grows), then steps once B groups pass,
  // consuming them in submission order.
  void StepLearner() {
    if (Now() < learner_ready_) return;
    for (auto it = buffer_.begin(); it != buffer_.end();) {
      if (gate_.Admits(it->behavior_version, version_)) {
        ++it;
        continue;
      }
      const uint64_t group = it->group;
      it = buffer_.erase(it);
      ++report_.dropped;
      dispatcher_->Settle(group, Outcome::kDroppedStale);
      Check();
    }
    if (static_cast<int64_t>(buffer_.size()) < cfg_.b) return;
    for (int64_t i = 0; i < cfg_.b; ++i) {
      const Rollout r = buffer_.front();
      buffer_.pop_front();
      ASSERT_TRUE(consumed_.insert(r.group).second) << "group " << r.group << " consumed twice";
      report_.staleness.push_back(version_ - r.behavior_version);
      dispatcher_->Settle(r.group, Outcome::kConsumed);
      Check();
    }
    ++version_;
    dispatcher_->SetVersion(version_);
    if (version_ % kappa_ == 0) snapshot_ = version_;
    learner_ready_ = Now() + learner_step_seconds_;
  }

  // The counts match the model, add up, and stay within the in-flight bound. From the rule,
  // consumed + in_flight <= (S+v+1)*B, and this learner has consumed at least v*B groups at
  // version v, so in_flight <= (S+1)*B.
  void Check() {
    DispatchCounts c = dispatcher_->counts();
    ASSERT_EQ(c.handed_out, c.consumed + c.dropped_stale + c.reissued + c.outstanding + c.pending);
    ASSERT_EQ(c.handed_out, model_handed_out_);
    ASSERT_EQ(c.consumed, consumed_.size());
    ASSERT_EQ(c.dropped_stale, report_.dropped);
    ASSERT_EQ(c.reissued, model_reissued_);
    ASSERT_EQ(c.refused, model_refused_);
    const uint64_t in_flight = c.outstanding + c.pending + c.awaiting_reissue;
    ASSERT_EQ(in_flight, ModelInFlight());
    ASSERT_LE(in_flight, static_cast<uint64_t>((cfg_.s + 1) * cfg_.b));
    report_.max_in_flight = std::max(report_.max_in_flight, in_flight);
  }

  // Every group ever handed out is consumed, dropped, waiting for the learner, or waiting to
  // be re-issued, exactly once.
  void Finish() {
    clock_.Set(Now() + kLease + 1);
    ModelCollect();
    dispatcher_->ExpireLeases();
    Check();
    DispatchCounts c = dispatcher_->counts();
    EXPECT_EQ(c.outstanding, 0u);
    EXPECT_EQ(c.consumed, static_cast<uint64_t>(cfg_.steps * cfg_.b));
    EXPECT_EQ(c.pending, buffer_.size());
    EXPECT_EQ(c.awaiting_reissue, next_group_ - accepted_.size());
    EXPECT_EQ(c.handed_out - accepted_.size(), c.reissued);
    EXPECT_EQ(accepted_.size(), c.consumed + c.dropped_stale + c.pending);
    report_.reissued = c.reissued;
    report_.refused = c.refused;
  }

  SimConfig cfg_;
  std::mt19937_64 rng_;
  StalenessGate gate_;
  int64_t kappa_;
  SimulatedClock clock_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::vector<Actor> actors_;
  double learner_step_seconds_ = 1;
  double learner_ready_ = 0;
  int64_t version_ = 0;
  int64_t snapshot_ = 0;  // newest published snapshot
  // Reference model.
  std::map<uint64_t, ModelLease> leases_;  // live lease id -> lease
  std::set<uint64_t> awaiting_;
  std::deque<Rollout> buffer_;  // accepted, not yet settled
  std::set<uint64_t> accepted_;
  std::set<uint64_t> consumed_;
  uint64_t next_group_ = 0;
  uint64_t model_handed_out_ = 0;
  uint64_t model_reissued_ = 0;
  uint64_t model_refused_ = 0;
  SimReport report_;
};

class StalenessSimulation : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(StalenessSimulation, CountsAddUpAndInFlightBoundIsExact) {
  const auto [s, snapshot_lag] = GetParam();
  const int64_t batch_sizes[] = {1, 2, 3, 4, 8};
  int bound_reached = 0;
  uint64_t reissued = 0, refused = 0, dropped = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SimConfig cfg;
    cfg.s = s;
    cfg.b = batch_sizes[seed % 5];
    cfg.seed = seed;
    cfg.snapshot_lag = snapshot_lag;
    SCOPED_TRACE("seed " + std::to_string(seed) + " B=" + std::to_string(cfg.b));
    SimReport r = Simulation(cfg).Run();
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(r.staleness.size(), static_cast<size_t>(cfg.steps * cfg.b));
    for (int64_t st : r.staleness) {
      ASSERT_GE(st, 0);
      ASSERT_LE(st, s);
    }
    if (r.max_in_flight == static_cast<uint64_t>((s + 1) * cfg.b)) ++bound_reached;
    reissued += r.reissued;
    refused += r.refused;
    dropped += r.dropped;
  }
  // The bound is tight, not merely safe: fast actors fill it.
  EXPECT_GT(bound_reached, 0);
  // The runs exercised expiry, eviction, late submissions and (with S > 0) stale drops.
  EXPECT_GT(reissued, 0u);
  EXPECT_GT(refused, 0u);
  if (s > 0) {
    EXPECT_GT(dropped, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(SAndSnapshotMode, StalenessSimulation,
                         ::testing::Combine(::testing::Values(0, 1, 2, 4, 8), ::testing::Bool()));

TEST(StalenessSimulationSync, SZeroIsExactlyOnPolicy) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SimConfig cfg;
    cfg.s = 0;
    cfg.b = 1 + static_cast<int64_t>(seed % 4);
    cfg.seed = seed;
    cfg.snapshot_lag = true;  // kappa = 1: a snapshot after every step
    SCOPED_TRACE("seed " + std::to_string(seed));
    SimReport r = Simulation(cfg).Run();
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(r.dropped, 0u);
    ASSERT_EQ(r.staleness.size(), static_cast<size_t>(cfg.steps * cfg.b));
    for (int64_t st : r.staleness) ASSERT_EQ(st, 0);
  }
}

}  // namespace
}  // namespace echelon::sched
