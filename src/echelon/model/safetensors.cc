#include "echelon/model/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "echelon/common/fs.h"

namespace echelon::model {
namespace {

using nlohmann::json;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  size_t itemsize;
};

// LibTorch 1.13 has no unsigned types wider than a byte, so U16/U32/U64 are refused.
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* DtypeByName(const std::string& name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* DtypeByType(at::ScalarType type) {
  for (const DtypeInfo& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

// One header entry, validated on its own; placement against the others is checked later.
struct Entry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

Result<Entry> ParseEntry(const std::string& name, const json& v, const std::string& where) {
  const std::string at_name = where + ": tensor \"" + name + "\": ";
  if (!v.is_object()) return DataLoss(at_name + "header entry is not an object");
  Entry e;
  e.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return DataLoss(at_name + "missing dtype");
  e.dtype = DtypeByName(dt->get<std::string>());
  if (e.dtype == nullptr) return DataLoss(at_name + "unsupported dtype " + dt->dump());
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) return DataLoss(at_name + "missing shape");
  uint64_t bytes = e.dtype->itemsize;
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) return DataLoss(at_name + "bad shape " + shape->dump());
    uint64_t n = d.get<uint64_t>();
    if (n > (uint64_t{1} << 62) || __builtin_mul_overflow(bytes, n, &bytes)) {
      return DataLoss(at_name + "shape " + shape->dump() + " is too large");
    }
    e.shape.push_back(static_cast<int64_t>(n));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return DataLoss(at_name + "data_offsets must be [begin, end]");
  }
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin) return DataLoss(at_name + "data_offsets " + off->dump() + " end before they begin");
  if (e.end - e.begin != bytes) {
    return DataLoss(at_name + "data_offsets " + off->dump() + " hold " + std::to_string(e.end - e.begin) +
                    " bytes but " + dt->get<std::string>() + shape->dump() + " needs " + std::to_string(bytes));
  }
  return e;
}

// The entries must tile the data section exactly: no overlap, no gap, nothing past the end.
Status CheckLayout(std::vector<Entry>* entries, uint64_t data_size, const std::string& where) {
  std::sort(entries->begin(), entries->end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expected = 0;
  for (const Entry& e : *entries) {
    if (e.end > data_size) {
      return DataLoss(where + ": tensor \"" + e.name + "\" data_offsets end " + std::to_string(e.end) +
                      " is past the data section (" + std::to_string(data_size) + " bytes); file truncated?");
    }
    if (e.begin < expected) return DataLoss(where + ": tensor \"" + e.name + "\" overlaps the previous tensor");
    if (e.begin > expected) {
      return DataLoss(where + ": gap of " + std::to_string(e.begin - expected) + " bytes before tensor \"" + e.name +
                      "\"");
    }
    expected = e.end;
  }
  if (expected != data_size) {
    return DataLoss(where + ": " + std::to_string(data_size - expected) + " bytes after the last tensor");
  }
  return Status::Ok();
}

Result<std::map<std::string, std::string>> ParseMetadata(const json& m, const std::string& where) {
  if (!m.is_object()) return DataLoss(where + ": __metadata__ must be an object of strings");
  std::map<std::string, std::string> out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it.value().is_string())
      return DataLoss(where + ": __metadata__ value of \"" + it.key() + "\" is not a string");
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

Result<at::Tensor> MakeTensor(const Entry& e, const char* data, const std::string& where, bool view) {
  const size_t n = e.end - e.begin;
  const auto address = reinterpret_cast<uintptr_t>(data + e.begin);
  if (view && n > 0 && e.dtype->type != at::kBool && address % e.dtype->itemsize == 0) {
    // Never written through: the bytes are the caller's (ViewSafetensors' contract).
    return at::from_blob(const_cast<char*>(data + e.begin), e.shape, at::TensorOptions().dtype(e.dtype->type));
  }
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
  if (n > 0) std::memcpy(t.data_ptr(), data + e.begin, n);
  if (e.dtype->type == at::kBool) {
    // A bool byte other than 0/1 is undefined behaviour once read as bool.
    const auto* b = reinterpret_cast<const unsigned char*>(data + e.begin);
    if (std::any_of(b, b + n, [](unsigned char c) { return c > 1; })) {
      return DataLoss(where + ": tensor \"" + e.name + "\" has BOOL bytes other than 0 and 1");
    }
  }
  return t;
}

Result<SafetensorsFile> Parse(std::string_view bytes, const std::string& where, bool view) {
  if (bytes.size() < 8) {
    return DataLoss(where + ": " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8) {
    return DataLoss(where + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                    std::to_string(bytes.size()) + " bytes); file truncated?");
  }
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return DataLoss(where + ": header is not a valid JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      ECHELON_ASSIGN_OR_RETURN(out.metadata, ParseMetadata(it.value(), where));
      continue;
    }
    ECHELON_ASSIGN_OR_RETURN(Entry e, ParseEntry(it.key(), it.value(), where));
    entries.push_back(std::move(e));
  }
  const uint64_t data_size = bytes.size() - 8 - n;
  ECHELON_RETURN_IF_ERROR(CheckLayout(&entries, data_size, where));
  const char* data = bytes.data() + 8 + n;
  for (const Entry& e : entries) {
    ECHELON_ASSIGN_OR_RETURN(out.tensors[e.name], MakeTensor(e, data, where, view));
  }
  return out;
}

}  // namespace

Result<SafetensorsFile> ParseSafetensors(std::string_view bytes, const std::string& where) {
  return Parse(bytes, where, /*view=*/false);
}

Result<SafetensorsFile> ViewSafetensors(std::string_view bytes, const std::string& where) {
  return Parse(bytes, where, /*view=*/true);
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return ParseSafetensors(bytes, path);
}

Result<std::string> SerializeSafetensors(const std::map<std::string, at::Tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || name.empty()) return InvalidArgument("invalid tensor name \"" + name + "\"");
    if (!t.defined()) return InvalidArgument("tensor \"" + name + "\" is undefined");
    const DtypeInfo* d = DtypeByType(t.scalar_type());
    if (d == nullptr) {
      return InvalidArgument("tensor \"" + name + "\": dtype " + std::string(c10::toString(t.scalar_type())) +
                             " cannot be stored in safetensors");
    }
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t n = static_cast<uint64_t>(c.numel()) * d->itemsize;
    header[name] = {{"dtype", d->name}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    contiguous.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += text;
  for (const at::Tensor& c : contiguous) {
    if (c.numel() > 0) out.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, SerializeSafetensors(tensors, metadata));
  return WriteFileAtomic(path, bytes).WithContext("writing " + path);
}

}  // namespace echelon::model
