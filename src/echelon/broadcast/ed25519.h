// Ed25519 keys for signing snapshot manifests (OpenSSL EVP_PKEY_ED25519), stored as PEM.
//
//   Result<SigningKey> key = SigningKey::Generate();
//   ECHELON_RETURN_IF_ERROR(key->SavePem("origin.key"));            // private, mode 0600
//   ECHELON_RETURN_IF_ERROR(key->public_key().SavePem("origin.pub"));
//   std::string sig = key->Sign(message).value();
//   Result<VerifyKey> pub = VerifyKey::LoadPem("origin.pub");
//   Status st = pub->Verify(message, sig);                          // DataLoss on mismatch
//
// The origin holds the SigningKey; peers hold only the VerifyKey. key_id() is the first 16
// hex characters of SHA-256(raw public key), so errors can name which key signed what.
//
// Thread contract: an immutable key may be used from many threads at once (each call makes
// its own EVP_MD_CTX). Copies share the underlying EVP_PKEY by reference count.
#pragma once

#include <memory>
#include <string>

#include "echelon/common/status.h"

typedef struct evp_pkey_st EVP_PKEY;

namespace echelon::broadcast {

inline constexpr size_t kEd25519SignatureBytes = 64;

class VerifyKey {
 public:
  static Result<VerifyKey> LoadPem(const std::string& path);
  static Result<VerifyKey> FromPem(const std::string& pem, const std::string& where);
  static Result<VerifyKey> FromRaw(const std::string& raw32);

  Status SavePem(const std::string& path) const;
  std::string ToPem() const;
  std::string raw() const;     // 32 bytes
  std::string key_id() const;  // 16 hex characters
  // Ok when `signature` is a valid Ed25519 signature of `message` by this key.
  Status Verify(const std::string& message, const std::string& signature) const;

 private:
  explicit VerifyKey(std::shared_ptr<EVP_PKEY> pkey) : pkey_(std::move(pkey)) {}
  std::shared_ptr<EVP_PKEY> pkey_;
  friend class SigningKey;
};

class SigningKey {
 public:
  static Result<SigningKey> Generate();
  static Result<SigningKey> LoadPem(const std::string& path);
  static Result<SigningKey> FromPem(const std::string& pem, const std::string& where);

  // Written atomically with mode 0600: it is a secret.
  Status SavePem(const std::string& path) const;
  std::string ToPem() const;
  VerifyKey public_key() const;
  Result<std::string> Sign(const std::string& message) const;

 private:
  explicit SigningKey(std::shared_ptr<EVP_PKEY> pkey) : pkey_(std::move(pkey)) {}
  std::shared_ptr<EVP_PKEY> pkey_;
};

}  // namespace echelon::broadcast
