// Reader and writer of the safetensors format: an 8-byte little-endian header length N, N
// bytes of JSON header ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
// {str: str}}), then the raw little-endian tensor bytes.
//
// The reader refuses anything that is not whole and self-consistent: a short file, a header
// length past the end, bad JSON, an unknown dtype, offsets that overlap, leave gaps, run past
// the data, or disagree with dtype x shape. Errors name the file and the tensor.
//
// Thread contract: free functions over values; no shared state.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "echelon/common/status.h"

namespace echelon::model {

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;        // contiguous CPU tensors
  std::map<std::string, std::string> metadata;      // "__metadata__"
};

// Parses bytes already in memory; `where` names the source in errors. BF16 and F16 tensors
// keep their dtype (the caller converts).
Result<SafetensorsFile> ParseSafetensors(std::string_view bytes, const std::string& where);
// The same without copying: each tensor is a view of `bytes` where its data is aligned to its
// element size (a copy otherwise, and for BOOL). The views are valid while `bytes` lives and
// must never be written (the bytes may be a read-only mapping or another owner's buffer).
Result<SafetensorsFile> ViewSafetensors(std::string_view bytes, const std::string& where);
Result<SafetensorsFile> ReadSafetensors(const std::string& path);
// The same over a private read-only mapping of the file: each tensor is a view of it (a copy
// where misaligned, and for BOOL), whose pages are read from the file when first touched and
// count in the process's resident set until released; the mapping lives while any of its
// tensors does. Never write these tensors.
Result<SafetensorsFile> MapSafetensors(const std::string& path);
// Drops the resident pages of a tensor MapSafetensors gave (the whole pages inside its bytes;
// they are read again if touched); nothing for any other tensor. A reader of a mapped file
// calls it once it is done with a tensor, so the file is never resident whole.
void ReleaseMappedPages(const at::Tensor& t);

// One tensor of a file written as it is produced: its name, dtype and shape, in data order.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
// The 8-byte length and the header of a file whose tensors' bytes follow in `entries`' order
// (the reader takes any order that tiles the data).
Result<std::string> SafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata = {});

// A safetensors file as its parts, for writing and hashing without one whole-file string: the
// length-prefixed header, then each tensor's bytes. A tensor already on the CPU, contiguous, is
// the caller's own (no copy; it must not change until the parts are written); others are
// copied, one CPU copy each.
struct SafetensorsParts {
  std::string header;
  std::vector<at::Tensor> tensors;
  std::vector<std::string_view> Views() const;  // header, then each tensor's bytes
  uint64_t size() const;
};
Result<SafetensorsParts> SafetensorsLayout(const std::map<std::string, at::Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// Serialises tensors (F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL), names sorted.
Result<std::string> SerializeSafetensors(const std::map<std::string, at::Tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});
// Writes atomically (temporary name, fsync, rename), from the tensors' own memory.
Status WriteSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace echelon::model
