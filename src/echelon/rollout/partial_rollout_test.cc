// The actor while a group generates: progress reports for its lease, and partial rollouts (a
// snapshot published midway is taken and the unfinished samples continue on it, each token
// tagged with the version that drew it).
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "echelon/model/generate.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/testing.h"
#include "echelon/rollout/actor.h"
#include "echelon/rollout/model_policy.h"
#include "echelon/rollout/testing.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::rollout {
namespace {

const std::string kAlphabet = "0123456789+-=";

// One group to do; snapshots by version, the newest moving on after `steps_before_publish`
// progress-reporting steps of the actor's policy (counted through Progress's token counts).
class Plane : public contract::WorkSource, public contract::TrajectorySink, public contract::SnapshotSource {
 public:
  std::optional<contract::Assignment> Acquire(const std::string&) override {
    std::lock_guard<std::mutex> lock(mu);
    if (handed) return std::nullopt;
    handed = true;
    contract::Assignment a;
    a.work.group_id = 3;
    a.work.lease_id = 30;
    a.prompt = data::Prompt{3, "1+2=", "3"};
    a.group_size = 4;
    return a;
  }
  void Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) override {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back({actor, work.lease_id, tokens});
  }
  contract::SubmitOutcome Submit(contract::GroupRollout r) override {
    std::lock_guard<std::mutex> lock(mu);
    submitted.push_back(std::move(r));
    return {true, ""};
  }
  contract::Snapshot Latest() override {
    std::lock_guard<std::mutex> lock(mu);
    return {newest, weights.at(newest)};
  }
  int64_t NewestVersion() override {
    std::lock_guard<std::mutex> lock(mu);
    return newest;
  }
  struct Report {
    std::string actor;
    uint64_t lease;
    int64_t tokens;
  };
  std::mutex mu;
  bool handed = false;
  int64_t newest = 0;
  std::map<int64_t, std::shared_ptr<const std::string>> weights;
  std::vector<Report> reports;
  std::vector<contract::GroupRollout> submitted;
};

model::ModelConfig Config() {
  model::ModelConfig c = model::TinyTestConfig(model::Vocabulary::Characters(kAlphabet).id_end(), 32);
  c.max_position_embeddings = 256;
  return c;
}

std::shared_ptr<const std::string> Weights(const model::Qwen3Model& m) {
  return std::make_shared<const std::string>(model::SerializeSafetensors(m->StorageStateDict(), {}).value());
}

// Steps the observer sees: after `publish_at` tokens, the plane publishes version 1.
class PublishingPolicy : public ModelPolicy {
 public:
  PublishingPolicy(Plane* plane, int64_t publish_at, model::SamplingParams sp)
      : ModelPolicy(model::Qwen3Model(Config()), model::Vocabulary::Characters(kAlphabet), sp),
        plane_(plane), publish_at_(publish_at) {}
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override {
    SampleObserver* outer = observer_;
    Relay relay{outer, this};
    set_observer(&relay);
    Result<std::vector<data::Turn>> out = ModelPolicy::Sample(prompts, seed);
    set_observer(outer);
    return out;
  }

 private:
  // Counts tokens and publishes once, then hands every call on to the actor's observer.
  struct Relay : SampleObserver {
    SampleObserver* outer;
    PublishingPolicy* self;
    Relay(SampleObserver* o, PublishingPolicy* s) : outer(o), self(s) {}
    void Generated(int64_t tokens) override {
      self->seen_ += tokens;
      if (self->seen_ >= self->publish_at_) {
        std::lock_guard<std::mutex> lock(self->plane_->mu);
        self->plane_->newest = 1;
      }
      outer->Generated(tokens);
    }
    bool NewerSnapshot() override { return outer->NewerSnapshot(); }
    bool Update() override { return outer->Update(); }
  };
  Plane* plane_;
  int64_t publish_at_, seen_ = 0;
};

void RunUntilSubmitted(Actor& actor, Plane& plane) {
  std::atomic<bool> stop{false};
  std::thread t([&] { actor.Run(stop); });
  for (int i = 0; i < 3000; ++i) {
    {
      std::lock_guard<std::mutex> lock(plane.mu);
      if (!plane.submitted.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  t.join();
}

// A snapshot published after 10 tokens: the group's samples continue on it. Every token
// carries the version that drew it (0s then 1s), the group claims the oldest, and each token's
// log-prob is the one its own version's weights give over the whole sequence so far (what the
// verifier recomputes).
TEST(PartialRolloutTest, ASnapshotPublishedMidwayIsTakenAndEveryTokenKeepsItsVersion) {
  Plane plane;
  model::Qwen3Model v0(Config()), v1(Config());
  v0->InitWeights(1);
  v1->InitWeights(2);
  plane.weights[0] = Weights(v0);
  plane.weights[1] = Weights(v1);
  model::SamplingParams sp;
  sp.max_new_tokens = 12;
  sp.ignore_eos = true;  // rows run to their limit: every row crosses the publication
  sp.min_tokens = 12;    // (nor the stop id)
  OneAnswerTask task;
  ActorOptions options;
  options.partial = true;
  Actor actor(options, &plane, &plane, &plane, &task, std::make_unique<PublishingPolicy>(&plane, 10, sp));
  RunUntilSubmitted(actor, plane);
  ASSERT_EQ(plane.submitted.size(), 1u);
  const contract::GroupRollout& g = plane.submitted[0];
  EXPECT_EQ(g.behavior_version, 0);
  int64_t old_tokens = 0, new_tokens = 0;
  for (const data::Episode& e : g.episodes) {
    const data::Turn& t = e.turns.at(0);
    ASSERT_EQ(t.tokens.size(), 12u);
    ASSERT_EQ(t.versions.size(), t.tokens.size());
    for (size_t i = 0; i < t.versions.size(); ++i) {
      (t.versions[i] == 0 ? old_tokens : new_tokens) += 1;
      if (i > 0) {
        EXPECT_GE(t.versions[i], t.versions[i - 1]) << "versions never go back along a turn";
      }
    }
    // Each token's log-prob under its own version, prefix included.
    const std::vector<float> under0 = model::ScoreCompletion(v0, t.prompt_ids, t.tokens, 1.0);
    const std::vector<float> under1 = model::ScoreCompletion(v1, t.prompt_ids, t.tokens, 1.0);
    for (size_t i = 0; i < t.tokens.size(); ++i)
      EXPECT_NEAR(t.logprobs[i], t.versions[i] == 0 ? under0[i] : under1[i], 1e-4) << "token " << i;
  }
  EXPECT_GT(old_tokens, 0);
  EXPECT_GT(new_tokens, 0);
  EXPECT_EQ(old_tokens + new_tokens, 48);
}

// Without rollout.partial the group finishes on the snapshot it started with: no versions.
TEST(PartialRolloutTest, WithoutPartialAGroupStaysOnItsSnapshot) {
  Plane plane;
  model::Qwen3Model v0(Config()), v1(Config());
  v1->InitWeights(2);
  plane.weights[0] = Weights(v0);
  plane.weights[1] = Weights(v1);
  model::SamplingParams sp;
  sp.max_new_tokens = 12;
  sp.ignore_eos = true;
  sp.min_tokens = 12;
  OneAnswerTask task;
  Actor actor(ActorOptions{}, &plane, &plane, &plane, &task, std::make_unique<PublishingPolicy>(&plane, 10, sp));
  RunUntilSubmitted(actor, plane);
  ASSERT_EQ(plane.submitted.size(), 1u);
  EXPECT_EQ(plane.submitted[0].behavior_version, 0);
  for (const data::Episode& e : plane.submitted[0].episodes) EXPECT_TRUE(e.turns.at(0).versions.empty());
}

// A policy that takes simulated time per step: 20 steps of 0.7 s; `silent` reports none.
class SlowPolicy : public SnapshotPolicy {
 public:
  explicit SlowPolicy(SimulatedClock* clock, bool silent = false) : clock_(clock), silent_(silent) {}
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t) override {
    for (int step = 0; step < 20; ++step) {
      clock_->Advance(0.7);
      if (observer_ != nullptr && !silent_) observer_->Generated(static_cast<int64_t>(prompts.size()));
    }
    if (silent_) clock_->Advance(14 * 2);  // as slow as the slowed one, with nothing said
    std::vector<data::Turn> out(prompts.size());
    for (data::Turn& t : out) {
      t.tokens.assign(20, 3);
      t.logprobs.assign(20, -0.1f);
    }
    return out;
  }
  Status LoadSnapshot(const std::string&, int64_t version) override {
    version_ = version;
    return Status::Ok();
  }
  int64_t version() const override { return version_; }

 private:
  SimulatedClock* clock_;
  bool silent_;
  int64_t version_ = -1;
};

// While a group generates the actor reports its progress at least every kProgressSeconds, for
// its own lease, with a growing token count; a slowdown stretches the group step by step (the
// reports keep coming), not in one sleep at the end.
TEST(PartialRolloutTest, TheActorReportsProgressForItsLeaseWhileAGroupGenerates) {
  for (double slowdown : {1.0, 3.0}) {
    Plane plane;
    plane.weights[0] = std::make_shared<const std::string>("weights");
    SimulatedClock clock;
    OneAnswerTask task;
    ActorOptions options;
    options.name = "slow";
    options.slowdown = slowdown;
    Actor actor(options, &plane, &plane, &plane, &task, std::make_unique<SlowPolicy>(&clock), &clock);
    RunUntilSubmitted(actor, plane);
    ASSERT_EQ(plane.submitted.size(), 1u);
    const double seconds = 20 * 0.7 * slowdown;
    EXPECT_NEAR(plane.submitted[0].generate_seconds, 20 * 0.7, 1e-6) << "the slowdown's pauses are not generation";
    // A report at the first step boundary a progress period after the last.
    ASSERT_GE(plane.reports.size(), static_cast<size_t>(seconds / (sched::kProgressSeconds + 0.7 * slowdown)))
        << "slowdown " << slowdown;
    for (size_t i = 0; i < plane.reports.size(); ++i) {
      EXPECT_EQ(plane.reports[i].actor, "slow");
      EXPECT_EQ(plane.reports[i].lease, 30u);
      if (i > 0) {
        EXPECT_GT(plane.reports[i].tokens, plane.reports[i - 1].tokens);
      }
    }
    EXPECT_LE(plane.reports.back().tokens, 80);
  }
}

// The actor against the real dispatcher on one simulated clock, a lease of 8 s: a worker slowed 3x
// takes 42 s (5.25 leases) over its group, reports progress, and is never re-issued; one as slow
// that says nothing loses the group to a re-issue, and its submission is refused.
class DispatchingPlane : public Plane {
 public:
  explicit DispatchingPlane(const Clock* clock) : dispatcher_(Options(), clock) {}
  std::optional<contract::Assignment> Acquire(const std::string& actor) override {
    std::optional<contract::Assignment> a = Plane::Acquire(actor);
    if (!a) return a;
    a->work = *dispatcher_.Acquire(actor);
    return a;
  }
  void Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) override {
    Plane::Progress(actor, work, tokens);
    dispatcher_.Renew(work.group_id, work.lease_id, actor, tokens);
  }
  contract::SubmitOutcome Submit(contract::GroupRollout r) override {
    const sched::SubmitResult result = dispatcher_.Submit(r.group_id, r.lease_id, r.actor);
    Plane::Submit(std::move(r));
    return {result == sched::SubmitResult::kAccepted, result == sched::SubmitResult::kAccepted ? "" : "refused"};
  }
  sched::Dispatcher& dispatcher() { return dispatcher_; }

 private:
  static sched::DispatcherOptions Options() {
    sched::DispatcherOptions o;
    o.max_staleness = 1;
    o.batch_groups = 1;
    o.lease_seconds = 8;
    return o;
  }
  sched::Dispatcher dispatcher_;
};

TEST(PartialRolloutTest, ASlowWorkerReportingProgressKeepsItsLeaseAndASilentOneLosesIt) {
  for (bool silent : {false, true}) {
    SimulatedClock clock;
    DispatchingPlane plane(&clock);
    plane.weights[0] = std::make_shared<const std::string>("weights");
    OneAnswerTask task;
    ActorOptions options;
    options.slowdown = 3;
    Actor actor(options, &plane, &plane, &plane, &task, std::make_unique<SlowPolicy>(&clock, silent), &clock);
    RunUntilSubmitted(actor, plane);
    ASSERT_EQ(plane.submitted.size(), 1u);
    const sched::DispatchCounts c = plane.dispatcher().counts();
    EXPECT_EQ(c.reissued, silent ? 1u : 0u) << (silent ? "silent" : "reporting");
    EXPECT_EQ(c.pending, silent ? 0u : 1u) << "the reporting worker's group was accepted";
    EXPECT_GE(plane.dispatcher().renewals(), silent ? 0u : 5u);
  }
}

// Resumable groups: a single-turn group whose learner keeps prefixes (Assignment::report_prefix)
// has each sample's new tokens reported every kPrefixSeconds, from where the last kept report
// ended; a report the learner did not keep (its reply lost) is sent again with the next one.
class PrefixPlane : public Plane {
 public:
  std::optional<contract::Assignment> Acquire(const std::string& actor) override {
    std::optional<contract::Assignment> a = Plane::Acquire(actor);
    if (a) a->scored_by_learner = a->report_prefix = true;
    return a;
  }
  std::optional<contract::Assignment> AcquireWith(const std::string& actor, const contract::WorkRequest&) override {
    return Acquire(actor);
  }
  bool ReportPrefix(const std::string&, const sched::WorkItem& work, const std::vector<contract::PrefixPart>& parts) override {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(work.lease_id, 30u);
    if (++prefix_calls == 1) return false;  // the first reply is lost
    kept.push_back(parts);
    return true;
  }
  void Release(const std::string& actor, const sched::WorkItem& work) override {
    std::lock_guard<std::mutex> lock(mu);
    released.push_back({actor, work.lease_id, 0});
  }
  std::vector<Report> released;
  int prefix_calls = 0;
  std::vector<std::vector<contract::PrefixPart>> kept;
};

// 60 steps of 0.7 simulated seconds; sample j draws token 1 + (step + j) % 9 at each step. With
// `stop`, that is set after `stop_after` steps, and the call ends with kCancelled as the builtin
// backend's does once the actor is stopping.
class DrawingPolicy : public SlowPolicy {
 public:
  explicit DrawingPolicy(SimulatedClock* clock, std::atomic<bool>* stop = nullptr, int stop_after = 0)
      : SlowPolicy(clock), clock_(clock), stop_(stop), stop_after_(stop_after) {}
  static constexpr int kSteps = 60;
  bool ContinuesPrefixes() const override { return true; }
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t) override {
    std::vector<data::Turn> out(prompts.size());
    for (int step = 0; step < kSteps; ++step) {
      clock_->Advance(0.7);
      std::vector<int64_t> samples, tokens;
      std::vector<float> logprobs;
      for (size_t j = 0; j < out.size(); ++j) {
        samples.push_back(static_cast<int64_t>(j));
        tokens.push_back(1 + (step + static_cast<int64_t>(j)) % 9);
        logprobs.push_back(-0.01f * static_cast<float>(step));
        out[j].tokens.push_back(tokens.back());
        out[j].logprobs.push_back(logprobs.back());
      }
      observer_->Generated(static_cast<int64_t>(out.size()));
      observer_->Drew(samples, tokens, logprobs, version());
      ++drawn;
      if (stop_ != nullptr && step + 1 == stop_after_) *stop_ = true;
      if (observer_->Stopping()) return Cancelled("stopping");
    }
    return out;
  }
  int drawn = 0;  // steps

 private:
  SimulatedClock* clock_;
  std::atomic<bool>* stop_;
  int stop_after_;
};

TEST(PartialRolloutTest, TheActorReportsItsSamplesPrefixesAndResendsOneNotKept) {
  PrefixPlane plane;
  plane.weights[0] = std::make_shared<const std::string>("weights");
  SimulatedClock clock;
  OneAnswerTask task;
  ActorOptions options;
  options.name = "reporter";
  Actor actor(options, &plane, &plane, &plane, &task, std::make_unique<DrawingPolicy>(&clock), &clock);
  RunUntilSubmitted(actor, plane);
  ASSERT_EQ(plane.submitted.size(), 1u);
  const double seconds = DrawingPolicy::kSteps * 0.7;
  EXPECT_GE(plane.prefix_calls, static_cast<int>(seconds / (sched::kPrefixSeconds + 0.7)));
  EXPECT_EQ(static_cast<int>(plane.kept.size()), plane.prefix_calls - 1);
  // The kept reports, joined, are each sample's tokens from position 0, with no gap or repeat.
  const std::vector<data::Episode>& episodes = plane.submitted[0].episodes;
  std::vector<std::vector<int64_t>> joined(episodes.size());
  for (const std::vector<contract::PrefixPart>& report : plane.kept)
    for (const contract::PrefixPart& p : report) {
      std::vector<int64_t>& mine = joined.at(static_cast<size_t>(p.sample));
      EXPECT_EQ(p.from, static_cast<int64_t>(mine.size())) << "sample " << p.sample;
      EXPECT_EQ(p.versions, std::vector<int64_t>(p.tokens.size(), 0));
      EXPECT_EQ(p.logprobs.size(), p.tokens.size());
      mine.insert(mine.end(), p.tokens.begin(), p.tokens.end());
    }
  for (size_t j = 0; j < episodes.size(); ++j) {
    const std::vector<int64_t>& all = episodes[j].turns[0].tokens;
    ASSERT_GT(joined[j].size(), 0u);
    EXPECT_LE(joined[j].size(), all.size());
    EXPECT_EQ(joined[j], std::vector<int64_t>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(joined[j].size())));
  }
}

// An actor told to stop midway (a spot instance's preemption notice) ends the generation at
// the next step, reports everything its samples drew since its last kept report, and hands the
// lease back; it submits nothing.
TEST(PartialRolloutTest, AStoppingActorReportsItsPrefixAndHandsTheLeaseBack) {
  PrefixPlane plane;
  plane.weights[0] = std::make_shared<const std::string>("weights");
  SimulatedClock clock;
  OneAnswerTask task;
  ActorOptions options;
  options.name = "spot";
  std::atomic<bool> stop{false};
  auto policy = std::make_unique<DrawingPolicy>(&clock, &stop, /*stop_after=*/25);
  DrawingPolicy* drawing = policy.get();
  Actor actor(options, &plane, &plane, &plane, &task, std::move(policy), &clock);
  actor.Run(stop);  // returns once stopped
  EXPECT_EQ(drawing->drawn, 25);
  EXPECT_TRUE(plane.submitted.empty());
  ASSERT_EQ(plane.released.size(), 1u);
  EXPECT_EQ(plane.released[0].actor, "spot");
  EXPECT_EQ(plane.released[0].lease, 30u);
  std::map<int64_t, size_t> reported;
  for (const std::vector<contract::PrefixPart>& report : plane.kept)
    for (const contract::PrefixPart& p : report) {
      EXPECT_EQ(p.from, static_cast<int64_t>(reported[p.sample]));
      reported[p.sample] += p.tokens.size();
    }
  ASSERT_EQ(reported.size(), 4u);
  for (const auto& [sample, n] : reported) EXPECT_EQ(n, 25u) << "sample " << sample << ": every token drawn";
  EXPECT_EQ(actor.stats().errors.load(), 0) << "stopping is no error";
}

}  // namespace
}  // namespace echelon::rollout
