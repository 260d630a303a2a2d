// SHA-256 of a byte string, as raw bytes or lowercase hex; chunks are named by the hex form.
//
//   std::string name = Sha256Hex(chunk_bytes);   // 64 hex characters
//
// Thread contract: free functions, no shared state.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace echelon {

std::string Sha256(std::string_view bytes);     // 32 raw bytes
std::string Sha256Hex(std::string_view bytes);  // 64 lowercase hex characters
// Sha256Hex of the parts' concatenation, without concatenating them.
std::string Sha256Hex(const std::vector<std::string_view>& parts);
std::string ToHex(std::string_view bytes);
// Returns false on odd length or a non-hex character.
bool FromHex(std::string_view hex, std::string* out);

}  // namespace echelon
