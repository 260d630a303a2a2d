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
// its samples' new tokens as they grow (ReportPrefix); the intake checks each report's content
// (each sample once, every token in the vocabulary, every log-prob a sampler's, every version
// published and never going back) and PrefixStore keeps it when it continues what was kept from
// the current holder (a malformed report is refused whole and is a strike). When the lease ends
// (preempted, silent, released) and the group is handed out again to an actor that continues
// prefixes, holds a snapshot at least as new as the prefix's newest token, and the group can
// be consumed after the update now running (its oldest token's version + S is past the
// learner's version), it goes with the kept prefix; otherwise the prefix is dropped. The new
// holder's submission must begin
// with exactly that prefix (`prefix_altered`, forged, otherwise), and a resumed group is always
// verified: when it fails, each earlier holder's part is checked in turn, and the first that
// fails strikes the holder that drew it (`prefix_logprob_mismatch`, `prefix_sample_not_drawn`;
// the submitter's refusal, `prefix_forged`, is no strike) and the group starts over; when all
// pass, the refusal is the submitter's. Verification runs once per resumed submission, on the
// submitting actor's call, never on a hand-out.
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
#include <functional>
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
#include "echelon/learn/eval_rounds.h"
#include "echelon/learn/prefix_store.h"
#include "echelon/learn/worker_stats.h"
#include "echelon/model/model_config.h"
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
  // Router replay (rl.router_replay): the model whose routes a turn may carry (data::Turn::routes);
  // nullptr: a turn with routes is refused. Not owned.
  const model::ModelConfig* routes = nullptr;
};

// Why a turn's routes (router replay) cannot be trained with, "" when they can: each entry at
// a fed position (the last token is never fed), at a sparse layer of `model` (nullptr: no
// routes may be sent at all), with k distinct experts in range, the entries in strictly
// increasing (position, layer) order. A refusal names the group's (a forgery: honest actors
// send only what their engine recorded).
std::string RouteRefusal(const data::Turn& turn, const model::ModelConfig* model);

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
  void Release(const std::string& actor, const sched::WorkItem& work) override;
  contract::SubmitOutcome Submit(contract::GroupRollout rollout) override;
  contract::Snapshot Latest() override;
  contract::Snapshot Pinned(int64_t version) override;
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
  // Hands out `rounds`' evaluation groups to actors that sample them
  // (contract::WorkRequest::evaluates): before any training group to an actor that holds the
  // round's snapshot, otherwise only when admission has no training group for it (the actor then
  // loads the pinned snapshot, SnapshotSource::Pinned), so a round costs few snapshot loads and
  // fills the time actors would wait at the staleness gate. Takes them back: checked as training groups are,
  // bar the dispatcher's lease (the rounds' own), scored with their set's reward and recorded
  // there, never queued for an update; a single-turn task's only. nullptr: none. Not owned;
  // call before actors start.
  void SetEvaluation(EvalRounds* rounds) { rounds_ = rounds; }
  // Mixes known-answer canary prompts into training work (eval.canaries): each new group is a
  // canary with probability `share`, decided from its id by the run's secret, its prompt one of
  // `set`'s held-out prompts (drawn the same way). A worker cannot tell it from a training group
  // (same size, temperature, snapshot and id sequence, no answer); its submission is checked as
  // any group's, scored with `set`'s reward into the worker's canary tally (canaries()), and
  // settled as filtered (dropped before any update). A single-turn task's only; call before
  // actors start.
  void SetCanaries(std::shared_ptr<const data::TaskAdapter> set, double share);
  // Each worker's canary groups, samples and successes so far (WorkerStats::SetCanaries).
  std::map<std::string, CanaryTally> canaries() const;
  // Called for every strike the intake deals outside a submission's answer (a forged prefix
  // report, or the part of a resumed group an earlier holder drew), with that actor's id: the
  // transport counts it towards quarantine as it does a forged submission. Call before actors start.
  void SetStrikeHook(std::function<void(const std::string& actor, const std::string& reason)> strike) {
    strike_ = std::move(strike);
  }
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
  // Counts a forged prefix report (or the part of a resumed group `actor` drew, found forged)
  // and strikes its worker (SetStrikeHook).
  void StrikeForPrefix(const std::string& actor, uint64_t group_id, const std::string& reason);
  // A resumed group `g` failed verification with `refusal`: the holder whose part of the prefix
  // fails is struck and the group starts over ("prefix_forged", the submitter not blamed), or,
  // when every part passes, `refusal` stands for the submitter's own tokens.
  std::string BlameSplice(const contract::GroupRollout& g, const std::string& refusal);
  // Empty when well-formed (`group_size` episodes), else the reason it is refused.
  std::string Validate(const contract::GroupRollout& g, int64_t group_size) const;
  // The canary prompt group `group_id` stands for (SetCanaries), or nullptr for a training group.
  const data::Prompt* CanaryPrompt(uint64_t group_id) const;
  // What an actor is handed for an evaluation item: the prompt without its answer.
  contract::Assignment EvaluationAssignment(EvalRounds::Handed h) const;
  // An evaluation group (IsEvalGroup) handed in: see SetEvaluation.
  contract::SubmitOutcome SubmitEvaluation(contract::GroupRollout rollout);
  struct Verdict {
    std::string refusal;    // empty: the group stands
    int64_t corrected = 0;  // rewards the actor had wrong (replaced by the learner's)
  };
  // Checks the prompts and replaces the rewards with `task`'s (see the top); an error is the
  // learner's reward failing.
  Result<Verdict> Verify(contract::GroupRollout* g, const data::TaskAdapter& task) const;
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
  EvalRounds* rounds_ = nullptr;
  std::shared_ptr<const data::TaskAdapter> canary_set_;  // null: no canaries
  double canary_share_ = 0;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable arrived_;
  std::deque<contract::GroupRollout> queue_;
  contract::Snapshot snapshot_;
  std::map<std::string, int64_t> refusals_;
  Status failure_;
  int64_t accepted_tokens_ = 0;
  std::map<std::string, int64_t> actor_groups_;
  std::map<std::string, int64_t> actor_forged_;
  std::map<std::string, CanaryTally> canaries_;  // by worker
  std::set<int64_t> published_;      // versions published by this process
  int64_t first_published_ = -1;     // the first of them (a resumed run's start)
  int64_t reward_failures_in_a_row_ = 0;
  std::set<std::string> failing_workers_;       // whose groups the failures in a row came from
  std::map<std::string, int64_t> worker_failures_in_a_row_;  // since the worker's last accepted group
  std::map<std::string, int64_t> worker_slow_in_a_row_;      // of those, past the reward-time budget
  std::set<std::string> workers_;               // every worker whose group reached the reward
  LogBudget refusal_log_;  // a worker can provoke a refusal at will: its lines are budgeted (common/log.h)
  PrefixStore prefixes_;  // resumable groups (its own lock; never called under mu_)
  std::function<void(const std::string& actor, const std::string& reason)> strike_;
};

// The actor's name without its connection suffix ("actor-0#3" -> "actor-0"): metrics count
// per worker, whatever connection it came back on.
std::string ActorName(const std::string& actor_id);

}  // namespace echelon::learn
