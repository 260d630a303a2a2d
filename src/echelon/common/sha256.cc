#include "echelon/common/sha256.h"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

namespace echelon {

std::string Sha256(std::string_view bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string Sha256Hex(std::string_view bytes) { return ToHex(Sha256(bytes)); }

std::string Sha256Hex(const std::vector<std::string_view>& parts) {
  Sha256Stream sha;
  for (std::string_view p : parts) sha.Update(p);
  return sha.Hex();  // empty on allocation failure: matches no digest
}

struct Sha256Stream::Ctx {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
  bool ok = false;
};

Sha256Stream::Sha256Stream() : ctx_(std::make_unique<Ctx>()) {
  ctx_->ok = ctx_->md && EVP_DigestInit_ex(ctx_->md.get(), EVP_sha256(), nullptr) == 1;
}
Sha256Stream::~Sha256Stream() = default;

void Sha256Stream::Update(std::string_view bytes) {
  ctx_->ok = ctx_->ok && EVP_DigestUpdate(ctx_->md.get(), bytes.data(), bytes.size()) == 1;
}

std::string Sha256Stream::Hex() {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  unsigned int n = 0;
  if (!(ctx_->ok && EVP_DigestFinal_ex(ctx_->md.get(), digest, &n) == 1 && n == sizeof(digest))) return std::string();
  ctx_->ok = false;
  return ToHex(std::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

Result<std::string> Sha256HexOfFile(const std::string& path, uint64_t* size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  Sha256Stream sha;
  std::string buffer(1 << 20, '\0');
  uint64_t total = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = in.gcount();
    total += static_cast<uint64_t>(n);
    sha.Update(std::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  if (in.bad()) return DataLoss("cannot read " + path);
  std::string hex = sha.Hex();
  if (hex.empty()) return Internal("SHA-256 of " + path + " failed");
  if (size != nullptr) *size = total;
  return hex;
}

std::string ToHex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

static int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool FromHex(std::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  out->clear();
  out->reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = HexValue(hex[i]), lo = HexValue(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

}  // namespace echelon
