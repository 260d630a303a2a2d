// Fuzzes the safetensors reader: checkpoints and snapshots are files and bytes from elsewhere.
#include <cstddef>
#include <cstdint>
#include <string>

#include "echelon/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  echelon::model::ParseSafetensors(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  return 0;
}
