#include "echelon/broadcast/delta.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <zstd.h>

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

}  // namespace

Result<std::string> EncodeChunkDelta(std::string_view target, std::string_view base, int stride, int phase) {
  if (!ValidStride(stride) || phase < 0 || phase >= stride) {
    return InvalidArgument("delta plane stride " + std::to_string(stride) + " / phase " + std::to_string(phase) +
                           " (stride must be 1, 2, 4 or 8, phase below it)");
  }
  const size_t n = target.size();
  std::string planes(n, '\0');
  size_t out = 0;
  for (int p = 0; p < stride; ++p) {
    for (size_t j = FirstOfPlane(p, stride, phase); j < n; j += stride) {
      const char b = j < base.size() ? base[j] : '\0';
      planes[out++] = static_cast<char>(target[j] ^ b);
    }
  }
  std::string delta(kDeltaHeaderBytes + ZSTD_compressBound(n), '\0');
  std::memcpy(delta.data(), kMagic, 4);
  delta[4] = static_cast<char>(stride);
  delta[5] = static_cast<char>(phase);
  const size_t z = ZSTD_compress(delta.data() + kDeltaHeaderBytes, delta.size() - kDeltaHeaderBytes, planes.data(),
                                 n, kDeltaZstdLevel);
  if (ZSTD_isError(z)) return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
  delta.resize(kDeltaHeaderBytes + z);
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
  std::string planes(chunk_size, '\0');
  const size_t got = ZSTD_decompress(planes.data(), planes.size(), frame.data(), frame.size());
  if (ZSTD_isError(got) || got != chunk_size) {
    return DataLoss(std::string("delta chunk does not decompress: ") +
                    (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size"));
  }
  std::string chunk(chunk_size, '\0');
  size_t in = 0;
  for (int p = 0; p < stride; ++p) {
    for (size_t j = FirstOfPlane(p, stride, phase); j < chunk_size; j += stride) {
      const char b = j < base.size() ? base[j] : '\0';
      chunk[j] = static_cast<char>(planes[in++] ^ b);
    }
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

Result<std::vector<std::string>> AddDeltas(Manifest* m, const std::string& target, const std::string& base) {
  if (target.size() != m->total_bytes) {
    return InvalidArgument("AddDeltas: the target has " + std::to_string(target.size()) + " bytes, the manifest " +
                           std::to_string(m->total_bytes));
  }
  const PlaneLayout layout = PlaneLayoutOf(*m);
  std::vector<std::string> deltas(m->num_chunks());
  m->base_sha256 = Sha256Hex(base);
  m->delta_sha256.assign(m->num_chunks(), "");
  m->delta_bytes.assign(m->num_chunks(), 0);
  for (size_t i = 0; i < m->num_chunks(); ++i) {
    const uint64_t offset = m->ChunkOffset(i);
    const std::string_view base_part =
        offset < base.size() ? std::string_view(base).substr(offset, m->ChunkSize(i)) : std::string_view();
    const uint64_t stride = static_cast<uint64_t>(layout.stride);
    const int phase = static_cast<int>((offset + stride - layout.data_start % stride) % stride);
    ECHELON_ASSIGN_OR_RETURN(std::string d, EncodeChunkDelta(ChunkView(*m, target, i), base_part, layout.stride, phase));
    if (d.size() >= m->ChunkSize(i)) continue;  // not smaller: sent whole only
    m->delta_sha256[i] = Sha256Hex(d);
    m->delta_bytes[i] = d.size();
    deltas[i] = std::move(d);
  }
  return deltas;
}

}  // namespace echelon::broadcast
