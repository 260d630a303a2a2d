// SHA-256 of a byte string, as raw bytes or lowercase hex; chunks are named by the hex form.
//
//   std::string name = Sha256Hex(chunk_bytes);   // 64 hex characters
//
// Thread contract: free functions, no shared state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "echelon/common/status.h"

namespace echelon {

std::string Sha256(std::string_view bytes);     // 32 raw bytes
std::string Sha256Hex(std::string_view bytes);  // 64 lowercase hex characters
// Sha256Hex of the parts' concatenation, without concatenating them.
std::string Sha256Hex(const std::vector<std::string_view>& parts);
// SHA-256 of bytes given piece by piece (a file as it is written).
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(std::string_view bytes);
  // Lowercase hex of everything given (empty if the digest failed); once.
  std::string Hex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Sha256Hex of a file's bytes, read in pieces (never the whole file in memory); `size` (when
// given) receives its length. Errors name the file.
Result<std::string> Sha256HexOfFile(const std::string& path, uint64_t* size = nullptr);
std::string ToHex(std::string_view bytes);
// Returns false on odd length or a non-hex character.
bool FromHex(std::string_view hex, std::string* out);

}  // namespace echelon
