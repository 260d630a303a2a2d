#include "echelon/model/snapshot_weights.h"


#include <nlohmann/json.hpp>

#include "echelon/common/sha256.h"

namespace echelon::model {

Result<std::string> SerializeAdapter(const Qwen3Model& model, const std::string& base_sha256) {
  if (!model->config().lora.on()) return FailedPrecondition("an adapter snapshot of a model without LoRA adapters");
  return SerializeSafetensors(model->StorageAdapterStateDict(), {{kLoraBaseKey, base_sha256}});
}

std::string AdapterBase(const SafetensorsFile& f) {
  auto it = f.metadata.find(kLoraBaseKey);
  return it == f.metadata.end() ? std::string() : it->second;
}

std::string AdapterBaseOf(const std::string& bytes) {
  if (bytes.size() < 8) return {};
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (n > bytes.size() - 8) return {};
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object() || !header.contains("__metadata__") || !header["__metadata__"].is_object()) return {};
  const nlohmann::json& meta = header["__metadata__"];
  if (!meta.contains(kLoraBaseKey) || !meta[kLoraBaseKey].is_string()) return {};
  return meta[kLoraBaseKey].get<std::string>();
}

Status LoadPolicyWeights(Qwen3ModelImpl& model, std::string_view bytes, std::string* held_base,
                         const std::string& where) {
  ECHELON_ASSIGN_OR_RETURN(SafetensorsFile f, ParseSafetensors(bytes, where));
  const std::string base = AdapterBase(f);
  if (base.empty()) {
    ECHELON_RETURN_IF_ERROR(model.LoadStateDict(f.tensors, where));
    *held_base = model.config().lora.on() ? Sha256Hex(bytes) : std::string();
    return Status::Ok();
  }
  if (base != *held_base)
    return FailedPrecondition(where + ": LoRA adapters over base " + base.substr(0, 12) + ", but this model holds " +
                              (held_base->empty() ? std::string("no base") : "base " + held_base->substr(0, 12)));
  return model.LoadAdapter(f.tensors, where);
}

}  // namespace echelon::model
