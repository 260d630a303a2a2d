#include "echelon/broadcast/chunk_store.h"

#include <algorithm>
#include <unordered_set>

#include "echelon/common/fs.h"
#include "echelon/common/parallel.h"

namespace echelon::broadcast {

ChunkStore::ChunkStore(int keep_versions) : keep_versions_(keep_versions < 1 ? 1 : keep_versions) {}

Status ChunkStore::AddVersion(const Manifest& m) {
  ECHELON_RETURN_IF_ERROR(m.Validate());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(m.version);
  if (it != versions_.end()) {
    if (it->second == m) return Status::Ok();
    return FailedPrecondition("version " + std::to_string(m.version) +
                              " is already held with a different manifest; versions are immutable");
  }
  if (static_cast<int>(versions_.size()) >= keep_versions_ && m.version < versions_.begin()->first) {
    return FailedPrecondition("version " + std::to_string(m.version) + " is older than all " +
                              std::to_string(keep_versions_) + " kept versions (oldest kept: " +
                              std::to_string(versions_.begin()->first) + ")");
  }
  for (const std::string& h : m.chunk_sha256) stats_.reused_chunks += chunks_.count(h);
  versions_.emplace(m.version, m);
  CollectGarbageLocked();
  return Status::Ok();
}

void ChunkStore::CollectGarbageLocked() {
  while (static_cast<int>(versions_.size()) > keep_versions_) versions_.erase(versions_.begin());
  std::unordered_set<std::string> referenced;
  for (const auto& [v, m] : versions_) {
    referenced.insert(m.chunk_sha256.begin(), m.chunk_sha256.end());
    referenced.insert(m.delta_sha256.begin(), m.delta_sha256.end());
  }
  for (auto it = deltas_.begin(); it != deltas_.end();) {
    if (referenced.count(it->first)) {
      ++it;
      continue;
    }
    stored_bytes_ -= it->second->size();
    it = deltas_.erase(it);
  }
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (referenced.count(it->first)) {
      ++it;
      continue;
    }
    stored_bytes_ -= it->second->size();
    ++stats_.collected_chunks;
    it = chunks_.erase(it);
  }
}

Status ChunkStore::AddBlob(const Manifest& m, const std::string& blob, int threads) {
  if (blob.size() != m.total_bytes) {
    return InvalidArgument("version " + std::to_string(m.version) + ": the blob has " + std::to_string(blob.size()) +
                           " bytes, its manifest " + std::to_string(m.total_bytes));
  }
  ECHELON_RETURN_IF_ERROR(AddVersion(m));
  std::vector<std::shared_ptr<const std::string>> copies(m.num_chunks());
  ECHELON_RETURN_IF_ERROR(ParallelFor(m.num_chunks(), threads, [&](size_t i) {
    copies[i] = std::make_shared<const std::string>(ChunkView(m, blob, i));
    return Status::Ok();
  }));
  std::lock_guard<std::mutex> lock(mu_);
  if (!versions_.count(m.version)) return NotFound("version " + std::to_string(m.version) + " was dropped meanwhile");
  for (size_t i = 0; i < m.num_chunks(); ++i) {
    if (!chunks_.emplace(m.chunk_sha256[i], std::move(copies[i])).second) {
      ++stats_.duplicate_puts;
      continue;
    }
    stored_bytes_ += m.ChunkSize(i);
    ++stats_.verified_puts;
  }
  return Status::Ok();
}

bool ChunkStore::HasVersion(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  return versions_.count(version) > 0;
}

std::vector<uint64_t> ChunkStore::Versions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  for (const auto& [v, m] : versions_) out.push_back(v);
  return out;
}

Result<Manifest> ChunkStore::GetManifest(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
  return it->second;
}

std::optional<uint64_t> ChunkStore::NewestComplete() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    bool complete = true;
    for (const std::string& h : it->second.chunk_sha256) complete = complete && chunks_.count(h) > 0;
    if (complete) return it->first;
  }
  return std::nullopt;
}

Result<std::vector<size_t>> ChunkStore::MissingChunks(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
  std::vector<size_t> out;
  const auto& hashes = it->second.chunk_sha256;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (!chunks_.count(hashes[i])) out.push_back(i);
  }
  return out;
}

Result<std::vector<bool>> ChunkStore::HeldMask(uint64_t version) const {
  ECHELON_ASSIGN_OR_RETURN(Manifest m, GetManifest(version));
  ECHELON_ASSIGN_OR_RETURN(std::vector<size_t> missing, MissingChunks(version));
  std::vector<bool> held(m.num_chunks(), true);
  for (size_t i : missing) held[i] = false;
  return held;
}

Result<ChunkState> ChunkStore::State(uint64_t version, size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
  if (index >= it->second.num_chunks()) return InvalidArgument("chunk index " + std::to_string(index) + " out of range");
  return chunks_.count(it->second.chunk_sha256[index]) ? ChunkState::kVerified : ChunkState::kMissing;
}

bool ChunkStore::IsComplete(uint64_t version) const {
  Result<std::vector<size_t>> missing = MissingChunks(version);
  return missing.ok() && missing.value().empty();
}

Status ChunkStore::PutChunk(uint64_t version, size_t index, std::string bytes) {
  Manifest m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) return NotFound("chunk for version " + std::to_string(version) + ", which is not held");
    m = it->second;  // copy: hashing below runs without the lock
  }
  Status verified = VerifyChunk(m, index, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (!verified.ok()) {
    ++stats_.rejected_puts;
    return verified;
  }
  // The version may have been collected meanwhile; its hash is then unreferenced.
  if (!versions_.count(version)) return NotFound("version " + std::to_string(version) + " was dropped meanwhile");
  const std::string& hash = m.chunk_sha256[index];
  if (chunks_.count(hash)) {
    ++stats_.duplicate_puts;
    return Status::Ok();
  }
  stored_bytes_ += bytes.size();
  chunks_.emplace(hash, std::make_shared<const std::string>(std::move(bytes)));
  ++stats_.verified_puts;
  return Status::Ok();
}

Result<std::shared_ptr<const std::string>> ChunkStore::GetChunk(uint64_t version, size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
  if (index >= it->second.num_chunks()) return InvalidArgument("chunk index " + std::to_string(index) + " out of range");
  auto c = chunks_.find(it->second.chunk_sha256[index]);
  if (c == chunks_.end()) {
    return NotFound("chunk " + std::to_string(index) + " of version " + std::to_string(version) + " is missing");
  }
  return c->second;
}

std::optional<uint64_t> ChunkStore::DeltaBaseLocked(const Manifest& m) const {
  if (!m.has_deltas()) return std::nullopt;
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    const Manifest& base = it->second;
    if (it->first == m.version || base.file_sha256 != m.base_sha256) continue;
    bool complete = true;
    for (const std::string& h : base.chunk_sha256) complete = complete && chunks_.count(h) > 0;
    if (complete) return it->first;
  }
  return std::nullopt;
}

void ChunkStore::StoreDeltaLocked(const std::string& hash, std::string delta) {
  if (deltas_.count(hash)) return;
  stored_bytes_ += delta.size();
  deltas_.emplace(hash, std::make_shared<const std::string>(std::move(delta)));
}

std::optional<uint64_t> ChunkStore::DeltaBase(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return std::nullopt;
  return DeltaBaseLocked(it->second);
}

bool ChunkStore::CanTakeDelta(uint64_t version, size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  return it != versions_.end() && it->second.HasDelta(index) && DeltaBaseLocked(it->second).has_value();
}

std::optional<uint64_t> ChunkStore::SignedBytes(uint64_t version, size_t index, bool delta) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end() || index >= it->second.num_chunks()) return std::nullopt;
  if (!delta) return it->second.ChunkSize(index);
  if (!it->second.HasDelta(index)) return std::nullopt;
  return it->second.delta_bytes[index];
}

Status ChunkStore::PutDeltaChunk(uint64_t version, size_t index, std::string delta) {
  Manifest m;
  BaseBytes base_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) return NotFound("delta for version " + std::to_string(version) + ", which is not held");
    m = it->second;
    if (!m.HasDelta(index)) {
      return NotFound("chunk " + std::to_string(index) + " of version " + std::to_string(version) + " has no delta");
    }
    std::optional<uint64_t> base = DeltaBaseLocked(m);
    if (!base) {
      return FailedPrecondition("version " + std::to_string(version) + "'s deltas need base " +
                                m.base_sha256.substr(0, 16) + "..., which is not held whole");
    }
    ECHELON_ASSIGN_OR_RETURN(base_bytes, BytesLocked(versions_.at(*base)));
  }
  // The base's bytes at this chunk's offset, in place when the base was cut the same way.
  std::string joined;
  const std::string_view base_part = base_bytes.Range(m.ChunkOffset(index), m.ChunkSize(index), &joined);
  auto reject = [this](Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.rejected_puts;
    return st;
  };
  Status ok = VerifyDelta(m, index, delta);
  if (!ok.ok()) return reject(ok);
  Result<std::string> chunk = DecodeChunkDelta(delta, base_part, m.ChunkSize(index));
  if (!chunk.ok()) return reject(chunk.status().WithContext("chunk " + std::to_string(index) + " of version " +
                                                             std::to_string(version)));
  ok = VerifyChunk(m, index, chunk.value());
  if (!ok.ok()) return reject(ok.WithContext("decoded from its delta"));
  std::lock_guard<std::mutex> lock(mu_);
  if (!versions_.count(version)) return NotFound("version " + std::to_string(version) + " was dropped meanwhile");
  StoreDeltaLocked(m.delta_sha256[index], std::move(delta));
  const std::string& hash = m.chunk_sha256[index];
  if (chunks_.count(hash)) {
    ++stats_.duplicate_puts;
    return Status::Ok();
  }
  stored_bytes_ += chunk.value().size();
  chunks_.emplace(hash, std::make_shared<const std::string>(std::move(chunk).value()));
  ++stats_.verified_puts;
  ++stats_.delta_puts;
  return Status::Ok();
}

Status ChunkStore::PutDelta(uint64_t version, size_t index, std::string delta) {
  Manifest m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) return NotFound("delta for version " + std::to_string(version) + ", which is not held");
    m = it->second;
  }
  ECHELON_RETURN_IF_ERROR(VerifyDelta(m, index, delta));
  std::lock_guard<std::mutex> lock(mu_);
  if (!versions_.count(version)) return NotFound("version " + std::to_string(version) + " was dropped meanwhile");
  StoreDeltaLocked(m.delta_sha256[index], std::move(delta));
  return Status::Ok();
}

Result<std::shared_ptr<const std::string>> ChunkStore::GetDelta(uint64_t version, size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
  if (!it->second.HasDelta(index)) {
    return NotFound("chunk " + std::to_string(index) + " of version " + std::to_string(version) + " has no delta");
  }
  auto d = deltas_.find(it->second.delta_sha256[index]);
  if (d == deltas_.end()) {
    return NotFound("the delta of chunk " + std::to_string(index) + " of version " + std::to_string(version) +
                    " is not stored here");
  }
  return d->second;
}

Result<std::string> ChunkStore::Assemble(uint64_t version) const {
  ECHELON_ASSIGN_OR_RETURN(BaseBytes bytes, CheckedBytes(version));
  std::string blob;
  blob.reserve(bytes.size());
  for (std::string_view p : bytes.pieces()) blob += p;
  return blob;
}

Result<BaseBytes> ChunkStore::Bytes(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
  return BytesLocked(it->second);
}

Result<BaseBytes> ChunkStore::BytesLocked(const Manifest& m) const {
  std::vector<std::shared_ptr<const std::string>> pieces;
  for (size_t i = 0; i < m.num_chunks(); ++i) {
    auto c = chunks_.find(m.chunk_sha256[i]);
    if (c == chunks_.end()) {
      return FailedPrecondition("version " + std::to_string(m.version) + " is incomplete: chunk " + std::to_string(i) +
                                " is missing");
    }
    pieces.push_back(c->second);
  }
  return BaseBytes::Pieces(std::move(pieces), m.chunk_bytes);
}

Result<BaseBytes> ChunkStore::CheckedBytes(uint64_t version) const {
  Manifest m;
  BaseBytes bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) return NotFound("version " + std::to_string(version) + " is not held");
    m = it->second;
    ECHELON_ASSIGN_OR_RETURN(bytes, BytesLocked(m));
  }
  ECHELON_RETURN_IF_ERROR(VerifyBlob(m, bytes.pieces()));
  return bytes;
}

Status ChunkStore::WriteVersion(uint64_t version, const std::string& path) const {
  // Straight from the chunks: no model-sized joined copy on the way to the file.
  ECHELON_ASSIGN_OR_RETURN(BaseBytes bytes, CheckedBytes(version));
  return WriteFileAtomic(path, bytes.pieces()).WithContext("writing version " + std::to_string(version));
}

size_t ChunkStore::num_stored_chunks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.size();
}

uint64_t ChunkStore::stored_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_bytes_;
}

ChunkStore::Stats ChunkStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace echelon::broadcast
