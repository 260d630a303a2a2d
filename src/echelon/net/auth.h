// Bearer-token authentication: every RPC carries "authorization: Bearer <token>". The learner
// looks the token up in its TokenTable (by SHA-256, so the lookup's timing reveals nothing
// about the token) and refuses anything else with UNAUTHENTICATED.
//
// A token file holds either one token every actor presents (shared), or one line
// "NAME TOKEN" per worker: a worker's name is then its token's, so its leases, refusals and
// quarantine follow the worker whatever name it claims, and deleting its line (then SIGHUP to
// the learner) revokes it. '#' starts a comment; a token has at least kMinTokenChars
// characters (`openssl rand -hex 16` makes one).
//
//   ECHELON_ASSIGN_OR_RETURN(TokenTable tokens, TokenTable::Load("secrets/actors"));
//   std::optional<std::string> who = tokens.Identify(ctx);   // nullopt: refuse
//
// Thread contract: free functions are safe for concurrent use; a TokenTable is immutable
// after Load (replace it whole to reload).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace grpc {
class ServerContext;
class ClientContext;
}  // namespace grpc

namespace echelon::net {

inline constexpr size_t kMinTokenChars = 16;

class TokenTable {
 public:
  // Authentication off: every call is let in (tests, and runs with --insecure).
  TokenTable() = default;
  static TokenTable Shared(const std::string& token);
  // Errors name the file and line (a malformed line, a short or repeated token or name).
  static Result<TokenTable> Load(const std::string& path);

  // Whose token the call carries: the worker's name for a per-worker token, "" for the shared
  // token (or when authentication is off); nullopt when it carries no known token.
  std::optional<std::string> Identify(const grpc::ServerContext& ctx) const;
  bool off() const { return by_digest_.empty(); }
  bool per_actor() const;
  // The names of the per-worker tokens.
  std::vector<std::string> names() const;

 private:
  std::map<std::string, std::string> by_digest_;  // SHA-256 of a token -> its name ("" shared)
};

// Reads an actor's token file (surrounding whitespace trimmed); an empty token is an error.
Result<std::string> LoadToken(const std::string& path);
// The call's "authorization: Bearer <token>", if it carries one.
std::optional<std::string> BearerToken(const grpc::ServerContext& ctx);
// True when the call's metadata carries exactly this bearer token. An empty expected token
// means authentication is off.
bool TokenMatches(const grpc::ServerContext& ctx, const std::string& token);
void AttachToken(grpc::ClientContext& ctx, const std::string& token);
// A worker name: 1-64 letters, digits, '-', '_' or '.'.
bool ValidName(const std::string& name);
// The name an actor asked for, made one: at most 64 characters, each outside ValidName's '_'
// (a '#' would let "alice#x" count as alice: sched::WorkerName cuts an actor id at its first
// '#'); "actor" for an empty one.
std::string SafeName(const std::string& asked);

// `echelon tokens`: `count` new workers PREFIX-N (N after the highest already issued), each with
// a random 256-bit token, added to DIR/tokens (the learner's --token-file, created when absent)
// and written to DIR/PREFIX-N.token (that worker's --token-file); both owner-only. Their names.
Result<std::vector<std::string>> IssueWorkerTokens(const std::string& dir, int count, const std::string& prefix);

// 32 hex characters (128 bits) from the system's random source: tokens and identifiers that
// must not be guessed.
std::string RandomToken();

}  // namespace echelon::net
