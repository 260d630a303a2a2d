// The tensor index of a safetensors blob: name -> dtype, shape, absolute byte range. Parsed
// from the header only (no LibTorch), so a receiver can map a tensor to the chunks holding it.
//
//   std::vector<TensorEntry> index;
//   if (ParseSafetensorsIndex(blob, &index).ok()) { ... }   // else: not safetensors
//
// Thread contract: free functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::broadcast {

struct TensorEntry {
  std::string name;
  std::string dtype;           // safetensors spelling: "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;          // absolute offsets in the blob: [begin, end)
  uint64_t end = 0;

  bool operator==(const TensorEntry& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape && begin == o.begin && end == o.end;
  }
};

// Entries sorted by name. InvalidArgument when `blob` is not a self-consistent safetensors
// file (short header, bad JSON, offsets past the end); a caller that only wants an optional
// index treats that as "no index".
Status ParseSafetensorsIndex(const std::string& blob, std::vector<TensorEntry>* out);

}  // namespace echelon::broadcast
