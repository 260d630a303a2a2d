// TrajectoryIntake: the learning plane's door for rollouts. It implements the three
// contract/transport.h interfaces that actors use, whether they are threads of this process or
// remote processes behind net::LearnerServer: it hands out work from the dispatcher (with the
// group's prompt from the task adapter), checks and queues submitted groups, and serves the
// newest snapshot. The learner loop takes the queued groups through ArrivalQueue::Drain.
//
// A submission is read as an attacker with a valid token would write it: the group size,
// version (one this process published), token ids, lengths and log-probs are checked
// (Validate; a refusal is counted by reason), the lease must be the dispatcher's current one and the submitter's, every turn's
// prompt ids must be the learner's own encoding of the task's prompt (the group's, or the
// replayed episode's observation), and rewards are the learner's: single-turn groups are
// rescored from the tokens, multi-turn episodes replayed from their actions (Verify); each
// turn's text becomes the learner's decoding of its tokens (the worker's is not kept). A group
// refused after its lease check goes back to the dispatcher for another actor.
//
// Resumable groups (IntakeLimits::resume, single-turn tasks): the holder of a lease reports
// its samples' new tokens as they grow (ReportPrefix: only the current holder, each part
// continuing what was kept, every token in the vocabulary, every log-prob a sampler's, every
// version published and none older than the one before it). When the lease ends (the worker
// was preempted, went silent or left) and the group is handed out again to an actor that can
// continue prefixes (WorkRequest::continues_prefixes), it goes with the kept prefix, provided the group can
// still be consumed (its oldest token's version + S is past the learner's version) and the
// verifier finds the prefix's tokens to be its claimed versions' seeded draws with their
// log-probs (every resumed prefix is checked; a forged one strikes its reporter and the group
// starts over). The new holder's submission must begin with exactly that prefix
// (`prefix_altered`, forged, otherwise); it is then checked like any group, per token version. With a
// BehaviourVerifier, drawn groups (and every group of an actor caught forging before) also have
// their behaviour log-probs recomputed under the version they claim. A reward that fails on a
// group refuses that group (reward_error) and the run goes on, unless kRewardFailuresToStop
// groups in a row fail across more than one worker (or from the run's only worker): one
// worker's failures alone cannot stop a run, and earn it a strike every
// kRewardFailuresPerStrike of them in a row while no other worker's group fails (every
// kSlowRewardsPerStrike for groups refused as reward_slow, past the reward-time budget).
//
//   TrajectoryIntake intake(&dispatcher, task.get(), &vocab, {model_vocab_size, group_size, max_new_tokens});
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
#include <set>
#include <string>
#include <vector>

#include "echelon/common/log.h"
#include "echelon/common/run_secret.h"
#include "echelon/contract/transport.h"
#include "echelon/data/adapter.h"
#include "echelon/learn/behaviour_verifier.h"
#include "echelon/model/vocabulary.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::learn {

// Where the learner loop takes submitted groups from.
class ArrivalQueue {
 public:
  virtual ~ArrivalQueue() = default;
  // Groups submitted since the last call, in submission order; waits up to `timeout_seconds`
  // for at least one.
  virtual std::vector<contract::GroupRollout> Drain(double timeout_seconds) = 0;
  // Why no more groups can come (the reward or the verifier is broken); Ok while they can.
  virtual Status failure() const { return Status::Ok(); }
};

// A reward that fails on this many submitted groups in a row is broken (a bug in the user's
// function, a scoring service down), not broken by one worker's text: the run stops with its
// error. One bad worker cannot reach it while honest groups score in between; 16 groups are a
// few seconds of a run, and each failure costs only that group's reward call.
inline constexpr int64_t kRewardFailuresToStop = 16;
// A worker whose groups alone fail the reward this many times in a row (while other workers
// take part) is aiming at it: a strike (three quarantine it, net/learner_server.h). An honest
// worker whose text hits a bug in the reward now and then never gets there.
inline constexpr int64_t kRewardFailuresPerStrike = 8;
// Groups of one worker alone that spend the reward-time budget (task.reward_group_seconds;
// refused as reward_slow) earn a strike every this many in a row: each held the reward's
// workers for the whole budget. A reward slow for every worker's text is slow, not attacked,
// and counts toward kRewardFailuresToStop like any failure.
inline constexpr int64_t kSlowRewardsPerStrike = 2;

// What a well-formed group looks like to the intake.
struct IntakeLimits {
  int64_t model_vocab_size = 0;       // token ids must be below it (the model's rows)
  int64_t group_size = 0;             // episodes per group
  int64_t max_completion_tokens = 0;  // tokens of one turn (rollout.max_new_tokens)
  RunSecret secret;                   // each assignment's seed is contract::GroupSeed(secret, group)
  // Resumable groups (rollout.resume): single-turn groups' prefixes are kept as their holders
  // report them, and a group whose lease ended is continued from its prefix (see the top).
  bool resume = false;
};

class TrajectoryIntake : public contract::WorkSource,
                         public contract::TrajectorySink,
                         public contract::SnapshotSource,
                         public ArrivalQueue {
 public:
  TrajectoryIntake(sched::Dispatcher* dispatcher, const data::TaskAdapter* task, const model::Vocabulary* vocab,
                   const IntakeLimits& limits);

  std::optional<contract::Assignment> Acquire(const std::string& actor) override;
  std::optional<contract::Assignment> AcquireWith(const std::string& actor, const contract::WorkRequest& request) override;
  void Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) override;
  bool ReportPrefix(const std::string& actor, const sched::WorkItem& work,
                    const std::vector<contract::PrefixPart>& parts) override;
  contract::SubmitOutcome Submit(contract::GroupRollout rollout) override;
  contract::Snapshot Latest() override;
  std::vector<contract::GroupRollout> Drain(double timeout_seconds) override;
  Status failure() const override;

  // A group the learner played for `actor` (HostedEpisodes) whose environment failed: refused
  // as reward_error and re-issued; it counts like a reward error (see the top).
  contract::SubmitOutcome EnvironmentFailed(const sched::WorkItem& work, const std::string& actor, const Status& error);

  const data::TaskAdapter& task() const { return *task_; }
  const model::Vocabulary& vocab() const { return *vocab_; }
  const IntakeLimits& limits() const { return limits_; }

  void Publish(contract::Snapshot snapshot);
  // Checks behaviour log-probs with `verifier` from now on (it sees every published snapshot);
  // nullptr: never. Call before actors start.
  void SetVerifier(BehaviourVerifier* verifier) { verifier_ = verifier; }
  // Submissions refused, by reason, and rewards the learner corrected ("reward_corrected").
  std::map<std::string, int64_t> refusals() const;
  // Completion tokens in accepted groups, accepted groups per actor name, and forged
  // submissions (SubmitOutcome::forged) per actor name.
  int64_t accepted_tokens() const;
  std::map<std::string, int64_t> actor_groups() const;
  std::map<std::string, int64_t> actor_forged() const;
  // Continues the counters above from a checkpoint.
  void RestoreCounters(std::map<std::string, int64_t> refusals, int64_t accepted_tokens,
                       std::map<std::string, int64_t> actor_groups, std::map<std::string, int64_t> actor_forged);

 private:
  // A single-turn group's samples so far, as the holders of its leases reported them.
  struct HeldPrefix {
    uint64_t lease_id = 0;  // the lease whose reports extend it
    std::string actor;      // that lease's holder
    std::vector<data::Turn> samples;  // one a sample: tokens, logprobs, versions
    std::vector<size_t> handed;       // lengths handed to that lease with its work (resumed), else empty
    int64_t tokens = 0;
  };
  // The prefix kept of a re-issued group, if the new hand-out `a` may continue from it: within
  // the staleness bound, and (with a verifier) its tokens the draws and log-probs of the versions
  // they claim; a forged one strikes the holder that reported it. Otherwise nullopt, and the
  // group starts over.
  std::optional<HeldPrefix> ResumablePrefix(const contract::Assignment& a, HeldPrefix held);
  // Empty when a submission of a resumed group begins with the prefix it was handed, else the
  // reason it is refused.
  std::string CheckSplice(const contract::GroupRollout& g);
  // Empty when well-formed, else the reason it is refused.
  std::string Validate(const contract::GroupRollout& g) const;
  struct Verdict {
    std::string refusal;    // empty: the group stands
    int64_t corrected = 0;  // rewards the actor had wrong (replaced by the learner's)
  };
  // Checks the prompts and replaces the rewards with the learner's own (see the top); an error
  // is the learner's reward failing.
  Result<Verdict> Verify(contract::GroupRollout* g) const;
  contract::SubmitOutcome Refuse(const contract::GroupRollout& g, const std::string& reason);
  // The group's reward (`failed`: "reward_error") or verification ("verify_error") failed with
  // `error` on `actor`'s group: the group is re-issued and the failure counted (see the top).
  contract::SubmitOutcome Failed(uint64_t group_id, const std::string& actor, const std::string& failed,
                                 const Status& error);

  sched::Dispatcher* dispatcher_;
  const data::TaskAdapter* task_;
  const model::Vocabulary* vocab_;
  const IntakeLimits limits_;
  BehaviourVerifier* verifier_ = nullptr;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable arrived_;
  std::deque<contract::GroupRollout> queue_;
  contract::Snapshot snapshot_;
  std::map<std::string, int64_t> refusals_;
  Status failure_;
  int64_t accepted_tokens_ = 0;
  std::map<std::string, int64_t> actor_groups_;
  std::map<std::string, int64_t> actor_forged_;
  std::set<int64_t> published_;      // versions published by this process
  int64_t first_published_ = -1;     // the first of them (a resumed run's start)
  int64_t reward_failures_in_a_row_ = 0;
  std::set<std::string> failing_workers_;       // whose groups the failures in a row came from
  std::map<std::string, int64_t> worker_failures_in_a_row_;  // since the worker's last accepted group
  std::map<std::string, int64_t> worker_slow_in_a_row_;      // of those, past the reward-time budget
  std::set<std::string> workers_;               // every worker whose group reached the reward
  LogBudget refusal_log_;  // a worker can provoke a refusal at will: its lines are budgeted (common/log.h)
  std::mutex prefix_mu_;  // guards prefixes_ (taken before mu_, never inside it)
  std::map<uint64_t, HeldPrefix> prefixes_;  // by group id
};

// The actor's name without its connection suffix ("actor-0#3" -> "actor-0"): metrics count
// per worker, whatever connection it came back on.
std::string ActorName(const std::string& actor_id);

}  // namespace echelon::learn
