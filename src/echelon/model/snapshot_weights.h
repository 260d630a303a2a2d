// Snapshot weights as policies load them. A snapshot's safetensors bytes hold a whole model, or
// in a LoRA run (ModelConfig::lora) the adapter tensors alone: then its metadata
// "echelon.lora_base" is the SHA-256 (hex) of the whole model's bytes it adapts (the base:
// frozen weights, and the adapters as the run started them), which the policy loads first.
//
//   std::string held;   // the base the model holds: kept by LoadPolicyWeights
//   ECHELON_RETURN_IF_ERROR(LoadPolicyWeights(*model, base_bytes, &held, "base"));
//   ECHELON_RETURN_IF_ERROR(LoadPolicyWeights(*model, adapter_bytes, &held, "snapshot v3"));
//
// Thread contract: free functions; the model is the caller's.
#pragma once

#include <string>
#include <string_view>

#include "echelon/common/status.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/safetensors.h"

namespace echelon::model {

inline constexpr char kLoraBaseKey[] = "echelon.lora_base";

// The adapter snapshot of `model` (config().lora on) over the base of SHA-256 `base_sha256`.
Result<std::string> SerializeAdapter(const Qwen3Model& model, const std::string& base_sha256);
// The base an adapter file names (its kLoraBaseKey); empty for a whole model's file.
std::string AdapterBase(const SafetensorsFile& f);
// The base that adapter snapshot bytes name, read from the header alone; empty for a whole
// model's bytes (or bytes that are not safetensors).
std::string AdapterBaseOf(const std::string& bytes);

// Loads snapshot bytes into `model`. A whole model's weights replace every tensor, and
// *held_base becomes their SHA-256 when the model has adapters (a LoRA run's base), else
// empty. An adapter replaces the adapter tensors only, and only over the base it names:
// FailedPrecondition when *held_base is another. Nothing changes on error.
Status LoadPolicyWeights(Qwen3ModelImpl& model, std::string_view bytes, std::string* held_base,
                         const std::string& where);

}  // namespace echelon::model
