// ModelConfig: the decoder's shape, read from and written to a Hugging Face `config.json`
// with the same field names. Three dense families share the decoder and differ only in
// these switches (as in transformers):
//   qwen3 (Qwen3ForCausalLM): per-head RMSNorm of q and k; q/k/v/o biased iff attention_bias;
//     a missing head_dim means 128.
//   qwen2 (Qwen2ForCausalLM): q/k/v always biased, o never; head_dim = hidden/heads.
//   llama (LlamaForCausalLM): q/k/v/o biased iff attention_bias, MLP iff mlp_bias;
//     head_dim = hidden/heads when missing.
// One mixture-of-experts family shares it too:
//   qwen3_moe (Qwen3MoeForCausalLM): qwen3 whose MLP, in the sparse layers (is_sparse), is a
//     router (mlp.gate) over num_experts SwiGLU experts of moe_intermediate_size, each token
//     taking the top num_experts_per_tok; the other layers keep the dense MLP of
//     intermediate_size.
//
//   ECHELON_ASSIGN_OR_RETURN(ModelConfig cfg, ModelConfig::FromJsonText(text, "ckpt/config.json"));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::model {

// Low-rank adapters (LoRA) on the decoder's projections: each targeted weight W [out, in] gains
// A [rank, in] and B [out, rank], and the projection computes x W^T + (alpha / rank) x A^T B^T.
// Training moves A and B only; B starts at zero, so the adapted model starts as its base.
// Tensors are named as PEFT's modules ("model.layers.0.self_attn.q_proj.lora_A.weight").
// In config.json as "echelon_lora": {"rank", "alpha", "targets"}; absent when rank is 0.
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  // Of kLoraTargets; an MLP target adapts the dense layers (a sparse layer's experts take none).
  std::vector<std::string> targets;

  bool on() const { return rank > 0; }
  double scale() const { return alpha / static_cast<double>(rank); }
  bool operator==(const LoraConfig& o) const { return rank == o.rank && alpha == o.alpha && targets == o.targets; }
};
// The projections adapters can target, in the order a layer runs them.
inline const std::vector<std::string> kLoraTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};
// Whether `name` is an adapter tensor's ("....lora_A.weight" or "....lora_B.weight").
bool IsLoraTensor(const std::string& name);
// "q_proj,v_proj" (commas, spaces ignored) as targets; fails naming an unknown one.
Result<std::vector<std::string>> ParseLoraTargets(const std::string& text);

struct ModelConfig {
  std::string model_type = "qwen3";  // qwen3, qwen2, llama or qwen3_moe
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
  bool attention_bias = false;
  bool mlp_bias = false;
  // The weights' storage dtype ("float32", "bfloat16" or "float16"; config.json torch_dtype):
  // checkpoints and snapshots are written in it, whatever the learner computes in.
  std::string torch_dtype = "float32";
  // qwen3_moe only (missing fields take Qwen3MoeConfig's defaults).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;      // renormalise the top-k router weights to sum to 1
  int64_t decoder_sparse_step = 1;  // layer i is sparse iff (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and i is not listed here
  double router_aux_loss_coef = 0.001;   // carried through config.json; the run's own is rl.router_aux_coef
  LoraConfig lora;  // echelon's own: adapters on the projections (rank 0: none)

  bool qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }
  bool moe() const { return model_type == "qwen3_moe"; }
  // Whether layer i's MLP is the mixture of experts.
  bool is_sparse(int64_t layer) const;
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_bias() const { return model_type != "qwen2" && attention_bias; }
  bool mlp_biased() const { return model_type == "llama" && mlp_bias; }
  // "Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM" or "Qwen3MoeForCausalLM".
  std::string architecture() const;

  // Checks every field is in range and the shapes agree (heads divisible by kv heads...).
  Status Validate() const;
  // `where` names the source in error messages (a file path).
  static Result<ModelConfig> FromJson(const nlohmann::json& j, const std::string& where);
  static Result<ModelConfig> FromJsonText(const std::string& text, const std::string& where);
  nlohmann::json ToJson() const;
  int64_t NumParameters() const;
  // Parameters one token computes with: NumParameters less the experts it is not routed to.
  int64_t NumActiveParameters() const;
  // Parameters of decoder layer `layer` (every expert), and of the rest: embedding, final norm
  // and lm_head when untied. NumParameters is their sum.
  int64_t LayerParameters(int64_t layer) const;
  int64_t OuterParameters() const;
};

}  // namespace echelon::model
