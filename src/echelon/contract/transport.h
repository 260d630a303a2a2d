// The contract between the two planes: what an actor needs from the learning plane, as three
// small interfaces (and a fourth, EpisodeHost, for multi-turn work the learner plays itself),
// and the values that cross between them. The learner implements them
// (learn/trajectory_intake.h, learn/hosted_episodes.h), the actor loop uses them
// (rollout/actor.h), and the gRPC transport carries them over the wire on both sides
// (net/learner_server.h, net/remote_learner.h), so the actor loop does not change with the
// transport and neither plane includes the other.
//
// Thread contract: implementations must be safe for concurrent calls from many actors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "echelon/data/adapter.h"
#include "echelon/sched/work_item.h"

namespace echelon::contract {

// A prompt group to generate, under a lease.
struct Assignment {
  sched::WorkItem work;
  data::Prompt prompt;
  int group_size = 1;
  // The seed of the group's sampling (contract::GroupSeed of the run's secret): the actor draws
  // every token with it, and the learner checks the draws against it.
  uint64_t seed = 0;
  // The learner scores the group itself (a single-turn task): the prompt comes without its
  // reference and the actor only samples (data::SampleSingleTurnGroup), its rewards left 0.
  bool scored_by_learner = false;
  // The learner plays this multi-turn group's environment (EpisodeHost): the prompt stays
  // there (a poker deal, an environment's seed), and the actor only samples each turn.
  bool played_by_learner = false;
  // A resumed group (its last holder's lease ended midway): each sample's tokens so far, as
  // the learner kept them from that holder's PrefixReports (tokens, logprobs, versions: one
  // per token), verified. The actor continues every sample from there (same seed, the samples'
  // positions go on) and submits the whole group, which must begin with exactly these. Empty:
  // from the start.
  std::vector<data::Turn> prefix;
  // The learner keeps this group's prefixes: the actor reports its samples' new tokens as they
  // grow (WorkSource::ReportPrefix), if its backend can report them.
  bool report_prefix = false;
  // An evaluation group (learn/eval_rounds.h; -1: a training group): sampled with exactly this
  // version's snapshot (SnapshotSource::Pinned when the actor holds another) at
  // `eval_temperature`, scored by the learner, never trained on. Always scored_by_learner.
  int64_t eval_version = -1;
  double eval_temperature = 1.0;
};

// What an actor says of itself when it asks for work.
struct WorkRequest {
  // Its backend continues a group from its samples' prefixes (Assignment::prefix).
  bool continues_prefixes = false;
  // The snapshot it holds (-1: none, or not said): deadline-aware dispatch then knows how far
  // behind the learner it samples instead of estimating it. A lie costs the worker its own work
  // (groups it returns too late, or none handed to it).
  int64_t snapshot_version = -1;
  // Its backend samples evaluation groups (Assignment::eval_version: a pinned snapshot, another
  // temperature); only such an actor is handed one.
  bool evaluates = false;
};

// A piece of one sample of a running group, from completion position `from` on: what the
// holder generated since its last report the learner kept (resumable groups). `versions`
// holds one per token.
struct PrefixPart {
  int64_t sample = 0;
  int64_t from = 0;
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
};

// What an actor hands back for one group.
struct GroupRollout {
  uint64_t group_id = 0;
  uint64_t lease_id = 0;
  // The oldest policy version that generated it: every token's when its turns carry no
  // versions (data::Turn::versions), else the smallest of them.
  int64_t behavior_version = 0;
  std::string actor;
  data::Prompt prompt;
  std::vector<data::Episode> episodes;
  double generate_seconds = 0;
};

// A policy version's weights: the safetensors bytes of the whole model or, in a LoRA run
// (model/model_config.h LoraConfig), of the adapter tensors alone, then with `base`: the whole
// model they adapt (the same bytes for every version of the run; its SHA-256 is the adapter
// file's metadata "echelon.lora_base", model/snapshot_weights.h).
struct Snapshot {
  int64_t version = -1;
  std::shared_ptr<const std::string> weights;
  std::shared_ptr<const std::string> base;  // null: weights are whole
};

class WorkSource {
 public:
  virtual ~WorkSource() = default;
  // Work to do, or nullopt when the staleness gate allows none right now.
  virtual std::optional<Assignment> Acquire(const std::string& actor) = 0;
  // The holder of `work`'s lease has generated `tokens` for the group so far (sent while it
  // runs, every sched::kProgressSeconds): a lease whose holder keeps making progress is renewed
  // past its lease time (sched::Dispatcher::Renew), so a long group on a slow worker is not
  // re-issued midway. Best effort: a transport may deliver it late or not at all.
  virtual void Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) {
    (void)actor;
    (void)work;
    (void)tokens;
  }
  // Acquire, with what the actor says of itself: only an actor that continues prefixes is
  // handed a resumed group (Acquire never hands one).
  virtual std::optional<Assignment> AcquireWith(const std::string& actor, const WorkRequest& request) {
    (void)request;
    return Acquire(actor);
  }
  // The holder of `work`'s lease gives it up (it is stopping): the group is handed out again at
  // once, from what its prefix reports kept, instead of when the lease would have ended.
  virtual void Release(const std::string& actor, const sched::WorkItem& work) {
    (void)actor;
    (void)work;
  }
  // The holder of `work`'s lease reports its samples' new tokens (sent while it runs, every
  // sched::kPrefixSeconds), so that a lease that ends midway is continued from there by the next
  // holder instead of from the start. Returns whether the learner kept the report: all of it,
  // or none when a part does not continue what was kept (`from` is not its length) or fails a
  // check. An actor resends from the positions of its last kept report.
  virtual bool ReportPrefix(const std::string& actor, const sched::WorkItem& work,
                            const std::vector<PrefixPart>& parts) {
    (void)actor;
    (void)work;
    (void)parts;
    return false;
  }
};

// The learner's answer to a submission: accepted, or refused with a reason that the learner
// counts under that name ("not_lease_holder", "token_out_of_vocab", ...).
// `forged`: the refusal is one an honest actor can never earn (a malformed group, a foreign
// lease, a prompt or an episode that is not the task's); late or repeated submissions are not.
struct SubmitOutcome {
  bool accepted = false;
  std::string reason;
  bool forged = false;
};

class TrajectorySink {
 public:
  virtual ~TrajectorySink() = default;
  virtual SubmitOutcome Submit(GroupRollout rollout) = 0;
};

// One step of a group the learner plays: the prompts to sample now (one completion each, with
// `seed`), or, once the episodes are over, how the learner took the group.
struct PlayStep {
  std::vector<data::PolicyPrompt> prompts;
  uint64_t seed = 0;
  std::optional<SubmitOutcome> outcome;  // set when finished
};

// The learner's side of a played group: it runs the task's environment and asks the actor for
// each turn's completions.
class EpisodeHost {
 public:
  virtual ~EpisodeHost() = default;
  // Hands in `turns`, the completions of the previous step's prompts in order (none on the
  // first call), sampled by `behavior_version`; the next step, or an error (the group is not
  // this actor's to play, the turns do not answer the prompts, the learner went away).
  virtual Result<PlayStep> Play(const std::string& actor, const sched::WorkItem& work, int64_t behavior_version,
                                std::vector<data::Turn> turns, double generate_seconds) = 0;
};

class SnapshotSource {
 public:
  virtual ~SnapshotSource() = default;
  // The newest published snapshot (version -1 when none yet).
  virtual Snapshot Latest() = 0;
  // The newest version known to be published, without fetching it (Latest may wait for the
  // bytes): what a generation that runs on asks between tokens (rollout.partial).
  virtual int64_t NewestVersion() { return Latest().version; }
  // The snapshot of exactly `version`, while the learner keeps it for an evaluation round
  // (Assignment::eval_version); version -1 when it is not kept.
  virtual Snapshot Pinned(int64_t version) {
    Snapshot s = Latest();
    return s.version == version ? s : Snapshot{};
  }
};

}  // namespace echelon::contract
