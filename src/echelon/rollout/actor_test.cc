// The actor loop's handling of a group whose snapshot went out of date under it.
#include "echelon/rollout/actor.h"

#include "echelon/rollout/testing.h"

#include <gtest/gtest.h>

#include <thread>

namespace echelon::rollout {
namespace {

// One group to do, then none; the newest snapshot is `version`.
class Plane : public contract::WorkSource, public contract::TrajectorySink, public contract::SnapshotSource {
 public:
  std::optional<contract::Assignment> Acquire(const std::string&) override {
    std::lock_guard<std::mutex> lock(mu);
    if (handed) return std::nullopt;
    handed = true;
    contract::Assignment a;
    a.work.group_id = 7;
    a.work.lease_id = 70;
    a.prompt = data::Prompt{7, "1+2=", scored_by_learner ? "" : "3"};
    a.group_size = 2;
    a.scored_by_learner = scored_by_learner;
    a.played_by_learner = played_by_learner;
    if (played_by_learner) a.prompt = data::Prompt{};
    return a;
  }
  contract::SubmitOutcome Submit(contract::GroupRollout r) override {
    std::lock_guard<std::mutex> lock(mu);
    submitted.push_back(std::move(r));
    return {true, ""};
  }
  contract::Snapshot Latest() override {
    std::lock_guard<std::mutex> lock(mu);
    return {version, std::make_shared<const std::string>("weights")};
  }
  std::mutex mu;
  bool handed = false;
  bool scored_by_learner = false;
  bool played_by_learner = false;
  int64_t version = 3;
  std::vector<contract::GroupRollout> submitted;
};

// Fails its first `failures` samples with `code` (moving the plane's newest version on, as a
// pipeline's stages move past the head), then answers.
class FlakyPolicy : public SnapshotPolicy {
 public:
  FlakyPolicy(Plane* plane, int failures, StatusCode code) : plane_(plane), failures_(failures), code_(code) {}
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t) override {
    ++calls;
    if (failures_-- > 0) {
      std::lock_guard<std::mutex> lock(plane_->mu);
      ++plane_->version;
      return Status(code_, "stages moved past v" + std::to_string(version_));
    }
    std::vector<data::Turn> out(prompts.size());
    for (data::Turn& t : out) {
      t.tokens = {1};
      t.logprobs = {-0.5f};
      t.text = "3";
    }
    return out;
  }
  Status LoadSnapshot(const std::string&, int64_t version) override {
    version_ = version;
    return Status::Ok();
  }
  int64_t version() const override { return version_; }
  int calls = 0;

 private:
  Plane* plane_;
  int failures_;
  StatusCode code_;
  int64_t version_ = -1;
};

// An adapter that cannot score without the prompt's reference.
class NeedsTheAnswerTask : public OneAnswerTask {
 public:
  Result<std::vector<data::Episode>> RunGroup(const data::Prompt& prompt, int, data::Policy&, uint64_t) const override {
    if (prompt.reference.empty()) return FailedPrecondition("no reference to score against");
    return std::vector<data::Episode>();
  }
};

// Runs the actor until the plane holds a submission or `seconds` pass.
void RunFor(Actor& actor, Plane& plane, double seconds) {
  std::atomic<bool> stop{false};
  std::thread t([&] { actor.Run(stop); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(plane.mu);
      if (!plane.submitted.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  t.join();
}

TEST(ActorTest, AGroupAbortedBecauseItsSnapshotWentStaleRunsAgainOnTheNewest) {
  Plane plane;
  OneAnswerTask task;
  auto policy = std::make_unique<FlakyPolicy>(&plane, 1, StatusCode::kAborted);
  FlakyPolicy* p = policy.get();
  Actor actor(ActorOptions{}, &plane, &plane, &plane, &task, std::move(policy));
  RunFor(actor, plane, 5);
  ASSERT_EQ(plane.submitted.size(), 1u);
  EXPECT_EQ(p->calls, 2);
  EXPECT_EQ(plane.submitted[0].behavior_version, 4) << "tagged with the snapshot that generated it";
  EXPECT_EQ(actor.stats().errors.load(), 0);
}

TEST(ActorTest, OtherFailuresAndEndlessAbortsLeaveTheGroupToItsLease) {
  for (const auto& [failures, code] : {std::pair{1, StatusCode::kInternal}, std::pair{99, StatusCode::kAborted}}) {
    Plane plane;
    OneAnswerTask task;
    auto policy = std::make_unique<FlakyPolicy>(&plane, failures, code);
    FlakyPolicy* p = policy.get();
    Actor actor(ActorOptions{}, &plane, &plane, &plane, &task, std::move(policy));
    RunFor(actor, plane, 0.5);
    EXPECT_TRUE(plane.submitted.empty());
    EXPECT_EQ(p->calls, code == StatusCode::kAborted ? Actor::kGroupAttempts : 1);
    EXPECT_EQ(actor.stats().errors.load(), 1);
  }
}

// The learner withholds a single-turn group's answer and scores the group itself: the actor
// samples without calling the task's scoring (which would fail, or score against "").
TEST(ActorTest, WorkTheLearnerScoresIsSampledWithoutScoring) {
  Plane plane;
  plane.scored_by_learner = true;
  NeedsTheAnswerTask task;
  Actor actor(ActorOptions{}, &plane, &plane, &plane, &task,
              std::make_unique<FlakyPolicy>(&plane, 0, StatusCode::kInternal));
  RunFor(actor, plane, 5);
  ASSERT_EQ(plane.submitted.size(), 1u);
  ASSERT_EQ(plane.submitted[0].episodes.size(), 2u);
  for (const data::Episode& e : plane.submitted[0].episodes) {
    ASSERT_EQ(e.turns.size(), 1u);
    EXPECT_EQ(e.turns[0].text, "3");
    EXPECT_EQ(e.reward, 0.0);
  }
  EXPECT_EQ(actor.stats().errors.load(), 0);
}

// The learner's side of a played group: two turns of two prompts, then it takes the group.
class TwoTurnHost : public contract::EpisodeHost {
 public:
  explicit TwoTurnHost(Plane* plane) : plane_(plane) {}
  Result<contract::PlayStep> Play(const std::string& actor, const sched::WorkItem& work, int64_t version,
                                  std::vector<data::Turn> turns, double) override {
    calls.push_back({actor, work.lease_id, version, turns.size()});
    contract::PlayStep step;
    if (calls.size() == 3) {
      std::lock_guard<std::mutex> lock(plane_->mu);
      plane_->handed = true;
      plane_->submitted.push_back(contract::GroupRollout{});  // RunFor stops at a submission
      step.outcome = contract::SubmitOutcome{true, ""};
      return step;
    }
    step.prompts = {data::PolicyPrompt("your move"), data::PolicyPrompt("your move")};
    step.seed = 11;
    return step;
  }
  struct Call {
    std::string actor;
    uint64_t lease = 0;
    int64_t version = 0;
    size_t turns = 0;
  };
  std::vector<Call> calls;

 private:
  Plane* plane_;
};

// Work the learner plays comes without a prompt (a deal, a seed); the actor answers each
// turn's prompts through the host and never runs the task itself.
TEST(ActorTest, WorkTheLearnerPlaysIsAnsweredTurnByTurn) {
  Plane plane;
  plane.played_by_learner = true;
  NeedsTheAnswerTask task;
  TwoTurnHost host(&plane);
  Actor actor(ActorOptions{}, &plane, &plane, &plane, &task,
              std::make_unique<FlakyPolicy>(&plane, 0, StatusCode::kInternal));
  actor.set_episode_host(&host);
  RunFor(actor, plane, 5);
  ASSERT_EQ(host.calls.size(), 3u);
  EXPECT_EQ(host.calls[0].turns, 0u);
  EXPECT_EQ(host.calls[1].turns, 2u);
  EXPECT_EQ(host.calls[2].turns, 2u);
  for (const TwoTurnHost::Call& c : host.calls) {
    EXPECT_EQ(c.lease, 70u);
    EXPECT_EQ(c.version, 3);
  }
  EXPECT_EQ(actor.stats().groups.load(), 1);
  EXPECT_EQ(actor.stats().errors.load(), 0);
}

}  // namespace
}  // namespace echelon::rollout
