#include "echelon/broadcast/delta.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <zstd.h>

#include "echelon/common/parallel.h"
#include "echelon/common/sha256.h"

namespace echelon::broadcast {
namespace {

constexpr char kMagic[4] = {'E', 'C', 'D', '1'};

bool ValidStride(int stride) { return stride == 1 || stride == 2 || stride == 4 || stride == 8; }

int ElementBytes(const std::string& dtype) {
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  return 1;
}

// Byte j of the chunk goes to plane (j + phase) % stride; planes are laid out one after another.
// Plane p holds the bytes j = first(p), first(p) + stride, ... with first(p) = (p - phase) mod stride.
size_t FirstOfPlane(int p, int stride, int phase) { return static_cast<size_t>((p - phase + stride) % stride); }

// Per-thread buffers and zstd contexts, reused from chunk to chunk: a fresh chunk-sized buffer
// and context per chunk (page faults, context set-up) cost more than compressing the mostly
// zero planes of a delta.
struct Scratch {
  std::string planes, frame;
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// A thread keeps buffers up to this size (a peer has kFetchWorkers fetch threads, each may
// decode); a larger chunk's buffer is the call's own and freed after it.
constexpr size_t kMaxKeptScratchBytes = 16u << 20;

char* Buffer(std::string* kept, size_t n, std::string* local) {
  std::string* b = n <= kMaxKeptScratchBytes ? kept : local;
  if (b->size() < n) b->resize(n);
  return b->data();
}

}  // namespace

Result<std::string> EncodeChunkDelta(std::string_view target, std::string_view base, int stride, int phase) {
  if (!ValidStride(stride) || phase < 0 || phase >= stride) {
    return InvalidArgument("delta plane stride " + std::to_string(stride) + " / phase " + std::to_string(phase) +
                           " (stride must be 1, 2, 4 or 8, phase below it)");
  }
  Scratch& s = ThreadScratch();
  const size_t n = target.size(), covered = std::min(n, base.size());
  std::string local_planes, local_frame;
  char* planes = Buffer(&s.planes, n, &local_planes);
  size_t out = 0;
  for (int p = 0; p < stride; ++p) {
    size_t j = FirstOfPlane(p, stride, phase);
    for (; j < covered; j += stride) planes[out++] = static_cast<char>(target[j] ^ base[j]);
    for (; j < n; j += stride) planes[out++] = target[j];  // past the base's end: XOR with zeros
  }
  const size_t bound = ZSTD_compressBound(n);
  char* frame = Buffer(&s.frame, bound, &local_frame);
  if (s.cctx == nullptr) s.cctx = ZSTD_createCCtx();
  if (s.cctx == nullptr) return Internal("zstd: cannot allocate a compression context");
  const size_t z = ZSTD_compressCCtx(s.cctx, frame, bound, planes, n, kDeltaZstdLevel);
  if (ZSTD_isError(z)) return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
  std::string delta(kDeltaHeaderBytes, '\0');
  std::memcpy(delta.data(), kMagic, 4);
  delta[4] = static_cast<char>(stride);
  delta[5] = static_cast<char>(phase);
  delta.append(frame, z);
  return delta;
}

Result<std::string> DecodeChunkDelta(std::string_view delta, std::string_view base, uint64_t chunk_size) {
  if (delta.size() < kDeltaHeaderBytes || std::memcmp(delta.data(), kMagic, 4) != 0) {
    return DataLoss("delta chunk does not start with the ECD1 header");
  }
  const int stride = static_cast<unsigned char>(delta[4]);
  const int phase = static_cast<unsigned char>(delta[5]);
  if (!ValidStride(stride) || phase >= stride || delta[6] != 0 || delta[7] != 0) {
    return DataLoss("delta chunk header is malformed (stride " + std::to_string(stride) + ", phase " +
                    std::to_string(phase) + ")");
  }
  const std::string_view frame = delta.substr(kDeltaHeaderBytes);
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content != chunk_size) {
    return DataLoss("delta chunk's zstd frame does not state a content size of " + std::to_string(chunk_size) +
                    " bytes");
  }
  const size_t frame_bytes = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(frame_bytes) || frame_bytes != frame.size()) {
    return DataLoss("delta chunk is not exactly one zstd frame");
  }
  Scratch& s = ThreadScratch();
  std::string local_planes;
  char* planes = Buffer(&s.planes, chunk_size, &local_planes);
  if (s.dctx == nullptr) s.dctx = ZSTD_createDCtx();
  if (s.dctx == nullptr) return Internal("zstd: cannot allocate a decompression context");
  const size_t got = ZSTD_decompressDCtx(s.dctx, planes, chunk_size, frame.data(), frame.size());
  if (ZSTD_isError(got) || got != chunk_size) {
    return DataLoss(std::string("delta chunk does not decompress: ") +
                    (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size"));
  }
  std::string chunk(chunk_size, '\0');
  const size_t covered = std::min<size_t>(chunk_size, base.size());
  size_t in = 0;
  for (int p = 0; p < stride; ++p) {
    size_t j = FirstOfPlane(p, stride, phase);
    for (; j < covered; j += stride) chunk[j] = static_cast<char>(planes[in++] ^ base[j]);
    for (; j < chunk_size; j += stride) chunk[j] = planes[in++];
  }
  return chunk;
}

PlaneLayout PlaneLayoutOf(const Manifest& m) {
  if (m.tensors.empty()) return {};
  std::map<int, uint64_t> bytes_by_size;
  uint64_t data_start = m.tensors.front().begin;
  for (const TensorEntry& t : m.tensors) {
    bytes_by_size[ElementBytes(t.dtype)] += t.end - t.begin;
    data_start = std::min(data_start, t.begin);
  }
  auto most = std::max_element(bytes_by_size.begin(), bytes_by_size.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
  return {most->first, data_start};
}

BaseBytes BaseBytes::Whole(std::string_view blob) {
  BaseBytes b;
  b.views_ = {blob};
  b.piece_bytes_ = std::max<uint64_t>(1, blob.size());
  b.size_ = blob.size();
  return b;
}

BaseBytes BaseBytes::Pieces(std::vector<std::shared_ptr<const std::string>> pieces, uint64_t piece_bytes) {
  BaseBytes b;
  b.piece_bytes_ = std::max<uint64_t>(1, piece_bytes);
  for (const auto& p : pieces) {
    b.views_.emplace_back(*p);
    b.size_ += p->size();
  }
  b.owned_ = std::move(pieces);
  return b;
}

std::string_view BaseBytes::Range(uint64_t begin, uint64_t length, std::string* scratch) const {
  if (begin >= size_ || length == 0) return {};
  const uint64_t end = std::min(size_, begin + length);
  const size_t first = begin / piece_bytes_, last = (end - 1) / piece_bytes_;
  if (first == last) return views_[first].substr(begin - first * piece_bytes_, end - begin);
  scratch->clear();
  scratch->reserve(end - begin);
  for (uint64_t at = begin; at < end;) {
    const size_t k = at / piece_bytes_;
    const std::string_view part = views_[k].substr(at - k * piece_bytes_, end - at);
    scratch->append(part);
    at += part.size();
  }
  return *scratch;
}

Result<std::vector<std::string>> AddDeltas(Manifest* m, const std::string& target, const BaseBytes& base,
                                           const std::string& base_sha256, int threads) {
  if (target.size() != m->total_bytes) {
    return InvalidArgument("AddDeltas: the target has " + std::to_string(target.size()) + " bytes, the manifest " +
                           std::to_string(m->total_bytes));
  }
  const PlaneLayout layout = PlaneLayoutOf(*m);
  std::vector<std::string> deltas(m->num_chunks());
  m->base_sha256 = base_sha256;
  m->delta_sha256.assign(m->num_chunks(), "");
  m->delta_bytes.assign(m->num_chunks(), 0);
  ECHELON_RETURN_IF_ERROR(ParallelFor(m->num_chunks(), threads, [&](size_t i) -> Status {
    const uint64_t offset = m->ChunkOffset(i);
    std::string scratch;
    const std::string_view base_part = base.Range(offset, m->ChunkSize(i), &scratch);
    const uint64_t stride = static_cast<uint64_t>(layout.stride);
    const int phase = static_cast<int>((offset + stride - layout.data_start % stride) % stride);
    ECHELON_ASSIGN_OR_RETURN(std::string d, EncodeChunkDelta(ChunkView(*m, target, i), base_part, layout.stride, phase));
    if (d.size() >= m->ChunkSize(i)) return Status::Ok();  // not smaller: sent whole only
    m->delta_sha256[i] = Sha256Hex(d);
    m->delta_bytes[i] = d.size();
    deltas[i] = std::move(d);
    return Status::Ok();
  }));
  return deltas;
}

Result<std::vector<std::string>> AddDeltas(Manifest* m, const std::string& target, const std::string& base,
                                           int threads) {
  return AddDeltas(m, target, BaseBytes::Whole(base), Sha256Hex(base), threads);
}

}  // namespace echelon::broadcast
