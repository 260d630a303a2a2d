#include "echelon/broadcast/ed25519.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "echelon/common/sha256.h"
#include "echelon/common/fs.h"

namespace echelon::broadcast {
namespace {

std::string OpenSslError() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

std::shared_ptr<EVP_PKEY> Own(EVP_PKEY* p) { return std::shared_ptr<EVP_PKEY>(p, EVP_PKEY_free); }

using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

std::string BioContents(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

Status CheckEd25519(EVP_PKEY* p, const std::string& where) {
  if (EVP_PKEY_get_id(p) != EVP_PKEY_ED25519) {
    return InvalidArgument(where + ": key is not Ed25519 (generate one with SigningKey::Generate "
                           "or `openssl genpkey -algorithm ed25519`)");
  }
  return Status::Ok();
}

}  // namespace

// ---- VerifyKey ----

Result<VerifyKey> VerifyKey::FromPem(const std::string& pem, const std::string& where) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  EVP_PKEY* p = PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr);
  if (p == nullptr) {
    return InvalidArgument(where + ": not a PEM public key (expected '-----BEGIN PUBLIC KEY-----'): " +
                           OpenSslError());
  }
  auto owned = Own(p);
  ECHELON_RETURN_IF_ERROR(CheckEd25519(p, where));
  return VerifyKey(owned);
}

Result<VerifyKey> VerifyKey::LoadPem(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string pem, ReadFile(path));
  return FromPem(pem, path);
}

Result<VerifyKey> VerifyKey::FromRaw(const std::string& raw32) {
  if (raw32.size() != 32) return InvalidArgument("Ed25519 public key must be 32 bytes, got " +
                                                 std::to_string(raw32.size()));
  EVP_PKEY* p = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                            reinterpret_cast<const unsigned char*>(raw32.data()), 32);
  if (p == nullptr) return InvalidArgument("bad Ed25519 public key: " + OpenSslError());
  return VerifyKey(Own(p));
}

std::string VerifyKey::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PUBKEY(bio.get(), pkey_.get());
  return BioContents(bio.get());
}

Status VerifyKey::SavePem(const std::string& path) const {
  return WriteFileAtomic(path, ToPem()).WithContext("saving public key");
}

std::string VerifyKey::raw() const {
  unsigned char buf[32];
  size_t len = sizeof(buf);
  if (EVP_PKEY_get_raw_public_key(pkey_.get(), buf, &len) != 1) return std::string();
  return std::string(reinterpret_cast<const char*>(buf), len);
}

std::string VerifyKey::key_id() const { return Sha256Hex(raw()).substr(0, 16); }

Status VerifyKey::Verify(const std::string& message, const std::string& signature) const {
  if (signature.size() != kEd25519SignatureBytes) {
    return DataLoss("signature must be 64 bytes, got " + std::to_string(signature.size()));
  }
  MdCtxPtr ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) != 1) {
    return Internal("EVP_DigestVerifyInit: " + OpenSslError());
  }
  int rc = EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                            signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                            message.size());
  if (rc != 1) {
    ERR_clear_error();
    return DataLoss("Ed25519 signature does not verify under key " + key_id());
  }
  return Status::Ok();
}

// ---- SigningKey ----

Result<SigningKey> SigningKey::Generate() {
  EVP_PKEY* p = nullptr;
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), EVP_PKEY_CTX_free);
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &p) != 1) {
    return Internal("Ed25519 key generation failed: " + OpenSslError());
  }
  return SigningKey(Own(p));
}

Result<SigningKey> SigningKey::FromPem(const std::string& pem, const std::string& where) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  EVP_PKEY* p = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (p == nullptr) {
    return InvalidArgument(where + ": not an unencrypted PEM private key (expected "
                           "'-----BEGIN PRIVATE KEY-----'): " + OpenSslError());
  }
  auto owned = Own(p);
  ECHELON_RETURN_IF_ERROR(CheckEd25519(p, where));
  return SigningKey(owned);
}

Result<SigningKey> SigningKey::LoadPem(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string pem, ReadFile(path));
  return FromPem(pem, path);
}

std::string SigningKey::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PrivateKey(bio.get(), pkey_.get(), nullptr, nullptr, 0, nullptr, nullptr);
  return BioContents(bio.get());
}

Status SigningKey::SavePem(const std::string& path) const {
  // Not WriteFileAtomic: the secret must never exist with a world-readable mode, and umask
  // is process-wide (racy with other threads), so the temporary is opened 0600 here.
  const std::string tmp = path + ".tmp";
  const std::string pem = ToPem();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("saving private key: cannot create " + tmp + ": " + std::strerror(errno));
  bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, pem.data(), pem.size()) == static_cast<ssize_t>(pem.size()) &&
            ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return Internal("saving private key to " + path + " failed: " + err);
  }
  return Status::Ok();
}

VerifyKey SigningKey::public_key() const {
  // A separate public-only EVP_PKEY, so a VerifyKey never carries the secret.
  unsigned char buf[32];
  size_t len = sizeof(buf);
  EVP_PKEY_get_raw_public_key(pkey_.get(), buf, &len);
  return VerifyKey(Own(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, buf, len)));
}

Result<std::string> SigningKey::Sign(const std::string& message) const {
  MdCtxPtr ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) != 1) {
    return Internal("EVP_DigestSignInit: " + OpenSslError());
  }
  unsigned char sig[kEd25519SignatureBytes];
  size_t len = sizeof(sig);
  if (EVP_DigestSign(ctx.get(), sig, &len, reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1) {
    return Internal("Ed25519 signing failed: " + OpenSslError());
  }
  return std::string(reinterpret_cast<const char*>(sig), len);
}

}  // namespace echelon::broadcast
