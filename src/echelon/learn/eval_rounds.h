// EvalRounds: evaluation as work. Every eval.every versions the learner opens a round on the
// snapshot it just published: each prompt of each evaluation set (eval.sets: a named file, k
// samples a prompt at the set's temperature) becomes one work item, handed to actors like a
// training group but apart from the dispatcher's admission (no staleness deadline: its tokens
// never enter an update). An item is sampled with the round's snapshot exactly (an actor that
// holds a newer one fetches the pinned version: contract::SnapshotSource::Pinned), scored by
// the learner with the set's reward, and spot-verified like any group (learn/trajectory_intake.h).
// When every item of a round is in, each set's figures are ready:
//   mean@k  the mean success over the set's prompts and their k samples;
//   pass@k  the share of prompts with at least one success among k samples, estimated without
//           bias from n = k samples (PassAtK; with n = k it is whether any succeeded).
//
// Items go out in order, rounds oldest first (the intake hands an actor the items of the round
// on the snapshot it holds first, then training work, then any item: learn/trajectory_intake.h),
// each under a lease: a lease not submitted by
// lease_seconds after its hand-out (or its holder's last progress, up to
// sched::kMaxLeaseLifeFactor x lease_seconds) goes back to the front of the queue; only the
// current holder's submission counts, once. Item ids have kEvalGroupBit set, so they never
// meet a training group's id (the dispatcher's are 0, 1, 2, ...) and each draws its own seed
// (contract::GroupSeed).
//
//   EvalRounds rounds(std::move(sets), {.lease_seconds = 120}, &clock);
//   rounds.Open(v, snapshot);                    // after publishing v
//   if (auto h = rounds.Acquire("actor-0")) { ...; rounds.Record(h->id, h->lease_id, actor, successes); }
//   for (EvalSetResult r : rounds.TakeFinished()) { ... }
//
// Thread contract: every method is safe for concurrent use (one mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/contract/transport.h"
#include "echelon/data/adapter.h"
#include "echelon/sched/tunables.h"

namespace echelon::learn {

// Set on every evaluation item's id (a training group's id is far below it).
inline constexpr uint64_t kEvalGroupBit = uint64_t{1} << 63;
inline bool IsEvalGroup(uint64_t group_id) { return (group_id & kEvalGroupBit) != 0; }

// One evaluation set: its prompts, the adapter that scores them, k samples each at `temperature`.
struct EvalSet {
  std::string name;
  std::shared_ptr<const data::TaskAdapter> task;  // holds the set's prompts (HeldOut) and its reward
  int64_t k = 4;
  double temperature = 1.0;
};

// A set's figures for one round.
struct EvalSetResult {
  std::string name;
  int64_t version = 0;   // the snapshot every sample was drawn from
  int64_t prompts = 0;
  int64_t k = 0;
  double mean_at_k = 0;  // mean success over prompts and samples
  double pass_at_k = 0;  // mean over prompts of PassAtK(k, successes, k)
  double seconds = 0;    // from the round's opening to its last item
};

// The unbiased estimator of pass@k from n samples of which c succeeded (Chen et al., 2021):
// 1 - C(n - c, k) / C(n, k), computed as a product so that large n does not overflow.
// Needs 0 <= c <= n and 1 <= k <= n.
double PassAtK(int64_t n, int64_t c, int64_t k);

struct EvalRoundsOptions {
  double lease_seconds = sched::kDefaultLeaseSeconds;
  double max_lease_life_factor = sched::kMaxLeaseLifeFactor;
};

class EvalRounds {
 public:
  EvalRounds(std::vector<EvalSet> sets, const EvalRoundsOptions& options, const Clock* clock);
  EvalRounds(const EvalRounds&) = delete;
  EvalRounds& operator=(const EvalRounds&) = delete;

  const std::vector<EvalSet>& sets() const { return sets_; }

  // Queues a round of every set's prompts on `snapshot` (its version; kept until the round is
  // done, for actors that hold another: Pinned). A second round of one version is ignored.
  void Open(const contract::Snapshot& snapshot);

  // An item handed out: what the actor samples and where it goes back.
  struct Handed {
    uint64_t id = 0;
    uint64_t lease_id = 0;
    int64_t version = 0;
    const EvalSet* set = nullptr;
    data::Prompt prompt;  // with its reference (the intake withholds it from the actor)
  };
  // The next queued item (expired leases are collected first) of a round on `held_version` (the
  // snapshot the actor holds), or of any round when `held_version` is -1; nullopt when none waits.
  std::optional<Handed> Acquire(const std::string& actor, int64_t held_version = -1);

  // What a submission must match, when `actor` holds `lease_id`, the current lease of item `id`
  // (not yet recorded); nullopt otherwise (late, repeated, foreign or unknown).
  std::optional<Handed> Holder(uint64_t id, uint64_t lease_id, const std::string& actor);
  // The holder's group was scored: `successes` of the set's k samples. Ignored unless the lease
  // is still that actor's current one; each item counts once.
  void Record(uint64_t id, uint64_t lease_id, const std::string& actor, int64_t successes);
  // The holder's group could not be taken (refused or failed): the item goes back to the queue.
  void Requeue(uint64_t id, uint64_t lease_id, const std::string& actor);
  // The holder reports progress: its lease runs lease_seconds from now, up to the life limit.
  void Renew(uint64_t id, uint64_t lease_id, const std::string& actor);

  // The snapshot of an open round of `version` (version -1 when none is open).
  contract::Snapshot Pinned(int64_t version) const;
  // Results of the rounds finished since the last call, oldest round first, sets in order.
  std::vector<EvalSetResult> TakeFinished();
  // Rounds not yet finished.
  int64_t open_rounds() const;
  // Items handed out again after their lease ended.
  int64_t reissued() const;

 private:
  struct Item {
    int64_t round = 0;   // index into rounds_
    size_t set = 0;
    size_t prompt = 0;
    uint64_t lease_id = 0;  // 0: queued
    std::string actor;
    double handed_at = 0;
    double deadline = 0;
    int64_t successes = -1;  // -1: not in yet
  };
  struct Round {
    contract::Snapshot snapshot;
    double opened_at = 0;
    int64_t missing = 0;  // items not in yet
    std::vector<std::vector<int64_t>> successes;  // per set, per prompt
  };
  void ExpireLocked();
  Item* FindLocked(uint64_t id, uint64_t lease_id, const std::string& actor);

  const std::vector<EvalSet> sets_;
  const EvalRoundsOptions options_;
  const Clock* clock_;
  mutable std::mutex mu_;  // guards everything below
  std::vector<Round> rounds_;
  std::map<uint64_t, Item> items_;  // by id, until recorded
  std::deque<uint64_t> queue_;      // items waiting for a hand-out, in order
  uint64_t next_id_ = 0;
  uint64_t next_lease_ = 1;
  int64_t reissued_ = 0;
  std::vector<EvalSetResult> finished_;
};

}  // namespace echelon::learn
