// TLS for the weight broadcast. The origin serves with the learner's certificate (actors
// already trust its CA: `echelon actor --tls-ca`); each peer makes itself a self-signed
// certificate at start (EC P-256, named kPeerTlsName), sends it in its Hello over that
// authenticated channel, and the origin hands it to every receiver in the Order that names
// the peer as sender: a receiver trusts exactly the certificate the origin vouched for. So
// every broadcast channel, chunk fetches between peers included, is encrypted and
// authenticated whenever the learner has TLS, with no certificate to provision per worker.
//
//   ECHELON_ASSIGN_OR_RETURN(TlsIdentity me, SelfSignedIdentity());
//   builder.AddListeningPort(addr, ServerCredentials(me), &port);
//   auto channel = grpc::CreateCustomChannel(addr, ChannelCredentials(peer_cert_pem), args);
//   SetPeerTargetName(&args);   // the name every peer certificate carries
//
// Thread contract: free functions; safe for concurrent use.
#pragma once

#include <memory>
#include <string>

#include "echelon/common/status.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace echelon::net {

// The DNS name in every peer's self-signed certificate (its subjectAltName).
inline constexpr char kPeerTlsName[] = "echelon-broadcast-peer";

struct TlsIdentity {
  std::string cert_pem;
  std::string key_pem;
  bool empty() const { return cert_pem.empty(); }
};

// A fresh EC P-256 key and a self-signed certificate for kPeerTlsName, valid 30 days.
Result<TlsIdentity> SelfSignedIdentity();
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsIdentity& identity);
// TLS trusting exactly `root_pem` (a CA or a pinned self-signed certificate).
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& root_pem);
// Checks the server's certificate against kPeerTlsName instead of the dialled address.
void SetPeerTargetName(grpc::ChannelArguments* args);

}  // namespace echelon::net
