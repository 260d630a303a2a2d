// A causal language model loaded from a directory, in either layout:
//   Hugging Face: config.json (Qwen3ForCausalLM, Qwen2ForCausalLM or LlamaForCausalLM),
//     model.safetensors or shards listed in model.safetensors.index.json (F32/BF16/F16,
//     converted to F32), tokenizer.json (+ tokenizer_config.json with the chat template),
//     generation_config.json (stop ids, sampling defaults); only config.json and the weights
//     are required (without tokenizer.json the model has no codec: ids in, logits out);
//   echelon checkpoint (model/checkpoint.h): config.json, model.safetensors and a character
//     tokenizer.json.
// SaveModelDir writes the Hugging Face layout, so the output loads in `transformers`, vLLM or
// SGLang unchanged (tokenizer files are copied from the source directory).
//
//   ECHELON_ASSIGN_OR_RETURN(TextModel m, LoadModelDir("models/qwen3-0.6b"));
//   ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> ids, m.vocab->Encode("Hello"));
//
// Thread contract: loading and saving are free functions; a TextModel's vocabulary is immutable and
// safe for concurrent use; its model must be used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"

namespace echelon::model {

struct TextModel {
  std::string dir;
  std::string format;       // "huggingface" or "echelon"
  std::string architecture;  // "Qwen3ForCausalLM", "Qwen2ForCausalLM" or "LlamaForCausalLM"
  ModelConfig config;
  Qwen3Model model{nullptr};
  std::optional<Vocabulary> vocab;  // empty when the directory has no tokenizer.json
  std::vector<int64_t> stop_ids;    // generation ends at any of these (eos ids)
  // generation_config.json's sampling defaults (what vLLM applies to a request that sets none);
  // absent keys leave sampling unchanged.
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  std::string chat_template;      // Vocabulary::chat_template(); empty when none
};

// Errors name the directory and the file (and the tensor, for weights that are missing,
// mis-shaped, truncated or of an unsupported dtype). `mapped`: the weights are views of the
// files mapped (model/safetensors.h MapSafetensors), in the storage dtype, for a reader that
// only cuts them (never writes them) and releases each part when done.
Result<TextModel> LoadModelDir(const std::string& dir, bool mapped = false);

// Writes `model` in the Hugging Face layout: config.json (with "architectures" and
// "torch_dtype"), model.safetensors, generation_config.json, and the tokenizer files of
// `tokenizer_source_dir` (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// vocab.json, merges.txt, whichever exist). Whole or not at all, like SaveCheckpoint.
Status SaveModelDir(const std::string& dir, const Qwen3Model& model, const std::string& architecture,
                    const std::vector<int64_t>& stop_ids, const std::string& tokenizer_source_dir);

}  // namespace echelon::model
