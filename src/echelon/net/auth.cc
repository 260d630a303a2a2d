#include "echelon/net/auth.h"

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <cctype>
#include <iomanip>
#include <random>
#include <set>
#include <sstream>

#include "echelon/common/fs.h"
#include "echelon/common/sha256.h"

namespace echelon::net {

std::optional<std::string> BearerToken(const grpc::ServerContext& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  const std::string got(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  if (got.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  return got.substr(prefix.size());
}

namespace {

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  return true;
}

}  // namespace

TokenTable TokenTable::Shared(const std::string& token) {
  TokenTable t;
  if (!token.empty()) t.by_digest_[Sha256(token)] = "";
  return t;
}

Result<TokenTable> TokenTable::Load(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  TokenTable t;
  std::set<std::string> names;
  bool shared = false;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = path + ":" + std::to_string(number) + ": ";
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.empty()) continue;
    if (f.size() > 2) return InvalidArgument(where + "expected \"NAME TOKEN\" (or the file's only token), got " +
                                             std::to_string(f.size()) + " fields");
    const std::string& token = f.back();
    const std::string name = f.size() == 2 ? f[0] : "";
    if (token.size() < kMinTokenChars)
      return InvalidArgument(where + "token shorter than " + std::to_string(kMinTokenChars) +
                             " characters (make one with `openssl rand -hex 16`)");
    if (f.size() == 2 && !ValidName(name))
      return InvalidArgument(where + "worker name \"" + name + "\" must be 1-64 letters, digits, '-', '_' or '.'");
    if (f.size() == 2 && !names.insert(name).second) return InvalidArgument(where + "worker \"" + name + "\" listed twice");
    if (!t.by_digest_.emplace(Sha256(token), name).second) return InvalidArgument(where + "token listed twice");
    shared = shared || f.size() == 1;
  }
  if (t.by_digest_.empty()) return InvalidArgument(path + ": no token");
  if (shared && t.by_digest_.size() > 1)
    return InvalidArgument(path + ": a bare token is only allowed as the file's only line; name each worker's token as \"NAME TOKEN\"");
  return t;
}

std::optional<std::string> TokenTable::Identify(const grpc::ServerContext& ctx) const {
  if (off()) return std::string();
  std::optional<std::string> token = BearerToken(ctx);
  if (!token) return std::nullopt;
  auto it = by_digest_.find(Sha256(*token));
  if (it == by_digest_.end()) return std::nullopt;
  return it->second;
}

bool TokenTable::per_actor() const { return !by_digest_.empty() && !by_digest_.begin()->second.empty(); }

std::vector<std::string> TokenTable::names() const {
  std::vector<std::string> out;
  for (const auto& [digest, name] : by_digest_)
    if (!name.empty()) out.push_back(name);
  return out;
}

Result<std::string> LoadToken(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const size_t begin = text.find_first_not_of(" \t\r\n");
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) return InvalidArgument("token file " + path + " is empty");
  return text.substr(begin, end - begin + 1);
}

bool TokenMatches(const grpc::ServerContext& ctx, const std::string& token) {
  if (token.empty()) return true;
  std::optional<std::string> got = BearerToken(ctx);
  if (!got || got->size() != token.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < got->size(); ++i) diff |= static_cast<unsigned char>((*got)[i] ^ token[i]);
  return diff == 0;
}

void AttachToken(grpc::ClientContext& ctx, const std::string& token) {
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
}

std::string RandomToken() {
  std::random_device rd;
  std::ostringstream ss;
  for (int i = 0; i < 4; ++i) ss << std::hex << std::setw(8) << std::setfill('0') << rd();
  return ss.str();
}

}  // namespace echelon::net
