// The "prompts" task: the user's own prompt dataset with a verifiable reward, in the JSONL
// layout verl, OpenRLHF and AReaL users already have, one row per line:
//   {"data_source": "gsm8k",
//    "prompt": [{"role": "user", "content": "Natalia sold 48 clips ..."}],   (or a plain string)
//    "reward_model": {"style": "rule", "ground_truth": "72"},               (or "answer": "72")
//    "extra_info": {...}}                                                    (any JSON; kept)
// A chat prompt is one user message; with `rollout.chat: true` it is rendered through the
// model's chat template, as verl renders it. Every malformed row is refused at load with
// FILE:LINE and the field. Parquet files in the same layout (data/parquet.h) are read row by
// row as the same JSON; a bad row is named FILE: row N.
//
// Options: PromptsOptionTable() (name, default, help; unknown names are an error).
// Only the learner runs the Python function and calls the service: an actor's adapter has no
// `*_file` / `*_url` options and scores those terms 0, and the learner re-scores every group
// it accepts (ActorsCanScore).
//
//   auto task = CreatePromptsAdapter({{"train_file", "gsm8k.jsonl"}, {"reward", "math"}});
//
// Thread contract: immutable after creation; all methods may run concurrently.
#pragma once

#include <memory>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::data {

Result<std::unique_ptr<TaskAdapter>> CreatePromptsAdapter(const AdapterOptions& options);
const OptionTable& PromptsOptionTable();

// One dataset row: the prompt (text: the user message or string; reference: the ground truth)
// and the row's JSON line as written.
struct PromptRow {
  Prompt prompt;
  std::string line;
};

// Reads a prompts JSONL file (blank lines skipped; each prompt's id is its 1-based line).
// A .parquet file (or one starting with PAR1) is read with ReadParquetRows, a null column
// counting as an absent key. Errors: "FILE:LINE: field \"F\": what was expected" (Parquet:
// "FILE: row N: ..."); an empty file is one.
Result<std::vector<PromptRow>> ReadPromptRows(const std::string& path);

}  // namespace echelon::data
