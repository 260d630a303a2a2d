// A checkpoint is a directory: `config.json` (HF fields), `model.safetensors`, `tokenizer.json`.
// It is written whole or not at all: files go to "<dir>.tmp-<pid>", then the directory is
// renamed into place (an older one at the same path is replaced).
//
//   ECHELON_RETURN_IF_ERROR(SaveCheckpoint(dir, model, tokenizer));
//   ECHELON_ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(dir));
//
// Thread contract: free functions; the model must not be written by another thread meanwhile.
#pragma once

#include <string>

#include "echelon/common/status.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/tokenizer.h"

namespace echelon::model {

struct LoadedCheckpoint {
  ModelConfig config;
  CharTokenizer tokenizer;
  Qwen3Model model{nullptr};
};

Status SaveCheckpoint(const std::string& dir, const Qwen3Model& model, const CharTokenizer& tokenizer);
// Errors name the directory and file: missing files, bad JSON, safetensors problems, missing
// or mismatched tensors, a tokenizer whose vocabulary disagrees with config.json.
Result<LoadedCheckpoint> LoadCheckpoint(const std::string& dir);

}  // namespace echelon::model
