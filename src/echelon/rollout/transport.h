// The transport contract lives in contract/transport.h. These names remain only for code not
// yet moved to it (net/learner_server.*); new code uses contract:: directly.
#pragma once

#include "echelon/contract/transport.h"

namespace echelon::rollout {

using contract::Assignment;
using contract::EpisodeHost;
using contract::GroupRollout;
using contract::PlayStep;
using contract::Snapshot;
using contract::SnapshotSource;
using contract::SubmitOutcome;
using contract::TrajectorySink;
using contract::WorkSource;

}  // namespace echelon::rollout
