#include "echelon/common/run_secret.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "echelon/common/sha256.h"

namespace echelon {

Result<RunSecret> RunSecret::Random() {
  RunSecret s;
  if (RAND_bytes(s.key_.data(), static_cast<int>(s.key_.size())) != 1)
    return Internal("the OS's random generator gave no bytes for the run's secret");
  return s;
}

RunSecret RunSecret::FromSeed(uint64_t seed) {
  RunSecret s;
  const std::string h = Sha256("echelon run secret of seed " + std::to_string(seed));
  std::memcpy(s.key_.data(), h.data(), s.key_.size());
  return s;
}

Result<RunSecret> RunSecret::FromHex(std::string_view hex, const std::string& where) {
  std::string bytes;
  if (hex.size() != 64 || !echelon::FromHex(hex, &bytes))
    return InvalidArgument(where + ": a run secret is 64 hex characters, got " + std::to_string(hex.size()) +
                           " characters" + (hex.size() == 64 ? " that are not all hex digits" : ""));
  RunSecret s;
  std::memcpy(s.key_.data(), bytes.data(), s.key_.size());
  return s;
}

std::string RunSecret::Hex() const {
  return ToHex(std::string_view(reinterpret_cast<const char*>(key_.data()), key_.size()));
}

uint64_t RunSecret::Draw(std::string_view purpose, uint64_t index) const {
  std::string message(purpose);
  message.push_back('\0');  // "ab" + index and "a" + "b..." never collide
  for (int i = 0; i < 8; ++i) message.push_back(static_cast<char>((index >> (8 * i)) & 0xFF));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), mac, &len);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(mac[i]) << (8 * i);
  return v;
}

}  // namespace echelon
