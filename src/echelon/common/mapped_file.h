// MappedFile: a file's bytes, memory-mapped read-only. Pages are read from disk as they are
// touched and belong to the page cache, not to the process's private memory, so a large file
// can be parsed without a copy of it in RAM.
//
//   ECHELON_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open("runs/x/verifier/v12.safetensors"));
//   ECHELON_ASSIGN_OR_RETURN(SafetensorsFile t, ParseSafetensors(f.bytes(), f.path()));
//
// Thread contract: a move-only value; bytes() may be read from any thread while it lives.
#pragma once

#include <string>
#include <string_view>

#include "echelon/common/status.h"

namespace echelon {

class MappedFile {
 public:
  // Errors name the path (missing, unreadable, not a regular file).
  static Result<MappedFile> Open(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  void Release();

  std::string path_;
  const char* data_ = nullptr;  // null for an empty file
  size_t size_ = 0;
};

}  // namespace echelon
