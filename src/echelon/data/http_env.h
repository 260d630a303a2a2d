// Multi-turn environments over HTTP (`task.name: http-env`): an environment written in any
// language (examples/guess_env.py: Python's standard library) serves three JSON endpoints and
// echelon plays episodes against it.
//
//   POST SERVER/reset  {"seed": 17}                         -> {"session": "s1", "observation": "..."}
//   POST SERVER/step   {"session": "s1", "action": "..."}   -> {"observation": "...", "reward": 0.5,
//                                                                "done": false, "metrics": {"k": 1}}
//   POST SERVER/close  {"session": "s1"}   an episode cut at max_turns (the answer is ignored)
//
// Each observation is the whole prompt of the next turn (the environment decides how much
// history it shows); the policy's completion is the action. An episode's reward is the sum of
// its steps' rewards; the `metrics` numbers of its last step become the episode's metrics. The
// environment must be deterministic in (seed, actions): the learner replays every accepted
// episode (reset with its seed, step with the same actions) and trains on the replayed rewards,
// so an actor cannot claim a reward the environment did not give (`replay: false` trusts the
// actors instead, for environments too costly to run twice).
//
// Seeds: group g trains on seed `seed + g` (all G episodes of a group start from the same
// state, as GRPO's G samples share one prompt); held-out episode i uses seed 2^50 + seed + i,
// or the seeds of `eval_file` (JSONL lines {"seed": N}, as ExportHeldOut writes them).
// Seeds stay below 2^53, so every JSON reader holds them exactly.
//
//   task: {name: http-env, server: "http://127.0.0.1:8765", max_turns: 4}
//
// Thread contract: immutable after creation; every method may run on several threads at once.
#pragma once

#include <memory>

#include "echelon/data/adapter.h"

namespace echelon::data {

// Options: HttpEnvOptionTable() (name, default, help; unknown names are an error).
Result<std::unique_ptr<TaskAdapter>> CreateHttpEnvAdapter(const AdapterOptions& options);
const OptionTable& HttpEnvOptionTable();

}  // namespace echelon::data
