// What the submit fuzz target tells its replay (tests/tools/fuzz_replay.cc).
#pragma once

#include <cstdint>
#include <string>

// Submissions the harness's learner accepted so far.
int64_t SubmitFuzzAccepted();
// A submission that harness's learner accepts (group 0, lease 1, actor "fuzz#1").
std::string SubmitFuzzValidSeed();
