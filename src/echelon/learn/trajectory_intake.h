// TrajectoryIntake: the learning plane's door for rollouts. It implements the three
// rollout/transport.h interfaces that actors use, whether they are threads of this process or
// remote processes behind net::LearnerServer: it hands out work from the dispatcher (with the
// group's prompt from the task adapter), checks and queues submitted groups, and serves the
// newest snapshot. The learner loop takes the queued groups through ArrivalQueue::Drain.
//
// A submission is read as an attacker with a valid token would write it: the group size,
// version, token ids, lengths and log-probs are checked (Validate; a refusal is counted by
// reason), the lease must be the dispatcher's current one, the prompt is the adapter's for the
// group id (never the message's), and every single-turn reward is recomputed from the tokens.
//
//   TrajectoryIntake intake(&dispatcher, task.get(), &vocab, model_vocab_size, group_size);
//   intake.Publish(snapshot);                  // actors can start
//   std::vector<GroupRollout> got = intake.Drain(0.05);
//
// Thread contract: every method is safe for concurrent use (mu_ guards the queue, the
// snapshot and the counters; the dispatcher has its own lock).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "echelon/data/adapter.h"
#include "echelon/model/vocabulary.h"
#include "echelon/rollout/transport.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::learn {

// Where the learner loop takes submitted groups from.
class ArrivalQueue {
 public:
  virtual ~ArrivalQueue() = default;
  // Groups submitted since the last call, in submission order; waits up to `timeout_seconds`
  // for at least one.
  virtual std::vector<rollout::GroupRollout> Drain(double timeout_seconds) = 0;
  // Why no more groups can come (the learner's own reward failed); Ok while they can.
  virtual Status failure() const { return Status::Ok(); }
};

class TrajectoryIntake : public rollout::WorkSource,
                         public rollout::TrajectorySink,
                         public rollout::SnapshotSource,
                         public ArrivalQueue {
 public:
  // Token ids must be below `model_vocab_size` (the model's rows, which may exceed the
  // tokenizer's ids).
  TrajectoryIntake(sched::Dispatcher* dispatcher, const data::TaskAdapter* task, const model::Vocabulary* vocab,
                   int64_t model_vocab_size, int group_size);

  std::optional<rollout::Assignment> Acquire(const std::string& actor) override;
  rollout::SubmitOutcome Submit(rollout::GroupRollout rollout) override;
  rollout::Snapshot Latest() override;
  std::vector<rollout::GroupRollout> Drain(double timeout_seconds) override;
  Status failure() const override;

  void Publish(rollout::Snapshot snapshot);
  // Submissions refused, by reason, and rewards the learner corrected ("reward_corrected").
  std::map<std::string, int64_t> refusals() const;
  // Completion tokens in accepted groups, and accepted groups per actor name.
  int64_t accepted_tokens() const;
  std::map<std::string, int64_t> actor_groups() const;
  // Continues the counters above from a checkpoint.
  void RestoreCounters(std::map<std::string, int64_t> refusals, int64_t accepted_tokens,
                       std::map<std::string, int64_t> actor_groups);

 private:
  // Empty when well-formed, else the reason it is refused.
  std::string Validate(const rollout::GroupRollout& g) const;
  // Recomputes what the learner can verify itself: the reward of every single-turn episode,
  // from the tokens (not the actor's text). Returns how many rewards the actor had wrong.
  Result<int64_t> RecheckRewards(rollout::GroupRollout* g) const;

  sched::Dispatcher* dispatcher_;
  const data::TaskAdapter* task_;
  const model::Vocabulary* vocab_;
  const int group_size_;
  const int64_t vocab_size_;
  mutable std::mutex mu_;  // guards queue_, snapshot_, refusals_, failure_, accepted_tokens_, actor_groups_
  std::condition_variable arrived_;
  std::deque<rollout::GroupRollout> queue_;
  rollout::Snapshot snapshot_;
  std::map<std::string, int64_t> refusals_;
  Status failure_;
  int64_t accepted_tokens_ = 0;
  std::map<std::string, int64_t> actor_groups_;
};

// The actor's name without its connection suffix ("actor-0#3" -> "actor-0"): metrics count
// per worker, whatever connection it came back on.
std::string ActorName(const std::string& actor_id);

}  // namespace echelon::learn
