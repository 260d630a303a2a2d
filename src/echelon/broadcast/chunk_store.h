// ChunkStore: a receiver's (or the origin's) content-addressed chunk storage across the last
// K snapshot versions.
//
//   ChunkStore store(/*keep_versions=*/3);
//   ECHELON_RETURN_IF_ERROR(store.AddVersion(manifest));     // manifest already verified
//   for (size_t i : store.MissingChunks(v).value()) fetch(i); // delta: only changed chunks
//   Status st = store.PutChunk(v, i, bytes);                  // DataLoss if the hash is wrong
//   if (store.IsComplete(v)) store.WriteVersion(v, "out/model.safetensors");
//
// Chunks are stored once per SHA-256. A chunk of version v is in state kMissing until bytes
// with its hash arrive, then kVerified; since state is "is this hash stored", a chunk whose
// hash did not change from an older kept version is kVerified the moment the new manifest
// is added, and a chunk shared by two indices or two versions is fetched once. Bytes that
// fail verification never enter the store (the state stays kMissing).
//
// Deltas (broadcast/delta.h): a version whose manifest has deltas also takes chunk i as its
// delta. PutDeltaChunk checks the delta against the signed size and SHA-256, decodes it onto
// the base's bytes at the chunk's offset (the base: a kept, complete version whose whole-file
// SHA-256 is the manifest's base_sha256), checks the result like PutChunk, and keeps
// the delta bytes too, so this store can relay the delta onward. The origin, which encodes the
// deltas, adds them with PutDelta.
//
// Versions: the newest K version numbers are kept; adding one more drops the oldest, and
// every chunk no kept version references is deleted (chunks it shares with a kept version
// survive).
//
// Thread contract: thread-safe; one mutex (mu_) guards all state. Hashing in PutChunk runs
// outside the lock, so receivers on many threads verify in parallel. Chunk bytes are handed
// out as shared_ptr<const std::string>: immutable, still valid after garbage collection.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "echelon/broadcast/delta.h"
#include "echelon/broadcast/manifest.h"
#include "echelon/broadcast/tunables.h"
#include "echelon/common/status.h"

namespace echelon::broadcast {

enum class ChunkState { kMissing, kVerified };

class ChunkStore {
 public:
  struct Stats {
    uint64_t verified_puts = 0;    // chunks accepted by PutChunk
    uint64_t rejected_puts = 0;    // chunks refused for a wrong size or hash
    uint64_t duplicate_puts = 0;   // chunks that were already held (no-op)
    uint64_t reused_chunks = 0;    // chunk slots of new versions satisfied by held hashes
    uint64_t collected_chunks = 0; // chunks deleted by version garbage collection
    uint64_t delta_puts = 0;       // chunks accepted through PutDeltaChunk
  };

  explicit ChunkStore(int keep_versions = kDefaultKeepVersions);
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  // Registers a (verified) manifest. Re-adding the same manifest is a no-op; a different
  // manifest under a kept version number, or a version older than all K kept ones, is
  // refused (FailedPrecondition).
  Status AddVersion(const Manifest& m);
  // AddVersion, then every chunk of `blob`: the origin's snapshot, or a base a peer starts
  // with. `m` must have been built from `blob` (BuildManifest) by the caller: the chunks are
  // stored under m's hashes without hashing them a second time (a model-sized pass), copied
  // on `threads` threads (0: one per core).
  Status AddBlob(const Manifest& m, const std::string& blob, int threads = 0);
  bool HasVersion(uint64_t version) const;
  std::vector<uint64_t> Versions() const;  // ascending
  Result<Manifest> GetManifest(uint64_t version) const;
  std::optional<uint64_t> NewestComplete() const;

  // Chunk indices of `version` not yet held, ascending: exactly what a receiver must fetch.
  Result<std::vector<size_t>> MissingChunks(uint64_t version) const;
  // held[i] = chunk i is verified: what a RelayPlanner needs for a peer's delta.
  Result<std::vector<bool>> HeldMask(uint64_t version) const;
  Result<ChunkState> State(uint64_t version, size_t index) const;
  bool IsComplete(uint64_t version) const;

  // Verifies `bytes` against chunk `index` of `version`, then stores it. DataLoss (and no
  // state change) on a wrong size or hash; NotFound for an unknown version.
  Status PutChunk(uint64_t version, size_t index, std::string bytes);
  // The verified bytes of a chunk, for relaying or assembly; NotFound while missing.
  Result<std::shared_ptr<const std::string>> GetChunk(uint64_t version, size_t index) const;

  // The version whose blob the deltas of `version` are taken against, when it is held whole.
  std::optional<uint64_t> DeltaBase(uint64_t version) const;
  // Chunk `index` of `version` has a delta and this store holds its base: fetch the delta.
  bool CanTakeDelta(uint64_t version, size_t index) const;
  // The signed size of chunk `index` of `version` (or of its delta): what a fetch should
  // bring; nullopt for an unknown version, index or delta.
  std::optional<uint64_t> SignedBytes(uint64_t version, size_t index, bool delta) const;
  // Decodes `delta` into chunk `index` of `version` and stores both. NotFound for an unknown
  // version or a chunk without a delta; FailedPrecondition without the base (fetch the chunk
  // whole); DataLoss (no state change) for a delta or result that does not match the manifest.
  Status PutDeltaChunk(uint64_t version, size_t index, std::string delta);
  // Stores chunk `index`'s delta after checking its size and SHA-256 (the origin's own deltas).
  Status PutDelta(uint64_t version, size_t index, std::string delta);
  // The delta of a chunk, for relaying; NotFound when it has none or none is stored here.
  Result<std::shared_ptr<const std::string>> GetDelta(uint64_t version, size_t index) const;

  // The whole blob, checked against the manifest's file SHA-256; FailedPrecondition while
  // chunks are missing.
  Result<std::string> Assemble(uint64_t version) const;
  // A complete version's bytes as its chunks, without copying them (the origin encodes the
  // next version's deltas against it); FailedPrecondition while chunks are missing.
  Result<BaseBytes> Bytes(uint64_t version) const;
  // The whole blob, checked like Assemble, written atomically straight from the chunks (no
  // joined copy): a reader of `path` sees the old file or the whole new one.
  Status WriteVersion(uint64_t version, const std::string& path) const;

  size_t num_stored_chunks() const;
  uint64_t stored_bytes() const;
  Stats stats() const;

 private:
  void CollectGarbageLocked();  // requires mu_
  std::optional<uint64_t> DeltaBaseLocked(const Manifest& m) const;  // requires mu_
  Result<BaseBytes> BytesLocked(const Manifest& m) const;              // requires mu_
  // Bytes(version), checked against the manifest's size and file SHA-256 (one pass, no copy).
  Result<BaseBytes> CheckedBytes(uint64_t version) const;
  void StoreDeltaLocked(const std::string& hash, std::string delta);  // requires mu_; verified bytes

  const int keep_versions_;
  mutable std::mutex mu_;  // guards versions_, chunks_, stored_bytes_, stats_
  std::map<uint64_t, Manifest> versions_;
  std::unordered_map<std::string, std::shared_ptr<const std::string>> chunks_;  // by SHA-256 hex
  std::unordered_map<std::string, std::shared_ptr<const std::string>> deltas_;  // by the delta's SHA-256 hex
  uint64_t stored_bytes_ = 0;
  Stats stats_;
};

}  // namespace echelon::broadcast
