// Manifest: what a snapshot version is made of (sizes, SHA-256 of every fixed-size chunk,
// the whole-file SHA-256 and, for safetensors blobs, the tensor index), serialised to
// canonical JSON and signed by the origin with Ed25519.
//
//   // origin
//   Result<Manifest> m = BuildManifest(/*version=*/7, blob);          // 4 MiB chunks
//   Result<std::string> envelope = SignManifest(*m, signing_key);     // send to peers
//   // peer
//   Result<Manifest> got = VerifySignedManifest(envelope_text, trusted_key);
//   Status ok = VerifyChunk(*got, i, bytes);                          // before use or relay
//
// Canonical JSON = nlohmann::json::dump() of the manifest object: keys sorted, no spaces,
// integers only. The signature covers "echelon-manifest-v1\n" + that text, so a manifest is
// accepted exactly as signed: a changed field, an extra field, or another key is refused.
//
// Thread contract: values and free functions; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "echelon/broadcast/ed25519.h"
#include "echelon/broadcast/tensor_index.h"
#include "echelon/broadcast/tunables.h"
#include "echelon/common/status.h"

namespace echelon::broadcast {

struct Manifest {
  uint64_t version = 0;
  uint64_t total_bytes = 0;
  uint32_t chunk_bytes = kDefaultChunkBytes;
  std::vector<std::string> chunk_sha256;  // lowercase hex, one per chunk, in file order
  std::string file_sha256;                // lowercase hex of the whole blob
  std::vector<TensorEntry> tensors;       // sorted by name; empty if the blob is not safetensors
  // Deltas (broadcast/delta.h), all empty when the version is only sent whole: the SHA-256 of
  // the base blob they are taken against, and per chunk the delta's SHA-256 and size ("" and 0:
  // that chunk has no delta). In the canonical JSON only when base_sha256 is set, so a manifest
  // without deltas signs exactly as before.
  std::string base_sha256;
  std::vector<std::string> delta_sha256;
  std::vector<uint64_t> delta_bytes;

  size_t num_chunks() const { return chunk_sha256.size(); }
  uint64_t ChunkOffset(size_t i) const { return static_cast<uint64_t>(i) * chunk_bytes; }
  uint64_t ChunkSize(size_t i) const;
  // Indices of the chunks that overlap tensor `name`'s byte range; empty if unknown.
  std::vector<size_t> ChunksOfTensor(const std::string& name) const;
  bool has_deltas() const { return !base_sha256.empty(); }
  bool HasDelta(size_t i) const { return i < delta_sha256.size() && !delta_sha256[i].empty(); }

  std::string CanonicalJson() const;
  // Structural checks: chunk count matches sizes, hashes are 64 hex characters, tensor
  // ranges inside the file, one delta entry per chunk, each smaller than its chunk. Errors name
  // the field.
  Status Validate() const;

  bool operator==(const Manifest& o) const;
};

// Splits `blob` into `chunk_bytes` chunks (the last may be shorter; an empty blob has none)
// and hashes each, and the whole file, on `threads` threads (0: one per core). The tensor
// index is filled when the blob parses as safetensors.
Result<Manifest> BuildManifest(uint64_t version, const std::string& blob,
                               uint32_t chunk_bytes = kDefaultChunkBytes, int threads = 0);

// The bytes of chunk i of `blob` (a view into it).
std::string_view ChunkView(const Manifest& m, const std::string& blob, size_t i);

// {"key_id": "...", "manifest": {...}, "signature": "<128 hex>"}
Result<std::string> SignManifest(const Manifest& m, const SigningKey& key);
// Refuses (DataLoss) a bad signature, a wrong key, or any change to the signed manifest;
// InvalidArgument for text that is not an envelope at all.
Result<Manifest> VerifySignedManifest(const std::string& envelope, const VerifyKey& key);

// DataLoss unless `bytes` has chunk i's size and SHA-256.
Status VerifyChunk(const Manifest& m, size_t i, std::string_view bytes);
// DataLoss unless `bytes` has the size and SHA-256 of chunk i's delta (NotFound: it has none).
Status VerifyDelta(const Manifest& m, size_t i, std::string_view bytes);
// DataLoss unless `blob` has the manifest's total size and whole-file SHA-256.
Status VerifyBlob(const Manifest& m, const std::string& blob);
// The same for the blob held as consecutive parts (a store's chunks), without joining them.
Status VerifyBlob(const Manifest& m, const std::vector<std::string_view>& parts);

}  // namespace echelon::broadcast
