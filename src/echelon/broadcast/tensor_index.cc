#include "echelon/broadcast/tensor_index.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace echelon::broadcast {

Status ParseSafetensorsIndex(const std::string& blob, std::vector<TensorEntry>* out) {
  out->clear();
  if (blob.size() < 8) return InvalidArgument("safetensors: shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(blob[i]);
  if (header_len > blob.size() - 8) return InvalidArgument("safetensors: header length past the end");
  nlohmann::json header = nlohmann::json::parse(blob.begin() + 8, blob.begin() + 8 + header_len,
                                                nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return InvalidArgument("safetensors: header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return InvalidArgument("safetensors: tensor '" + it.key() + "' lacks dtype/shape/data_offsets");
    }
    TensorEntry e;
    e.name = it.key();
    e.dtype = t["dtype"].get<std::string>();
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return InvalidArgument("safetensors: tensor '" + e.name + "' has a bad shape");
      }
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return InvalidArgument("safetensors: tensor '" + e.name + "' has bad data_offsets");
    }
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > blob.size() - data_start) {
      return InvalidArgument("safetensors: tensor '" + e.name + "' data_offsets past the end");
    }
    e.begin = data_start + b;
    e.end = data_start + en;
    out->push_back(std::move(e));
  }
  std::sort(out->begin(), out->end(), [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  return Status::Ok();
}

}  // namespace echelon::broadcast
