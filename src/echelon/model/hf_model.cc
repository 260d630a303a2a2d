#include "echelon/model/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/model/checkpoint.h"
#include "echelon/model/safetensors.h"

namespace echelon::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;


// eos ids as HF writes them: an integer, a list of integers, or null.
Status AddTokenIds(const json& j, const char* field, const std::string& where, std::vector<int64_t>* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  const json list = it->is_array() ? *it : json::array({*it});
  for (const json& v : list) {
    if (!v.is_number_integer()) return InvalidArgument(where + ": \"" + field + "\" must be an integer or a list of them");
    const int64_t id = v.get<int64_t>();
    if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
  }
  return Status::Ok();
}

// Every tensor of the weights: model.safetensors, or the shards model.safetensors.index.json
// lists (each tensor in exactly the shard the index names). `label` names them in errors.
// `mapped`: views of the files mapped (MapSafetensors), not read.
Result<std::map<std::string, at::Tensor>> ReadWeights(const fs::path& dir, std::string* label, bool mapped) {
  const auto read = [mapped](const std::string& path) { return mapped ? MapSafetensors(path) : ReadSafetensors(path); };
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    const fs::path single = dir / "model.safetensors";
    if (!fs::exists(single, ec))
      return NotFound(single.string() + " is missing (and there is no model.safetensors.index.json)");
    ECHELON_ASSIGN_OR_RETURN(SafetensorsFile f, read(single.string()));
    *label = single.string();
    return std::move(f.tensors);
  }
  *label = dir.string();
  ECHELON_ASSIGN_OR_RETURN(json index, ReadJsonFile(index_path.string()));
  if (!index.contains("weight_map") || !index["weight_map"].is_object() || index["weight_map"].empty())
    return InvalidArgument(index_path.string() + ": missing or empty \"weight_map\"");
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      return InvalidArgument(index_path.string() + ": tensor " + name + " maps to " + file.dump() +
                             ", not a file name in the directory");
    by_file[file.get<std::string>()].insert(name);
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [file, names] : by_file) {
    const fs::path shard = dir / file;
    ECHELON_ASSIGN_OR_RETURN(SafetensorsFile f, read(shard.string()));
    for (const std::string& name : names) {
      auto it = f.tensors.find(name);
      if (it == f.tensors.end())
        return DataLoss(shard.string() + ": tensor " + name + " is missing (model.safetensors.index.json puts it here)");
      out[name] = it->second;
    }
    for (const auto& [name, t] : f.tensors)
      if (names.count(name) == 0)
        return DataLoss(shard.string() + ": tensor " + name + " is not listed for this file in model.safetensors.index.json");
  }
  return out;
}

}  // namespace

Result<TextModel> LoadModelDir(const std::string& dir_arg, bool mapped) {
  fs::path dir = fs::path(dir_arg).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "ckpt/" -> "ckpt"
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("model directory " + dir.string() + " does not exist");
  ECHELON_RETURN_IF_ERROR(VerifyCheckpoint(dir.string(), /*required=*/false));

  TextModel m;
  m.dir = dir.string();
  const fs::path config_path = dir / "config.json";
  ECHELON_ASSIGN_OR_RETURN(json config_json, ReadJsonFile(config_path.string()));
  ECHELON_ASSIGN_OR_RETURN(m.config, ModelConfig::FromJson(config_json, config_path.string()));
  m.architecture = m.config.architecture();
  std::string weights_label;
  ECHELON_ASSIGN_OR_RETURN(auto weights, ReadWeights(dir, &weights_label, mapped));
  try {
    // Mapped: in the storage dtype, so the views are bound as they are.
    m.model = Qwen3Model(m.config, Qwen3ModelImpl::Uninitialized{mapped ? StorageDtype(m.config) : at::kFloat});
  } catch (const c10::Error& e) {
    return InvalidArgument(config_path.string() + ": " + e.what_without_backtrace());
  }
  // The tensors read become the parameters (fp32 ones as they are): no second copy of the model.
  ECHELON_RETURN_IF_ERROR(m.model->BindStateDict(weights, weights_label));

  ECHELON_RETURN_IF_ERROR(AddTokenIds(config_json, "eos_token_id", config_path.string(), &m.stop_ids));
  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path, ec)) {
    ECHELON_ASSIGN_OR_RETURN(json gen, ReadJsonFile(gen_path.string()));
    ECHELON_RETURN_IF_ERROR(AddTokenIds(gen, "eos_token_id", gen_path.string(), &m.stop_ids));
    if (gen.contains("temperature") && gen["temperature"].is_number()) m.temperature = gen["temperature"].get<double>();
    if (gen.contains("top_p") && gen["top_p"].is_number()) m.top_p = gen["top_p"].get<double>();
    if (gen.contains("top_k") && gen["top_k"].is_number_integer()) m.top_k = gen["top_k"].get<int64_t>();
    if (gen.contains("min_p") && gen["min_p"].is_number()) m.min_p = gen["min_p"].get<double>();
    if (gen.contains("repetition_penalty") && gen["repetition_penalty"].is_number())
      m.repetition_penalty = gen["repetition_penalty"].get<double>();
  }
  m.format = "huggingface";
  const fs::path tok_path = dir / "tokenizer.json";
  if (fs::exists(tok_path, ec)) {
    ECHELON_ASSIGN_OR_RETURN(m.vocab, Vocabulary::FromDir(dir.string(), m.stop_ids));
    if (m.vocab->id_end() > m.config.vocab_size)
      return InvalidArgument(tok_path.string() + " has ids up to " + std::to_string(m.vocab->id_end() - 1) +
                             " but config.json vocab_size is " + std::to_string(m.config.vocab_size));
    if (m.vocab->is_characters()) {
      m.format = "echelon";
      m.stop_ids = m.vocab->stop_ids();
    }
  }
  if (m.vocab) m.chat_template = m.vocab->chat_template();
  return m;
}

Result<LoadedCheckpoint> LoadCheckpoint(const std::string& dir, bool mapped) {
  ECHELON_ASSIGN_OR_RETURN(TextModel m, LoadModelDir(dir, mapped));
  if (!m.vocab) return NotFound((fs::path(m.dir) / "tokenizer.json").string() + " is missing");
  return LoadedCheckpoint{m.config, *m.vocab, m.model};
}

Status SaveModelDir(const std::string& dir, const Qwen3Model& model, const std::string& architecture,
                    const std::vector<int64_t>& stop_ids, const std::string& tokenizer_source_dir) {
  const ModelConfig& cfg = model->config();
  if (architecture != cfg.architecture())
    return InvalidArgument("saving " + dir + ": the model is a " + cfg.architecture() + ", not a " + architecture);
  CheckpointFiles files;
  json config = cfg.ToJson();
  if (!stop_ids.empty()) config["eos_token_id"] = stop_ids.size() == 1 ? json(stop_ids[0]) : json(stop_ids);
  files["config.json"] = config.dump(2) + "\n";
  ECHELON_ASSIGN_OR_RETURN(files["model.safetensors"], SafetensorsLayout(model->StorageStateDict(), {{"format", "pt"}}));
  json gen = {{"do_sample", true}};
  if (cfg.bos_token_id >= 0) gen["bos_token_id"] = cfg.bos_token_id;
  if (!stop_ids.empty()) gen["eos_token_id"] = stop_ids.size() == 1 ? json(stop_ids[0]) : json(stop_ids);
  if (cfg.pad_token_id >= 0) gen["pad_token_id"] = cfg.pad_token_id;
  // Keep the source's sampling defaults; our own fields above win.
  std::error_code ec;
  const fs::path source_gen = fs::path(tokenizer_source_dir) / "generation_config.json";
  if (!tokenizer_source_dir.empty() && fs::exists(source_gen, ec)) {
    ECHELON_ASSIGN_OR_RETURN(json src, ReadJsonFile(source_gen.string()));
    if (src.is_object())
      for (const auto& [k, v] : src.items())
        if (!gen.contains(k)) gen[k] = v;
  }
  files["generation_config.json"] = gen.dump(2) + "\n";
  if (!tokenizer_source_dir.empty()) {
    for (const std::string& name : Vocabulary::FileNames()) {
      if (name == "generation_config.json") continue;  // merged above
      const fs::path p = fs::path(tokenizer_source_dir) / name;
      if (!fs::exists(p, ec)) continue;
      ECHELON_ASSIGN_OR_RETURN(files[name], ReadFile(p.string()));
    }
    if (files.count("tokenizer.json") == 0)
      return NotFound("saving " + dir + ": " + tokenizer_source_dir + " has no tokenizer.json to copy");
  }
  return WriteCheckpointDir(dir, files);
}

}  // namespace echelon::model
