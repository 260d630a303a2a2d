#include "echelon/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace echelon::model {
namespace {

using nlohmann::json;

Status FieldError(const std::string& where, const std::string& field, const std::string& what) {
  return InvalidArgument(where + ": field \"" + field + "\" " + what);
}

Status GetInt(const json& j, const std::string& where, const char* field, bool required, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    return required ? FieldError(where, field, "is missing (required)") : Status::Ok();
  }
  if (!it->is_number_integer()) return FieldError(where, field, "must be an integer, got " + it->dump());
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status GetDouble(const json& j, const std::string& where, const char* field, double* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return FieldError(where, field, "must be a number, got " + it->dump());
  *out = it->get<double>();
  return Status::Ok();
}

Status GetBool(const json& j, const std::string& where, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return FieldError(where, field, "must be true or false, got " + it->dump());
  *out = it->get<bool>();
  return Status::Ok();
}

// Special token ids may be null, an integer, or (in some HF configs) a list of which we keep
// the first.
Status GetTokenId(const json& j, const std::string& where, const char* field, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  const json& v = (it->is_array() && !it->empty()) ? it->front() : *it;
  if (!v.is_number_integer()) return FieldError(where, field, "must be an integer or null, got " + it->dump());
  *out = v.get<int64_t>();
  return Status::Ok();
}

// Features of HF configs this decoder does not implement: refuse rather than compute
// something different from the reference.
Status RejectUnsupported(const json& j, const std::string& where) {
  auto is_true = [&](const char* f) { return j.contains(f) && j[f].is_boolean() && j[f].get<bool>(); };
  if (is_true("use_sliding_window"))
    return FieldError(where, "use_sliding_window", "is true; sliding-window attention is not supported");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    const json type = rs.is_object() ? rs.value("rope_type", rs.value("type", json("default"))) : json();
    if (type != "default")
      return FieldError(where, "rope_scaling", "is " + rs.dump() + "; only default RoPE is supported");
  }
  if (j.contains("partial_rotary_factor") && j["partial_rotary_factor"] != 1.0)
    return FieldError(where, "partial_rotary_factor", "is not 1; only full rotary embedding is supported");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu" && j["hidden_act"] != "swish") {
    return FieldError(where, "hidden_act", "is " + j["hidden_act"].dump() + "; only \"silu\" is supported");
  }
  return Status::Ok();
}

}  // namespace

bool IsLoraTensor(const std::string& name) {
  static const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";
  const auto ends = [&](const std::string& suffix) {
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(kA) || ends(kB);
}

Result<std::vector<std::string>> ParseLoraTargets(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ',') {
      if (text[i] != ' ') item += text[i];
      continue;
    }
    if (item.empty()) continue;
    if (std::find(kLoraTargets.begin(), kLoraTargets.end(), item) == kLoraTargets.end())
      return InvalidArgument("unknown LoRA target \"" + item +
                             "\" (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    item.clear();
  }
  if (out.empty()) return InvalidArgument("no LoRA target named (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  return out;
}

Status ModelConfig::Validate() const {
  auto positive = [](int64_t v, const char* name) {
    return v > 0 ? Status::Ok() : InvalidArgument(std::string(name) + " must be > 0, got " + std::to_string(v));
  };
  ECHELON_RETURN_IF_ERROR(positive(vocab_size, "vocab_size"));
  ECHELON_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  ECHELON_RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  ECHELON_RETURN_IF_ERROR(positive(num_hidden_layers, "num_hidden_layers"));
  ECHELON_RETURN_IF_ERROR(positive(num_attention_heads, "num_attention_heads"));
  ECHELON_RETURN_IF_ERROR(positive(num_key_value_heads, "num_key_value_heads"));
  ECHELON_RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  ECHELON_RETURN_IF_ERROR(positive(max_position_embeddings, "max_position_embeddings"));
  if (model_type != "qwen3" && model_type != "qwen2" && model_type != "llama" && model_type != "qwen3_moe")
    return InvalidArgument("model_type must be \"qwen3\", \"qwen2\", \"llama\" or \"qwen3_moe\", got \"" + model_type +
                           "\"");
  if (moe()) {
    ECHELON_RETURN_IF_ERROR(positive(num_experts, "num_experts"));
    ECHELON_RETURN_IF_ERROR(positive(moe_intermediate_size, "moe_intermediate_size"));
    ECHELON_RETURN_IF_ERROR(positive(decoder_sparse_step, "decoder_sparse_step"));
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
      return InvalidArgument("num_experts_per_tok must be in [1, num_experts = " + std::to_string(num_experts) +
                             "], got " + std::to_string(num_experts_per_tok));
    for (int64_t layer : mlp_only_layers) {
      if (layer < 0 || layer >= num_hidden_layers)
        return InvalidArgument("mlp_only_layers holds " + std::to_string(layer) + ", not a layer of " +
                               std::to_string(num_hidden_layers));
    }
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return InvalidArgument("num_attention_heads (" + std::to_string(num_attention_heads) +
                           ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  }
  if (head_dim % 2 != 0)
    return InvalidArgument("head_dim must be even for rotary embedding, got " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0)) return InvalidArgument("rms_norm_eps must be > 0");
  if (!(rope_theta > 0)) return InvalidArgument("rope_theta must be > 0");
  if (lora.on()) {
    if (lora.rank > 65536) return InvalidArgument("echelon_lora.rank must be at most 65536, got " + std::to_string(lora.rank));
    if (!(lora.alpha > 0) || !std::isfinite(lora.alpha)) return InvalidArgument("echelon_lora.alpha must be > 0");
    if (lora.targets.empty()) return InvalidArgument("echelon_lora.targets must name at least one projection");
    bool dense = false;
    for (int64_t i = 0; i < num_hidden_layers; ++i) dense = dense || !is_sparse(i);
    for (const std::string& t : lora.targets) {
      if (std::find(kLoraTargets.begin(), kLoraTargets.end(), t) == kLoraTargets.end())
        return InvalidArgument("echelon_lora.targets holds \"" + t + "\", not a projection");
      if (!dense && (t == "gate_proj" || t == "up_proj" || t == "down_proj"))
        return InvalidArgument("echelon_lora.targets holds " + t +
                               ", but every layer of this model is sparse and its experts take no adapter");
    }
  } else if (lora.rank < 0) {
    return InvalidArgument("echelon_lora.rank must be >= 0, got " + std::to_string(lora.rank));
  }
  return Status::Ok();
}

Result<ModelConfig> ModelConfig::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": expected a JSON object");
  ModelConfig c;
  // Defaults of HF's Qwen3Config for fields a config.json may omit.
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 32768;
  if (j.contains("model_type")) {
    if (!j["model_type"].is_string()) return FieldError(where, "model_type", "must be a string");
    c.model_type = j["model_type"].get<std::string>();
  } else if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
             j["architectures"][0].is_string()) {
    const std::string arch = j["architectures"][0].get<std::string>();
    c.model_type = arch == "Qwen2ForCausalLM"      ? "qwen2"
                   : arch == "LlamaForCausalLM"    ? "llama"
                   : arch == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                                                   : "qwen3";
  }
  if (c.model_type != "qwen3" && c.model_type != "qwen2" && c.model_type != "llama" && c.model_type != "qwen3_moe")
    return FieldError(where, "model_type", "is \"" + c.model_type + "\"; supported: qwen3, qwen2, llama, qwen3_moe");
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "vocab_size", true, &c.vocab_size));
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "hidden_size", true, &c.hidden_size));
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "intermediate_size", true, &c.intermediate_size));
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "num_hidden_layers", true, &c.num_hidden_layers));
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "num_attention_heads", true, &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;  // HF: absent means multi-head attention
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "num_key_value_heads", false, &c.num_key_value_heads));
  // HF Qwen3Config's default is 128, not hidden/heads; Qwen2 and Llama derive it.
  c.head_dim = c.qk_norm() ? 128 : c.hidden_size / c.num_attention_heads;
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "head_dim", false, &c.head_dim));
  ECHELON_RETURN_IF_ERROR(GetBool(j, where, "attention_bias", &c.attention_bias));
  ECHELON_RETURN_IF_ERROR(GetBool(j, where, "mlp_bias", &c.mlp_bias));
  ECHELON_RETURN_IF_ERROR(GetDouble(j, where, "rms_norm_eps", &c.rms_norm_eps));
  ECHELON_RETURN_IF_ERROR(GetDouble(j, where, "rope_theta", &c.rope_theta));
  ECHELON_RETURN_IF_ERROR(GetBool(j, where, "tie_word_embeddings", &c.tie_word_embeddings));
  ECHELON_RETURN_IF_ERROR(GetInt(j, where, "max_position_embeddings", false, &c.max_position_embeddings));
  ECHELON_RETURN_IF_ERROR(GetTokenId(j, where, "bos_token_id", &c.bos_token_id));
  ECHELON_RETURN_IF_ERROR(GetTokenId(j, where, "eos_token_id", &c.eos_token_id));
  ECHELON_RETURN_IF_ERROR(GetTokenId(j, where, "pad_token_id", &c.pad_token_id));
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_string()) return FieldError(where, key, "must be a string");
    c.torch_dtype = j[key].get<std::string>();
    if (c.torch_dtype == "auto") c.torch_dtype = "float32";
    if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16")
      return FieldError(where, key, "is \"" + c.torch_dtype + "\"; supported: float32, bfloat16, float16");
    break;
  }
  if (c.moe()) {  // Qwen3MoeConfig's defaults
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    ECHELON_RETURN_IF_ERROR(GetInt(j, where, "num_experts", false, &c.num_experts));
    ECHELON_RETURN_IF_ERROR(GetInt(j, where, "num_experts_per_tok", false, &c.num_experts_per_tok));
    ECHELON_RETURN_IF_ERROR(GetInt(j, where, "moe_intermediate_size", false, &c.moe_intermediate_size));
    ECHELON_RETURN_IF_ERROR(GetBool(j, where, "norm_topk_prob", &c.norm_topk_prob));
    ECHELON_RETURN_IF_ERROR(GetInt(j, where, "decoder_sparse_step", false, &c.decoder_sparse_step));
    ECHELON_RETURN_IF_ERROR(GetDouble(j, where, "router_aux_loss_coef", &c.router_aux_loss_coef));
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      const json& layers = j["mlp_only_layers"];
      if (!layers.is_array()) return FieldError(where, "mlp_only_layers", "must be a list of layer indices");
      for (const json& layer : layers) {
        if (!layer.is_number_integer())
          return FieldError(where, "mlp_only_layers", "must hold integers, got " + layer.dump());
        c.mlp_only_layers.push_back(layer.get<int64_t>());
      }
    }
  }
  if (j.contains("echelon_lora") && !j["echelon_lora"].is_null()) {
    const json& l = j["echelon_lora"];
    if (!l.is_object()) return FieldError(where, "echelon_lora", "must be an object {rank, alpha, targets}");
    ECHELON_RETURN_IF_ERROR(GetInt(l, where + ": echelon_lora", "rank", true, &c.lora.rank));
    ECHELON_RETURN_IF_ERROR(GetDouble(l, where + ": echelon_lora", "alpha", &c.lora.alpha));
    if (!l.contains("targets") || !l["targets"].is_array())
      return FieldError(where, "echelon_lora.targets", "must be a list of projection names");
    for (const json& t : l["targets"]) {
      if (!t.is_string()) return FieldError(where, "echelon_lora.targets", "must hold strings, got " + t.dump());
      c.lora.targets.push_back(t.get<std::string>());
    }
  }
  ECHELON_RETURN_IF_ERROR(RejectUnsupported(j, where));
  Status valid = c.Validate();
  if (!valid.ok()) return valid.WithContext(where);
  return c;
}

Result<ModelConfig> ModelConfig::FromJsonText(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(where + ": not valid JSON");
  return FromJson(j, where);
}

bool ModelConfig::is_sparse(int64_t layer) const {
  return moe() && decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

std::string ModelConfig::architecture() const {
  return model_type == "qwen2"       ? "Qwen2ForCausalLM"
         : model_type == "llama"     ? "LlamaForCausalLM"
         : model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                     : "Qwen3ForCausalLM";
}

nlohmann::json ModelConfig::ToJson() const {
  auto id_or_null = [](int64_t id) { return id < 0 ? json(nullptr) : json(id); };
  json j{
      {"architectures", {architecture()}},
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", tie_word_embeddings},
      {"max_position_embeddings", max_position_embeddings},
      {"bos_token_id", id_or_null(bos_token_id)},
      {"eos_token_id", id_or_null(eos_token_id)},
      {"pad_token_id", id_or_null(pad_token_id)},
      {"hidden_act", "silu"},
      {"attention_bias", attention_bias},
      {"use_sliding_window", false},
      {"torch_dtype", torch_dtype},
  };
  if (model_type == "llama") j["mlp_bias"] = mlp_bias;
  if (moe()) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
  }
  if (lora.on()) j["echelon_lora"] = {{"rank", lora.rank}, {"alpha", lora.alpha}, {"targets", lora.targets}};
  return j;
}

namespace {

// Parameters of decoder layer `i`, counting `experts` of a sparse layer's experts.
int64_t CountLayer(const ModelConfig& c, int64_t i, int64_t experts) {
  const int64_t e = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t attn = e * q + 2 * e * kv + q * e + (c.qk_norm() ? 2 * c.head_dim : 0) +
                       (c.qkv_bias() ? q + 2 * kv : 0) + (c.o_bias() ? e : 0);
  const int64_t dense = 3 * e * c.intermediate_size + (c.mlp_biased() ? 2 * c.intermediate_size + e : 0);
  const int64_t sparse = c.num_experts * e + experts * 3 * e * c.moe_intermediate_size;
  return attn + 2 * e + (c.is_sparse(i) ? sparse : dense);
}

int64_t CountParameters(const ModelConfig& c, bool active_only) {
  int64_t layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers += CountLayer(c, i, active_only ? c.num_experts_per_tok : c.num_experts);
  return c.OuterParameters() + layers;
}

}  // namespace

int64_t ModelConfig::NumParameters() const { return CountParameters(*this, false); }
int64_t ModelConfig::LayerParameters(int64_t layer) const { return CountLayer(*this, layer, num_experts); }
int64_t ModelConfig::OuterParameters() const {
  const int64_t embed = vocab_size * hidden_size;
  return embed + hidden_size + (tie_word_embeddings ? 0 : embed);
}
int64_t ModelConfig::NumActiveParameters() const { return CountParameters(*this, true); }

}  // namespace echelon::model
