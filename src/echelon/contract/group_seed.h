// GroupSeed: the seed of a group's sampling, drawn from the run's secret (common/run_secret.h)
// by the learner and sent with the group's assignment (contract::Assignment::seed). A function of
// the secret and the group (not of timing), so a run with one actor and S = 0 is reproducible
// under `secret: seed`, a group the learner plays for an actor (learn/hosted_episodes.h) samples
// as the actor would have played it itself (rollout/actor.h), and the learner can recompute each
// token's draw (learn/behaviour_verifier.h). A worker learns its own groups' seeds, never the
// secret, so it cannot know another group's draws before that group is handed to it.
//
// Thread contract: a pure function.
#pragma once

#include <cstdint>

#include "echelon/common/run_secret.h"

namespace echelon::contract {

inline uint64_t GroupSeed(const RunSecret& secret, uint64_t group_id) { return secret.Draw("group seed", group_id); }

}  // namespace echelon::contract
