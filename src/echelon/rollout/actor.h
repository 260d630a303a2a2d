// Actor: the rollout plane's loop. Acquires a prompt group, makes sure it holds the newest
// snapshot, runs the task adapter's episodes with its policy, and submits the group tagged with
// the policy version that generated it (the oldest, when partial rollouts moved it to newer
// snapshots midway). While a group generates, the actor reports its progress (tokens so far)
// every sched::kProgressSeconds, which keeps the group's lease alive however long it runs. When
// `stop` is set midway (a signal: a spot instance's preemption notice) a backend that reports its
// steps ends the generation at the next one; the actor reports the samples' prefixes and hands
// the lease back (WorkSource::Release), so another worker continues the group at once.
//
//   Actor actor(options, &intake, &intake, &intake, task, std::move(policy), &clock);
//   std::thread t([&] { actor.Run(stop); });
//
// Time (generation time, back-off sleeps, the slowdown of experiments) comes from the Clock.
// Thread contract: Run() executes on one thread; stats() may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "echelon/common/clock.h"
#include "echelon/contract/transport.h"
#include "echelon/data/adapter.h"
#include "echelon/rollout/snapshot_policy.h"
#include "echelon/sched/tunables.h"

namespace echelon::rollout {

struct ActorOptions {
  std::string name = "actor-0";
  double idle_sleep_seconds = sched::kActorIdleSleepSeconds;  // back-off when the gate admits no work,
  double max_idle_sleep_seconds = sched::kActorMaxIdleSleepSeconds;  // doubling up to this
  double slowdown = 1.0;         // >1 sleeps (slowdown-1) x generation time as it goes: emulates a slower worker
  // Partial rollouts: a snapshot published while a group generates is taken at once and the
  // group's unfinished samples continue on it (AReaL's interruptible generation); every token
  // records the version that drew it. Needs a backend that reports its steps (the builtin one).
  bool partial = false;
};

struct ActorStats {
  std::atomic<int64_t> groups{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> errors{0};
};

class Actor {
 public:
  // A group whose generation is Aborted (the snapshot went out of date under it) runs again on
  // the newest snapshot, this many times in all.
  static constexpr int kGroupAttempts = 5;

  // `clock` outlives the actor; null: the real clock.
  Actor(ActorOptions options, contract::WorkSource* work, contract::TrajectorySink* sink,
        contract::SnapshotSource* snapshots, const data::TaskAdapter* task,
        std::unique_ptr<SnapshotPolicy> policy, const Clock* clock = nullptr);

  // Where work the learner plays itself (Assignment::played_by_learner) is played: each turn's
  // prompts come from `host` and the completions go back to it. Without one such work fails.
  void set_episode_host(contract::EpisodeHost* host) { episodes_ = host; }

  // Loops until `stop` becomes true.
  void Run(const std::atomic<bool>& stop);
  const ActorStats& stats() const { return stats_; }

 private:
  bool RefreshSnapshot();
  // Puts `snapshot` (any version, an older one too) into the policy; false when it is empty or
  // could not be loaded.
  bool Load(const contract::Snapshot& snapshot);
  // Samples an evaluation group (contract::Assignment::eval_version) with its pinned snapshot
  // and temperature, and submits it.
  Result<contract::SubmitOutcome> PlayEvaluation(const contract::Assignment& a, const std::atomic<bool>& stop,
                                                 int64_t* tokens);
  // Runs the task's episodes (or samples a single-turn group) here and submits the group.
  Result<contract::SubmitOutcome> PlayHere(const contract::Assignment& a, const std::atomic<bool>& stop,
                                           int64_t* tokens);
  // Samples each turn the learner asks for until it says how it took the group.
  Result<contract::SubmitOutcome> PlayHosted(const contract::Assignment& a, const std::atomic<bool>& stop,
                                             int64_t* tokens);
  class GroupWatch;

  ActorOptions options_;
  contract::WorkSource* work_;
  contract::TrajectorySink* sink_;
  contract::SnapshotSource* snapshots_;
  contract::EpisodeHost* episodes_ = nullptr;
  const data::TaskAdapter* task_;
  std::unique_ptr<SnapshotPolicy> policy_;
  std::shared_ptr<const std::string> base_;  // the LoRA base the policy holds (contract::Snapshot::base)
  const Clock* clock_;
  ActorStats stats_;
};

}  // namespace echelon::rollout
