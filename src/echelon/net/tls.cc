#include "echelon/net/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace echelon::net {
namespace {

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

Result<TlsIdentity> SelfSignedIdentity() {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  if (!key) return Internal("cannot make an EC P-256 key for the broadcast's TLS");
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  unsigned char serial[16];
  if (!cert || RAND_bytes(serial, sizeof serial) != 1) return Internal("cannot make a TLS certificate");
  serial[0] &= 0x7f;  // a positive serial number
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(serial, sizeof serial, nullptr), BN_free);
  bool ok = X509_set_version(cert.get(), 2) == 1 && bn && BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get()));
  ok = ok && X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) != nullptr &&
       X509_gmtime_adj(X509_getm_notAfter(cert.get()), 30L * 24 * 3600) != nullptr &&
       X509_set_pubkey(cert.get(), key.get()) == 1;
  X509_NAME* name = X509_get_subject_name(cert.get());
  ok = ok && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(kPeerTlsName),
                                        -1, -1, 0) == 1 &&
       X509_set_issuer_name(cert.get(), name) == 1;
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  const std::string san = std::string("DNS:") + kPeerTlsName;
  for (const auto& [nid, value] : {std::pair<int, std::string>{NID_subject_alt_name, san},
                                   {NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    ok = ok && ext != nullptr && X509_add_ext(cert.get(), ext, -1) == 1;
    if (ext) X509_EXTENSION_free(ext);
  }
  ok = ok && X509_sign(cert.get(), key.get(), EVP_sha256()) > 0;
  if (!ok) return Internal("cannot sign the broadcast's self-signed TLS certificate");
  std::unique_ptr<BIO, decltype(&BIO_free)> cert_bio(BIO_new(BIO_s_mem()), BIO_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!cert_bio || !key_bio || PEM_write_bio_X509(cert_bio.get(), cert.get()) != 1 ||
      PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return Internal("cannot write the broadcast's TLS certificate as PEM");
  return TlsIdentity{BioText(cert_bio.get()), BioText(key_bio.get())};
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsIdentity& identity) {
  if (identity.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({identity.key_pem, identity.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& root_pem) {
  if (root_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = root_pem;
  return grpc::SslCredentials(ssl);
}

void SetPeerTargetName(grpc::ChannelArguments* args) { args->SetSslTargetNameOverride(kPeerTlsName); }

}  // namespace echelon::net
