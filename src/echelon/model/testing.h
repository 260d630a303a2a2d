// Helpers shared by unit tests (never by the library): a tiny decoder config with the
// character tokenizer's special ids.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>

#include "echelon/model/model_config.h"
#include "echelon/model/qwen3.h"
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

// `c` as a Qwen3-MoE: four experts of width `expert_width`, top-2 renormalised, every layer
// sparse but `dense_layer`.
inline ModelConfig AsTinyMoe(ModelConfig c, int64_t expert_width, int64_t dense_layer) {
  c.model_type = "qwen3_moe";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = expert_width;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {dense_layer};
  return c;
}

// A 4-layer model whose next-token distributions are peaked (a large tied embedding), so rows
// end by EOS at different steps; with `moe`, layers 1-3 are Qwen3-MoE layers.
inline ModelConfig FourLayerConfig(bool moe = false) {
  ModelConfig c = TinyTestConfig(/*vocab=*/48, /*hidden=*/32, /*tied=*/true);
  c.num_hidden_layers = 4;
  return moe ? AsTinyMoe(c, 16, 0) : c;
}

inline Qwen3Model PeakedModel(const ModelConfig& c) {
  Qwen3Model m(c);
  m->InitWeights(11);
  at::NoGradGuard no_grad;
  m->StateDict().at("model.embed_tokens.weight").mul_(60.0);
  return m;
}

// The pipeline stage of `whole` holding layers `range`, with whole's weights.
inline Qwen3Model StageOf(const Qwen3Model& whole, LayerRange range) {
  Qwen3Model s(whole->config(), range);
  const Status st = s->LoadStateDict(s->Own(whole->StateDict()), "stage");
  if (!st.ok()) throw std::runtime_error(st.message());
  return s;
}

}  // namespace echelon::model
