// The "math" task: two-operand integer addition and subtraction ("37+48=" -> "85",
// "12-23=" -> "-11"), rewarded 1 for the right answer and 0 otherwise. Small enough for a
// character model on a CPU to learn in minutes, and exactly verifiable.
//
// Options (strings; unknown names are an error):
//   seed         "0"   problem generation and the JSONL shuffle order
//   answer       "exact"  the completion must be the answer exactly; "last_number": the last
//                      integer in it must equal the answer (for models that answer in prose)
//   max_operand  "99"  operands are drawn from 0..max_operand (generated problems)
//   eval_size    "500" held-out problems drawn with the seed (generated held-out set only)
//   train_file   ""    JSONL training problems, cycled in a seeded shuffled order; needs
//                      eval_file, so that the held-out set comes from the same source
//   eval_file    ""    JSONL held-out problems (all lines); excludes eval_size
// Generated training prompts never repeat a held-out problem; training lines that repeat an
// eval_file problem are an error.
//
//   auto task = CreateMathAdapter({{"seed", "7"}, {"max_operand", "99"}});
//
// Thread contract: immutable after creation; all methods may run concurrently.
#pragma once

#include <memory>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::data {

// Every character math prompts and answers use.
inline constexpr char kMathAlphabet[] = "0123456789+-=";

Result<std::unique_ptr<TaskAdapter>> CreateMathAdapter(const AdapterOptions& options);
// Its options: name, default, help.
const OptionTable& MathOptionTable();

}  // namespace echelon::data
