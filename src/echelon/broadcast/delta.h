// Delta chunks: chunk i of a new snapshot sent as its difference from the bytes at the same
// offset of a base snapshot the receiver already holds. Between two RL updates most weights are
// bitwise unchanged, and a changed bf16 weight usually differs only in its low bits, so the XOR
// of new and base is mostly zero bytes; split into byte planes (the k-th byte of every element
// together, so the unchanging sign/exponent bytes form one long zero run) and compressed with
// zstd, it is a small fraction of the chunk. The receiver XORs the decoded bytes onto its base
// and checks the result against the chunk's signed SHA-256, so a delta can never yield bytes
// the origin did not sign.
//
//   // origin, once per version: deltas of every chunk of `target` against `base`
//   Result<std::vector<std::string>> d = AddDeltas(&manifest, target, base);  // before signing
//   // receiver: the delta's size and SHA-256 are checked against the signed manifest first
//   Result<std::string> chunk = DecodeChunkDelta(delta, base_chunk, m.ChunkSize(i));
//   ECHELON_RETURN_IF_ERROR(VerifyChunk(m, i, chunk.value()));
//
// Format "ECD1": the 4 magic bytes, the plane stride (1 byte: 1, 2, 4 or 8), the phase (1 byte,
// < stride: byte j of the chunk belongs to plane (j + phase) % stride), 2 zero bytes, then
// exactly one zstd frame whose header states its content size, which must equal the chunk's
// size. Base bytes past the end of the base count as zeros.
//
// Thread contract: free functions; no shared state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "echelon/broadcast/manifest.h"
#include "echelon/common/status.h"

namespace echelon::broadcast {

inline constexpr int kDeltaZstdLevel = 3;   // zstd's default: ~300 MB/s per core, ratio near level 9's on XOR data
inline constexpr size_t kDeltaHeaderBytes = 8;

// The delta of `target` against `base` (base may be shorter or longer than target; bytes past
// its end count as zeros). stride: the element size whose bytes are split into planes.
Result<std::string> EncodeChunkDelta(std::string_view target, std::string_view base, int stride, int phase);

// The chunk `delta` encodes against `base`; DataLoss naming what is wrong for anything that is
// not a well-formed delta of exactly `chunk_size` bytes (it never allocates more than that).
Result<std::string> DecodeChunkDelta(std::string_view delta, std::string_view base, uint64_t chunk_size);

// The plane stride for a snapshot: the element size (2 for BF16/F16, 4 for F32, 8 for F64,
// 1 otherwise) of the dtype holding most of the manifest's tensor bytes, and the offset the
// first tensor's data starts at (so planes line up with elements). {1, 0} without tensors.
struct PlaneLayout {
  int stride = 1;
  uint64_t data_start = 0;
};
PlaneLayout PlaneLayoutOf(const Manifest& m);

// The bytes of a base snapshot as they are held: one string, or a store's chunks (so that a
// base need not be copied into one string to encode or decode against it).
//
//   BaseBytes b = BaseBytes::Whole(blob);                  // a view: blob must outlive b
//   std::string scratch;
//   std::string_view part = b.Range(offset, length, &scratch);
class BaseBytes {
 public:
  BaseBytes() = default;
  static BaseBytes Whole(std::string_view blob);
  // pieces[k] holds bytes [k * piece_bytes, ...); every piece but the last is piece_bytes long.
  static BaseBytes Pieces(std::vector<std::shared_ptr<const std::string>> pieces, uint64_t piece_bytes);

  uint64_t size() const { return size_; }
  const std::vector<std::string_view>& pieces() const { return views_; }
  // Bytes [begin, begin + length) clipped to size(): in place when one piece holds them all,
  // else joined into *scratch.
  std::string_view Range(uint64_t begin, uint64_t length, std::string* scratch) const;

 private:
  std::vector<std::string_view> views_;
  std::vector<std::shared_ptr<const std::string>> owned_;  // keeps the pieces alive
  uint64_t piece_bytes_ = 1;
  uint64_t size_ = 0;
};

// Fills m's delta fields for `target` (the blob m describes) against `base` and returns each
// chunk's delta bytes ("" for a chunk whose delta would not be smaller than the chunk itself:
// that chunk is only ever sent whole). The chunk at index i is encoded against base bytes
// [ChunkOffset(i), ChunkOffset(i) + ChunkSize(i)), whatever chunk size the base was cut into.
// base_sha256: the base's whole-file SHA-256 (signed into m). Chunks are encoded on `threads`
// threads (0: one per core).
Result<std::vector<std::string>> AddDeltas(Manifest* m, const std::string& target, const BaseBytes& base,
                                           const std::string& base_sha256, int threads = 0);
// The same against a base held as one string (its SHA-256 computed here).
Result<std::vector<std::string>> AddDeltas(Manifest* m, const std::string& target, const std::string& base,
                                           int threads = 0);

}  // namespace echelon::broadcast
