// `echelon init-model --tokenizer DIR --out DIR [--arch qwen3] [--hidden-size 32] ...`: a new
// model with random weights in the Hugging Face layout around a real tokenizer, to try a
// pipeline end to end (`model.init`, `echelon serve`) before renting hardware for a real one.
// The vocabulary covers every id of the tokenizer, rounded up to a multiple of 128 as Qwen
// pads it; the stop ids are tokenizer_config.json's eos_token and pad_token.
// Exit codes: 0 written; 2 bad arguments or an unreadable tokenizer (one line naming it).
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "echelon/cli/commands.h"
#include "echelon/common/fs.h"
#include "echelon/model/hf_model.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"
#include "echelon/tokenizer/tokenizer.h"

namespace echelon::cli {
namespace {

struct InitModelArgs {
  std::string tokenizer_dir;
  std::string out;
  model::ModelConfig config;
  uint64_t seed = 2024;
};

Status InitModel(InitModelArgs args) {
  if (std::filesystem::exists(args.out)) return FailedPrecondition(args.out + " exists; give a new --out directory");
  ECHELON_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::Load(args.tokenizer_dir));
  const std::string config_path = (std::filesystem::path(args.tokenizer_dir) / "tokenizer_config.json").string();
  ECHELON_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
  const nlohmann::json config = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return InvalidArgument(config_path + ": not a JSON object");
  std::vector<int64_t> stops;
  for (const std::string key : {"eos_token", "pad_token"}) {
    const std::string token = model::SpecialTokenText(config, key).value_or("");
    if (token.empty()) continue;
    const std::optional<int32_t> id = tok.TokenToId(token);
    if (!id) return InvalidArgument(config_path + ": " + key + " \"" + token + "\" is not in tokenizer.json");
    if (std::find(stops.begin(), stops.end(), *id) == stops.end()) stops.push_back(*id);
  }
  if (stops.empty()) return InvalidArgument(config_path + ": no eos_token, so completions could never end");
  model::ModelConfig& c = args.config;
  c.vocab_size = (static_cast<int64_t>(tok.id_end()) + 127) / 128 * 128;
  c.eos_token_id = stops[0];
  c.pad_token_id = stops.size() > 1 ? stops[1] : -1;
  const std::string bos = model::SpecialTokenText(config, "bos_token").value_or("");
  c.bos_token_id = bos.empty() || !tok.TokenToId(bos) ? -1 : *tok.TokenToId(bos);
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  ECHELON_RETURN_IF_ERROR(c.Validate().WithContext("init-model"));
  model::Qwen3Model m(c);
  m->InitWeights(args.seed);
  ECHELON_RETURN_IF_ERROR(model::SaveModelDir(args.out, m, c.architecture(), stops, args.tokenizer_dir));
  spdlog::info("wrote {} ({}, {:.1f} M parameters, vocabulary {}, stop ids {})", args.out, c.architecture(),
               c.NumParameters() / 1e6, c.vocab_size, nlohmann::json(stops).dump());
  return Status::Ok();
}

}  // namespace

void AddInitModelCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InitModelArgs>();
  model::ModelConfig& c = args->config;
  c.hidden_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.intermediate_size = 64;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = true;
  CLI::App* cmd = app.add_subcommand(
      "init-model", "write a model with random weights in the Hugging Face layout around a tokenizer (for trying a pipeline)");
  cmd->add_option("--tokenizer", args->tokenizer_dir, "directory with tokenizer.json and tokenizer_config.json")->required();
  cmd->add_option("--out", args->out, "the model directory to create")->required();
  cmd->add_option("--arch", c.model_type, "qwen3, qwen2, llama or qwen3_moe")->capture_default_str();
  cmd->add_option("--hidden-size", c.hidden_size)->capture_default_str();
  cmd->add_option("--layers", c.num_hidden_layers)->capture_default_str();
  cmd->add_option("--heads", c.num_attention_heads)->capture_default_str();
  cmd->add_option("--kv-heads", c.num_key_value_heads)->capture_default_str();
  cmd->add_option("--head-dim", c.head_dim, "0: hidden size / heads")->capture_default_str();
  cmd->add_option("--intermediate-size", c.intermediate_size)->capture_default_str();
  cmd->add_option("--max-positions", c.max_position_embeddings)->capture_default_str();
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  cmd->add_option("--experts", c.num_experts, "qwen3_moe: experts per sparse layer")->capture_default_str();
  cmd->add_option("--experts-per-token", c.num_experts_per_tok, "qwen3_moe: top-k")->capture_default_str();
  cmd->add_option("--moe-intermediate-size", c.moe_intermediate_size, "qwen3_moe: an expert's SwiGLU width")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "seeds the random weights")->capture_default_str();
  cmd->callback([args, exit_code] {
    const Status st = InitModel(*args);
    if (!st.ok()) spdlog::error("{}", st.message());
    *exit_code = st.ok() ? 0 : 2;
  });
}

}  // namespace echelon::cli
