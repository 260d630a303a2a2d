// Helpers shared by unit tests (never by the library): a tiny decoder config with the
// character tokenizer's special ids.
#pragma once

#include <cstdint>

#include "echelon/model/model_config.h"
#include "echelon/model/tokenizer.h"

namespace echelon::model {

inline ModelConfig TinyTestConfig(int64_t vocab, int64_t hidden, bool tied = false) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = 2 * hidden;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = hidden / 4;
  c.max_position_embeddings = 64;
  c.bos_token_id = CharTokenizer::kBos;
  c.eos_token_id = CharTokenizer::kEos;
  c.pad_token_id = CharTokenizer::kPad;
  c.tie_word_embeddings = tied;
  return c;
}

}  // namespace echelon::model
