// ModelConfig: the decoder's shape, read from and written to a Hugging Face `config.json`
// with the same field names (Qwen3ForCausalLM layout).
//
//   ECHELON_ASSIGN_OR_RETURN(ModelConfig cfg, ModelConfig::FromJsonText(text, "ckpt/config.json"));
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::model {

struct ModelConfig {
  std::string model_type = "qwen3";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // HF qwen3: a missing head_dim means 128
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000.0;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 4096;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;

  // Checks every field is in range and the shapes agree (heads divisible by kv heads...).
  Status Validate() const;
  // `where` names the source in error messages (a file path).
  static Result<ModelConfig> FromJson(const nlohmann::json& j, const std::string& where);
  static Result<ModelConfig> FromJsonText(const std::string& text, const std::string& where);
  nlohmann::json ToJson() const;
  int64_t NumParameters() const;
};

}  // namespace echelon::model
