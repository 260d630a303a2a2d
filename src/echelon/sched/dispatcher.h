// Dispatcher: hands prompt groups to actors under the staleness-aware admission rule, tracks
// leases, re-issues work whose lease expired, and keeps the counts that must add up.
//
// Admission (AReaL's rule): with learner version v, batch size B groups and staleness budget
// S, a new group may start only while
//     started_live = consumed + pending + running  <  (S + v + 1) * B
// so at most S+1 batches are ever in flight beyond what the learner has consumed. Groups
// dropped as stale free their slot (otherwise the learner could starve). "running" includes
// groups waiting for re-issue: their slot was taken at first hand-out, so a re-issue needs no
// admission and is handed out before any new group.
//
// S may change during a run (SetMaxStaleness: `rl.staleness: auto`, sched/staleness_control.h).
// The window follows at once (a smaller S admits nothing new until consumption catches up), and
// each group remembers the S in force at its first hand-out (AdmittedStaleness): the learner
// consumes it under the larger of that and the current S, so no group is dropped only because
// S shrank after it was issued.
//
// Group ids are 0, 1, 2, ... in order of first hand-out; the caller maps an id to a prompt
// deterministically (e.g. TaskAdapter::TrainPrompt(id)), so a re-issued group is the same
// prompt. Each hand-out carries a lease id; only the current lease holder may submit. A
// lease expires once Now() > hand-out time + lease_seconds, unless its holder reports progress:
// each report of more tokens generated than the last (Renew) moves the deadline to
// lease_seconds after it, so a long group on a slow worker keeps its lease while it advances
// and a silent or stalled one loses it within one lease; no report keeps a lease past
// max_lease_life_factor x lease_seconds after its hand-out, nor counts more than
// max_group_tokens. One worker's actors together hold at most max_leases_per_worker running
// leases: more Acquire calls get nothing until one ends.
//
// Every hand-out ends exactly once as consumed, dropped-stale, filtered (dynamic sampling: a
// group whose rewards have no spread, dropped before any update) or re-issued (lease expired or
// holder evicted), or is still outstanding/pending:
//   handed_out == consumed + dropped_stale + filtered + reissued + outstanding + pending
// Tokens: a group's completion tokens are counted once, by its fate; with resumable groups the
// prefix a re-issued group continues from is counted with the group, not as preempted.
// Dropped and filtered groups free their admission slot, so more prompts are drawn in their place.
//
// Deadline-aware dispatch (lookahead > 0): instead of the next group in line, a worker gets the
// waiting group it is predicted to return before the learner would drop it as stale with the
// least time to spare (sched/completion_forecast.h: the worker's measured rate, the prompt's
// measured length, the learner's seconds per update), so long prompts go to fast workers and
// short ones to slow ones. The waiting groups are those queued for re-issue and up to
// `lookahead` new ones drawn ahead (ids taken in order, handed out in any order; a new one
// still needs admission). A worker for whom no waiting group fits gets nothing
// (counts().predicted_late); a group passed over kMaxPassOvers times goes to the next worker
// that asks. Where nothing is known yet the order is first come, first served, as with
// lookahead 0. Submit's `tokens` (the group's completion tokens) and SetVersion feed the
// forecast; they also count the tokens consumed and wasted, by cause.
//
//   Dispatcher d({.max_staleness = 2, .batch_groups = 32, .lease_seconds = 60}, &clock);
//   if (auto w = d.Acquire("actor-0")) { ...; d.Submit(w->group_id, w->lease_id); }
//   d.Settle(group_id, Outcome::kConsumed);  d.SetVersion(v + 1);
//
// Thread contract: all methods are safe to call concurrently (one internal mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/common/status.h"
#include "echelon/sched/completion_forecast.h"
#include "echelon/sched/tunables.h"
#include "echelon/sched/work_item.h"

namespace echelon::sched {

struct DispatcherOptions {
  int64_t max_staleness = 0;   // S
  int64_t batch_groups = 1;    // B: groups the learner consumes per update
  double lease_seconds = kDefaultLeaseSeconds;  // a hand-out not submitted by then is re-issued
  int64_t max_leases_per_worker = kMaxLeasesPerWorker;  // running leases of one worker's actors; 0: no cap
  double max_lease_life_factor = kMaxLeaseLifeFactor;  // progress renews a lease up to this x lease_seconds
  int64_t max_group_tokens = 0;  // the most tokens a group can hold (G x max_new_tokens); 0: unchecked
  int64_t lookahead = 0;         // deadline-aware dispatch: new groups drawn ahead (0: in order)
  // The prompt a group id stands for (a dataset row), whose lengths the forecast learns; null:
  // the group id itself (every group a prompt of its own).
  std::function<uint64_t(uint64_t group_id)> prompt_key;
};

// The worker an actor id belongs to: the id without its connection suffix ("actor-0#3" ->
// "actor-0"). Leases are capped, and metrics counted, per worker.
std::string WorkerName(const std::string& actor_id);

// kForeignLease: the lease is current but was handed to another actor (a forgery: an honest
// actor only submits the leases it was given).
enum class SubmitResult { kAccepted, kUnknownGroup, kNotLeaseHolder, kAlreadySettled, kForeignLease };
enum class Outcome { kConsumed, kDroppedStale, kFiltered };

struct DispatchCounts {
  uint64_t handed_out = 0;      // hand-outs, re-issues included
  uint64_t consumed = 0;        // groups
  uint64_t dropped_stale = 0;   // groups
  uint64_t filtered = 0;        // groups dropped by dynamic sampling (no reward spread)
  uint64_t reissued = 0;        // hand-outs that ended by lease expiry or eviction
  uint64_t outstanding = 0;     // hand-outs not yet submitted (running)
  uint64_t pending = 0;         // submitted, waiting for the learner to settle
  uint64_t refused = 0;         // submissions refused (unknown group, not holder, settled)
  uint64_t awaiting_reissue = 0;  // groups whose hand-out ended, queued for the next Acquire
  uint64_t predicted_late = 0;  // Acquire calls that got nothing: no waiting group fit the worker
  uint64_t resumed = 0;         // hand-outs that continued a group from its prefix (Carry)
  uint64_t tokens_carried = 0;  // the prefixes' tokens they continued from
  // Completion tokens (Submit's `tokens`, the progress a lost lease had reported):
  uint64_t tokens_consumed = 0;
  uint64_t tokens_stale = 0;      // of groups dropped as stale
  uint64_t tokens_filtered = 0;   // of groups dropped by dynamic sampling
  uint64_t tokens_preempted = 0;  // reported by leases that expired or whose holder left
  uint64_t tokens_refused = 0;    // of submissions refused (late, forged content)
};

// The token counts by fate, as metrics.jsonl's tokens_by_fate: {"consumed", "stale",
// "filtered", "preempted", "refused"}.
std::map<std::string, int64_t> TokensByFate(const DispatchCounts& c);

// What a checkpoint keeps of a dispatcher. Hand-outs not yet settled (running, submitted
// and waiting for the learner, or queued for re-issue) are listed in `unsettled`; restoring
// queues them all for re-issue, because the rollouts they stood for died with the process.
struct DispatcherState {
  int64_t version = 0;
  uint64_t next_group = 0;
  uint64_t next_lease = 1;
  DispatchCounts counts;            // outstanding/pending/awaiting_reissue are ignored on restore
  std::vector<uint64_t> unsettled;  // re-issue order
  std::vector<uint64_t> drawn;      // drawn ahead, never handed out (deadline-aware dispatch)
};

class Dispatcher {
 public:
  Dispatcher(const DispatcherOptions& options, const Clock* clock);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // A re-issued group if one waits, else a new group if admission allows, else nullopt.
  // Expired leases are collected first.
  // `held_version`: the snapshot the actor holds, when it says (-1: not said); deadline-aware
  // dispatch then knows the worker's lag exactly instead of its running mean.
  std::optional<WorkItem> Acquire(const std::string& actor, int64_t held_version = -1);
  // The lease holder hands in its group's rollouts; they now wait for the learner. Expired
  // leases are collected first, so a late holder gets kNotLeaseHolder whether or not anyone
  // called ExpireLeases; the same lease submitting twice gets kAlreadySettled; a lease is
  // bound to the actor it was handed to.
  // `tokens`: the group's completion tokens in all (0: not known), for the forecast and the
  // counts; `behavior_version`: the snapshot it was sampled from (-1: not known), for the
  // worker's lag in the forecast.
  SubmitResult Submit(uint64_t group_id, uint64_t lease_id, const std::string& actor, int64_t tokens = 0,
                      int64_t behavior_version = -1);
  // The holder of a running lease reports `tokens` generated for its group so far: when the
  // count grows (and stays within max_group_tokens) the lease's deadline moves to lease_seconds
  // from now, up to the life limit. Returns whether it did; a report for another lease or
  // actor, an expired one, or one that does not grow changes nothing.
  bool Renew(uint64_t group_id, uint64_t lease_id, const std::string& actor, int64_t tokens);
  // Whether `actor` holds `lease_id`, the current lease of a running group.
  bool Holds(uint64_t group_id, uint64_t lease_id, const std::string& actor) const;
  // Resumable groups: the learner now keeps `tokens` of the running lease's group (its samples'
  // prefixes, as its holder reported them, with any it was handed). When the lease ends, only
  // what it generated beyond them counts as preempted; the kept ones wait with the group.
  // `oldest_version`: the version that drew its oldest kept token (-1: not known), the deadline
  // deadline-aware dispatch forecasts its continuation against.
  void KeepPrefix(uint64_t group_id, uint64_t lease_id, int64_t tokens, int64_t oldest_version = -1);
  // The group just handed out under `lease_id` continues from `tokens` of those it kept (at most
  // what was kept). Unless this is called after its hand-out, a re-issued group starts over and
  // all it kept counts as preempted.
  void Carry(uint64_t group_id, uint64_t lease_id, int64_t tokens);
  // The learner refused a submitted (pending) group after its lease was checked (its content
  // was forged): the hand-out ends as re-issued and the group goes to the next Acquire.
  void Reissue(uint64_t group_id);
  // The learner's verdict on a submitted (pending) group; anything else is ignored, so a
  // group is settled at most once.
  void Settle(uint64_t group_id, Outcome outcome);
  // The holder gives `lease_id` up (it is stopping): re-issued now, as at expiry. Returns
  // whether it was that actor's running lease.
  bool Release(uint64_t group_id, uint64_t lease_id, const std::string& actor);
  // Re-issues every outstanding hand-out of this actor (it left or was evicted); returns how
  // many. Expired leases are collected first and not counted here.
  int Evict(const std::string& actor);
  // Re-issues hand-outs whose lease expired; returns how many.
  int ExpireLeases();
  // The learner's current version v (monotonic); its time feeds the forecast.
  void SetVersion(int64_t version);
  int64_t version() const;
  // The staleness budget S of admission from now on, and the one a group was first handed out
  // under (the current S for a group it does not know: settled, or re-issued after a restore).
  void SetMaxStaleness(int64_t max_staleness);
  int64_t max_staleness() const;
  int64_t AdmittedStaleness(uint64_t group_id) const;
  // How many new groups admission would allow right now.
  int64_t Capacity() const;
  DispatchCounts counts() const;
  // Progress reports that renewed a lease (this process).
  uint64_t renewals() const;
  // Acquire calls refused because the worker already held max_leases_per_worker leases (this
  // process).
  uint64_t lease_capped() const;
  // The workers such a call came from.
  std::set<std::string> capped_workers() const;

  // Per worker: the mean seconds from a group's hand-out to its submission, over the groups it
  // submitted while it held their lease (this process).
  std::map<std::string, double> WorkerGroupSeconds() const;
  // What the forecast now predicts for `actor`'s worker and a group (seconds; nullopt: unknown).
  std::optional<double> PredictSeconds(const std::string& actor, uint64_t group_id) const;

  DispatcherState Export() const;
  // Replaces all state with `state` (a fresh dispatcher, before any actor calls it). Every
  // unsettled group is queued for re-issue and counted as re-issued, so the counts still add
  // up and the group is later consumed or dropped exactly once. Lease ids continue from
  // `lease_base` (larger than any lease a previous process may have handed out), so an old
  // lease can never match a new one. Errors on inconsistent state (ids out of range, repeats).
  Status Restore(const DispatcherState& state, uint64_t lease_base);

 private:
  struct Lease {
    uint64_t lease_id;
    std::string actor;
    double deadline;
    double handed_at;
    int64_t version = 0;  // the learner's at the hand-out
    int64_t tokens = 0;   // the most progress reported
    int64_t carried = 0;  // tokens it continued from (Carry)
    int64_t kept = 0;     // tokens the learner keeps of its group, the carried ones included (KeepPrefix)
  };
  int ExpireLeasesLocked();
  int64_t CapacityLocked() const;
  // Ends the hand-out `it` (expiry or eviction) and queues its group for re-issue.
  void ReissueLocked(std::map<uint64_t, Lease>::iterator it);
  // Removes the running lease `it` (submitted or ended).
  void EndLeaseLocked(std::map<uint64_t, Lease>::iterator it);
  SubmitResult RefuseLocked(SubmitResult why, int64_t tokens = 0);
  uint64_t PromptKey(uint64_t group_id) const;
  // Deadline-aware choice among the waiting groups for `worker` (lookahead > 0): the group id
  // and whether it is a re-issue, or nullopt when none fits (see the top).
  std::optional<std::pair<uint64_t, bool>> ChooseLocked(const std::string& worker, int64_t held_version);

  const DispatcherOptions options_;
  const Clock* clock_;
  mutable std::mutex mu_;  // guards everything below
  int64_t version_ = 0;
  int64_t max_staleness_;
  std::map<uint64_t, int64_t> admitted_staleness_;  // unsettled group id -> S at its first hand-out
  uint64_t next_group_ = 0;
  uint64_t next_lease_ = 1;
  std::map<uint64_t, Lease> running_;     // group id -> current lease
  std::map<std::string, int64_t> worker_leases_;  // running leases per WorkerName, none at 0
  uint64_t lease_capped_ = 0;
  uint64_t renewals_ = 0;
  std::set<std::string> capped_workers_;
  std::map<uint64_t, uint64_t> pending_;  // submitted, unsettled: group id -> submitting lease
  std::map<uint64_t, uint64_t> settled_;  // consumed or dropped: group id -> submitting lease
  std::deque<uint64_t> reissue_queue_;    // groups without a lease, handed out first
  std::deque<uint64_t> drawn_;            // new groups drawn ahead, not yet handed out
  std::map<uint64_t, int64_t> passed_over_;  // waiting group -> times another was chosen instead
  std::map<uint64_t, int64_t> pending_tokens_;  // submitted, unsettled: group id -> its tokens
  std::map<uint64_t, int64_t> kept_waiting_;    // re-issue queue: group id -> tokens the learner kept of it
  std::map<uint64_t, int64_t> kept_oldest_;     // unsettled group id -> the version of its oldest kept token
  std::map<uint64_t, int64_t> carriable_;       // running: group id -> what its hand-out may Carry
  std::map<uint64_t, int64_t> pending_carried_;  // submitted, unsettled: group id -> tokens it carried
  CompletionForecast forecast_;
  std::map<std::string, std::pair<double, int64_t>> held_;  // worker -> seconds held, groups submitted
  DispatchCounts counts_;
};

}  // namespace echelon::sched
