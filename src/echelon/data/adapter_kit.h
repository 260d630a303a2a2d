// Building blocks the task adapters share: a single-turn group, a hash that is the same on
// every host, and the JSONL line loop with file:line errors.
//
//   ECHELON_RETURN_IF_ERROR(ForEachJsonlLine(path, text, [&](uint64_t line_no, const std::string& line) { ... }));
//
// Thread contract: free functions without shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::data {

// Samples `group_size` completions of the prompt in one policy call and rewards each with
// task.RewardGroup (success: reward >= 1). A policy that returns fewer turns gives a short group.
Result<std::vector<Episode>> RunSingleTurnGroup(const TaskAdapter& task, const Prompt& prompt, int group_size,
                                                Policy& policy, uint64_t seed);
// The sampling half alone, rewards left 0: what an actor does when the learner scores the
// group (contract::Assignment::scored_by_learner, the reference withheld).
Result<std::vector<Episode>> SampleSingleTurnGroup(const Prompt& prompt, int group_size, Policy& policy, uint64_t seed);

// A fixed mixing function rather than <random> distributions, whose outputs differ between
// standard libraries: prompts, splits and orders must be the same on every host and after a
// restart.
uint64_t StableHash(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

// Calls fn(line_no, line) for every non-blank line of `text` (1-based numbers; a trailing '\r'
// dropped); an error from fn comes back prefixed with "path:line_no".
Status ForEachJsonlLine(const std::string& path, const std::string& text,
                        const std::function<Status(uint64_t, const std::string&)>& fn);

}  // namespace echelon::data
