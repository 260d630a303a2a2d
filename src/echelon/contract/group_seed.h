// GroupSeed: the seed of a group's sampling. A function of the run seed and the group (not of
// timing), so a run with one actor and S = 0 is reproducible, and a group the learner plays
// for an actor (learn/hosted_episodes.h) samples as the actor would have played it itself
// (rollout/actor.h).
//
// Thread contract: a pure function.
#pragma once

#include <cstdint>

namespace echelon::contract {

inline uint64_t GroupSeed(uint64_t run_seed, uint64_t group_id) {
  // splitmix64 of the pair: well-spread seeds for adjacent group ids.
  uint64_t z = run_seed * 0x9E3779B97F4A7C15ULL + group_id + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace echelon::contract
