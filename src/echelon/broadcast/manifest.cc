#include "echelon/broadcast/manifest.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "echelon/common/parallel.h"
#include "echelon/common/sha256.h"

namespace echelon::broadcast {
namespace {

using nlohmann::json;

constexpr char kSignedPrefix[] = "echelon-manifest-v1\n";

bool IsHexDigest(const std::string& s) {
  if (s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

json ToJson(const Manifest& m) {
  json tensors = json::array();
  for (const TensorEntry& t : m.tensors) {
    tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"begin", t.begin}, {"end", t.end}});
  }
  json j{{"version", m.version},     {"total_bytes", m.total_bytes}, {"chunk_bytes", m.chunk_bytes},
         {"chunks", m.chunk_sha256}, {"file_sha256", m.file_sha256}, {"tensors", tensors}};
  if (m.has_deltas()) {
    json deltas = json::array();
    for (size_t i = 0; i < m.delta_sha256.size(); ++i) {
      deltas.push_back(json::array({m.delta_sha256[i], i < m.delta_bytes.size() ? m.delta_bytes[i] : 0}));
    }
    j["base_sha256"] = m.base_sha256;
    j["deltas"] = deltas;
  }
  return j;
}

Status Field(const json& j, const char* key, json::value_t type, const json** out) {
  auto it = j.find(key);
  bool ok = it != j.end() &&
            (it->type() == type || (type == json::value_t::number_unsigned && it->is_number_unsigned()));
  if (!ok) return InvalidArgument(std::string("manifest field '") + key + "' missing or of the wrong type");
  *out = &*it;
  return Status::Ok();
}

Result<Manifest> FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("manifest is not a JSON object");
  const json *version, *total, *chunk, *chunks, *file, *tensors;
  ECHELON_RETURN_IF_ERROR(Field(j, "version", json::value_t::number_unsigned, &version));
  ECHELON_RETURN_IF_ERROR(Field(j, "total_bytes", json::value_t::number_unsigned, &total));
  ECHELON_RETURN_IF_ERROR(Field(j, "chunk_bytes", json::value_t::number_unsigned, &chunk));
  ECHELON_RETURN_IF_ERROR(Field(j, "chunks", json::value_t::array, &chunks));
  ECHELON_RETURN_IF_ERROR(Field(j, "file_sha256", json::value_t::string, &file));
  ECHELON_RETURN_IF_ERROR(Field(j, "tensors", json::value_t::array, &tensors));
  Manifest m;
  m.version = version->get<uint64_t>();
  m.total_bytes = total->get<uint64_t>();
  if (chunk->get<uint64_t>() > UINT32_MAX) return InvalidArgument("manifest field 'chunk_bytes' too large");
  m.chunk_bytes = static_cast<uint32_t>(chunk->get<uint64_t>());
  m.file_sha256 = file->get<std::string>();
  for (const json& h : *chunks) {
    if (!h.is_string()) return InvalidArgument("manifest field 'chunks' holds a non-string");
    m.chunk_sha256.push_back(h.get<std::string>());
  }
  for (const json& t : *tensors) {
    TensorEntry e;
    const json *name, *dtype, *shape, *begin, *end;
    if (!t.is_object()) return InvalidArgument("manifest field 'tensors' holds a non-object");
    ECHELON_RETURN_IF_ERROR(Field(t, "name", json::value_t::string, &name));
    ECHELON_RETURN_IF_ERROR(Field(t, "dtype", json::value_t::string, &dtype));
    ECHELON_RETURN_IF_ERROR(Field(t, "shape", json::value_t::array, &shape));
    ECHELON_RETURN_IF_ERROR(Field(t, "begin", json::value_t::number_unsigned, &begin));
    ECHELON_RETURN_IF_ERROR(Field(t, "end", json::value_t::number_unsigned, &end));
    e.name = name->get<std::string>();
    e.dtype = dtype->get<std::string>();
    for (const json& d : *shape) {
      if (!d.is_number_integer()) return InvalidArgument("manifest tensor '" + e.name + "' has a bad shape");
      e.shape.push_back(d.get<int64_t>());
    }
    e.begin = begin->get<uint64_t>();
    e.end = end->get<uint64_t>();
    m.tensors.push_back(std::move(e));
  }
  if (j.contains("base_sha256") || j.contains("deltas")) {
    const json *base, *deltas;
    ECHELON_RETURN_IF_ERROR(Field(j, "base_sha256", json::value_t::string, &base));
    ECHELON_RETURN_IF_ERROR(Field(j, "deltas", json::value_t::array, &deltas));
    m.base_sha256 = base->get<std::string>();
    for (const json& d : *deltas) {
      if (!d.is_array() || d.size() != 2 || !d[0].is_string() || !d[1].is_number_unsigned()) {
        return InvalidArgument("manifest field 'deltas' holds an entry that is not [\"sha256\", bytes]");
      }
      m.delta_sha256.push_back(d[0].get<std::string>());
      m.delta_bytes.push_back(d[1].get<uint64_t>());
    }
  }
  ECHELON_RETURN_IF_ERROR(m.Validate());
  return m;
}

}  // namespace

uint64_t Manifest::ChunkSize(size_t i) const {
  if (i >= num_chunks()) return 0;
  return std::min<uint64_t>(chunk_bytes, total_bytes - ChunkOffset(i));
}

std::vector<size_t> Manifest::ChunksOfTensor(const std::string& name) const {
  std::vector<size_t> out;
  for (const TensorEntry& t : tensors) {
    if (t.name != name || t.begin == t.end) continue;
    for (uint64_t c = t.begin / chunk_bytes; c <= (t.end - 1) / chunk_bytes; ++c) out.push_back(c);
  }
  return out;
}

std::string Manifest::CanonicalJson() const { return ToJson(*this).dump(); }

Status Manifest::Validate() const {
  if (chunk_bytes < kMinChunkBytes) {
    return InvalidArgument("manifest chunk_bytes " + std::to_string(chunk_bytes) + " is below the minimum " +
                           std::to_string(kMinChunkBytes));
  }
  uint64_t expect = (total_bytes + chunk_bytes - 1) / chunk_bytes;
  if (chunk_sha256.size() != expect) {
    return InvalidArgument("manifest has " + std::to_string(chunk_sha256.size()) + " chunk hashes, but " +
                           std::to_string(total_bytes) + " bytes in " + std::to_string(chunk_bytes) +
                           "-byte chunks need " + std::to_string(expect));
  }
  for (size_t i = 0; i < chunk_sha256.size(); ++i) {
    if (!IsHexDigest(chunk_sha256[i])) {
      return InvalidArgument("manifest chunks[" + std::to_string(i) + "] is not a 64-character lowercase hex SHA-256");
    }
  }
  if (!IsHexDigest(file_sha256)) return InvalidArgument("manifest file_sha256 is not a lowercase hex SHA-256");
  for (const TensorEntry& t : tensors) {
    if (t.begin > t.end || t.end > total_bytes) {
      return InvalidArgument("manifest tensor '" + t.name + "' byte range lies outside the file");
    }
  }
  if (!has_deltas()) {
    if (!delta_sha256.empty() || !delta_bytes.empty()) return InvalidArgument("manifest has deltas but no base_sha256");
    return Status::Ok();
  }
  if (!IsHexDigest(base_sha256)) return InvalidArgument("manifest base_sha256 is not a lowercase hex SHA-256");
  if (delta_sha256.size() != chunk_sha256.size() || delta_bytes.size() != chunk_sha256.size()) {
    return InvalidArgument("manifest has " + std::to_string(delta_sha256.size()) + " delta entries for " +
                           std::to_string(chunk_sha256.size()) + " chunks");
  }
  for (size_t i = 0; i < delta_sha256.size(); ++i) {
    const std::string where = "manifest deltas[" + std::to_string(i) + "]";
    if (delta_sha256[i].empty()) {
      if (delta_bytes[i] != 0) return InvalidArgument(where + " has a size but no SHA-256");
      continue;
    }
    if (!IsHexDigest(delta_sha256[i])) return InvalidArgument(where + " is not a 64-character lowercase hex SHA-256");
    if (delta_bytes[i] == 0 || delta_bytes[i] >= ChunkSize(i)) {
      return InvalidArgument(where + " has " + std::to_string(delta_bytes[i]) + " bytes; a delta must be smaller than its " +
                             std::to_string(ChunkSize(i)) + "-byte chunk");
    }
  }
  return Status::Ok();
}

bool Manifest::operator==(const Manifest& o) const {
  return version == o.version && total_bytes == o.total_bytes && chunk_bytes == o.chunk_bytes &&
         chunk_sha256 == o.chunk_sha256 && file_sha256 == o.file_sha256 && tensors == o.tensors &&
         base_sha256 == o.base_sha256 && delta_sha256 == o.delta_sha256 && delta_bytes == o.delta_bytes;
}

Result<Manifest> BuildManifest(uint64_t version, const std::string& blob, uint32_t chunk_bytes, int threads) {
  if (chunk_bytes < kMinChunkBytes) {
    return InvalidArgument("chunk size " + std::to_string(chunk_bytes) + " is below the minimum " +
                           std::to_string(kMinChunkBytes) + " bytes");
  }
  Manifest m;
  m.version = version;
  m.total_bytes = blob.size();
  m.chunk_bytes = chunk_bytes;
  m.chunk_sha256.resize((blob.size() + chunk_bytes - 1) / chunk_bytes);
  // Item 0 is the whole file's hash (the longest, so it starts first); the chunks' run beside it.
  ECHELON_RETURN_IF_ERROR(ParallelFor(m.chunk_sha256.size() + 1, threads, [&](size_t i) {
    if (i == 0) {
      m.file_sha256 = Sha256Hex(blob);
    } else {
      m.chunk_sha256[i - 1] = Sha256Hex(ChunkView(m, blob, i - 1));
    }
    return Status::Ok();
  }));
  if (!ParseSafetensorsIndex(blob, &m.tensors).ok()) m.tensors.clear();  // optional: not safetensors
  return m;
}

std::string_view ChunkView(const Manifest& m, const std::string& blob, size_t i) {
  return std::string_view(blob).substr(m.ChunkOffset(i), m.ChunkSize(i));
}

Result<std::string> SignManifest(const Manifest& m, const SigningKey& key) {
  ECHELON_RETURN_IF_ERROR(m.Validate());
  const std::string canonical = m.CanonicalJson();
  ECHELON_ASSIGN_OR_RETURN(std::string sig, key.Sign(kSignedPrefix + canonical));
  json envelope{{"key_id", key.public_key().key_id()}, {"manifest", json::parse(canonical)}, {"signature", ToHex(sig)}};
  return envelope.dump();
}

Result<Manifest> VerifySignedManifest(const std::string& envelope, const VerifyKey& key) {
  json j = json::parse(envelope, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("manifest") || !j.contains("signature") || !j["signature"].is_string()) {
    return InvalidArgument("not a signed manifest: expected {\"key_id\", \"manifest\", \"signature\"}");
  }
  if (j.contains("key_id") && j["key_id"].is_string() && j["key_id"].get<std::string>() != key.key_id()) {
    return DataLoss("manifest was signed by key " + j["key_id"].get<std::string>() + ", but the trusted key is " +
                    key.key_id() + " (check the --key file)");
  }
  std::string sig;
  if (!FromHex(j["signature"].get<std::string>(), &sig)) return DataLoss("manifest signature is not hex");
  // Verify over the manifest exactly as received (re-serialised canonically), then require
  // that it round-trips: nothing unsigned or unknown can slip through.
  const std::string received = j["manifest"].dump();
  ECHELON_RETURN_IF_ERROR(key.Verify(kSignedPrefix + received, sig).WithContext("manifest rejected"));
  ECHELON_ASSIGN_OR_RETURN(Manifest m, FromJson(j["manifest"]));
  if (m.CanonicalJson() != received) return DataLoss("manifest rejected: not in canonical form (unknown fields?)");
  return m;
}

Status VerifyChunk(const Manifest& m, size_t i, std::string_view bytes) {
  if (i >= m.num_chunks()) {
    return InvalidArgument("chunk " + std::to_string(i) + " out of range (version " + std::to_string(m.version) +
                           " has " + std::to_string(m.num_chunks()) + ")");
  }
  if (bytes.size() != m.ChunkSize(i)) {
    return DataLoss("chunk " + std::to_string(i) + " of version " + std::to_string(m.version) + " has " +
                    std::to_string(bytes.size()) + " bytes, expected " + std::to_string(m.ChunkSize(i)));
  }
  if (Sha256Hex(bytes) != m.chunk_sha256[i]) {
    return DataLoss("chunk " + std::to_string(i) + " of version " + std::to_string(m.version) +
                    " fails its SHA-256 check (expected " + m.chunk_sha256[i].substr(0, 16) + "...)");
  }
  return Status::Ok();
}

Status VerifyDelta(const Manifest& m, size_t i, std::string_view bytes) {
  if (!m.HasDelta(i)) {
    return NotFound("chunk " + std::to_string(i) + " of version " + std::to_string(m.version) + " has no delta");
  }
  if (bytes.size() != m.delta_bytes[i] || Sha256Hex(bytes) != m.delta_sha256[i]) {
    return DataLoss("delta of chunk " + std::to_string(i) + " of version " + std::to_string(m.version) +
                    " does not match its signed size/SHA-256 (expected " + m.delta_sha256[i].substr(0, 16) + "...)");
  }
  return Status::Ok();
}

Status VerifyBlob(const Manifest& m, const std::string& blob) {
  return VerifyBlob(m, std::vector<std::string_view>{blob});
}

Status VerifyBlob(const Manifest& m, const std::vector<std::string_view>& parts) {
  uint64_t size = 0;
  for (std::string_view p : parts) size += p.size();
  if (size != m.total_bytes || Sha256Hex(parts) != m.file_sha256) {
    return DataLoss("assembled version " + std::to_string(m.version) + " does not match the manifest's size/SHA-256");
  }
  return Status::Ok();
}

}  // namespace echelon::broadcast
