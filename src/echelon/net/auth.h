// Bearer-token authentication: every RPC carries "authorization: Bearer <token>"; the learner
// compares it in constant time and refuses anything else with UNAUTHENTICATED.
//
//   ECHELON_ASSIGN_OR_RETURN(std::string token, LoadToken("secrets/token"));
//   if (!TokenMatches(ctx, token)) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, ...);
//
// Thread contract: free functions; safe for concurrent use.
#pragma once

#include <string>

#include "echelon/common/status.h"

namespace grpc {
class ServerContext;
class ClientContext;
}  // namespace grpc

namespace echelon::net {

// Reads a token file (surrounding whitespace trimmed); an empty token is an error.
Result<std::string> LoadToken(const std::string& path);
// True when the call's metadata carries exactly this bearer token. An empty expected token
// means authentication is off (only for tests and loopback runs that never leave the host).
bool TokenMatches(const grpc::ServerContext& ctx, const std::string& token);
void AttachToken(grpc::ClientContext& ctx, const std::string& token);

}  // namespace echelon::net
