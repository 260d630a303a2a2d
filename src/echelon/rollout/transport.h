// What an actor needs from the learning plane, as three small interfaces. In one process
// they are implemented by LocalHub (cli/runtime.h); a network transport implements the same
// interfaces over RPC, and the actor loop does not change.
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

namespace echelon::rollout {

// A prompt group to generate, under a lease.
struct Assignment {
  sched::WorkItem work;
  data::Prompt prompt;
  int group_size = 1;
  // The learner scores the group itself (a single-turn task): the prompt comes without its
  // reference and the actor only samples (data::SampleSingleTurnGroup), its rewards left 0.
  bool scored_by_learner = false;
};

// What an actor hands back for one group.
struct GroupRollout {
  uint64_t group_id = 0;
  uint64_t lease_id = 0;
  int64_t behavior_version = 0;  // the (oldest) policy version that generated it
  std::string actor;
  data::Prompt prompt;
  std::vector<data::Episode> episodes;
  double generate_seconds = 0;
};

// A published policy: version + safetensors bytes of its weights.
struct Snapshot {
  int64_t version = -1;
  std::shared_ptr<const std::string> weights;
};

class WorkSource {
 public:
  virtual ~WorkSource() = default;
  // Work to do, or nullopt when the staleness gate allows none right now.
  virtual std::optional<Assignment> Acquire(const std::string& actor) = 0;
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

class SnapshotSource {
 public:
  virtual ~SnapshotSource() = default;
  // The newest published snapshot (version -1 when none yet).
  virtual Snapshot Latest() = 0;
};

}  // namespace echelon::rollout
