#include "echelon/net/auth.h"

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
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

bool NameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }

}  // namespace

bool ValidName(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), NameChar);
}

std::string SafeName(const std::string& asked) {
  std::string name = asked.substr(0, 64);
  for (char& c : name)
    if (!NameChar(c)) c = '_';
  return name.empty() ? "actor" : name;
}

Result<std::vector<std::string>> IssueWorkerTokens(const std::string& dir, int count, const std::string& prefix) {
  if (!ValidName(prefix + "-0")) return InvalidArgument("--prefix \"" + prefix + "\": a worker name is 1-64 letters, digits, '-', '_' or '.'");
  const std::string file = (std::filesystem::path(dir) / "tokens").string();
  std::string text;
  std::set<std::string> names;
  if (std::filesystem::exists(file)) {
    ECHELON_ASSIGN_OR_RETURN(TokenTable existing, TokenTable::Load(file));
    if (!existing.per_actor())
      return FailedPrecondition(file + " holds one shared token; per-worker tokens go in a file of their own");
    for (const std::string& n : existing.names()) names.insert(n);
    ECHELON_ASSIGN_OR_RETURN(text, ReadFile(file));
    if (!text.empty() && text.back() != '\n') text += '\n';
  } else {
    std::filesystem::create_directories(dir);
    text = "# NAME TOKEN, one line per worker: the learner's --token-file (delete a line, then SIGHUP the learner, to\n"
           "# revoke that worker). Each worker's own token is in NAME.token beside this file.\n";
  }
  int next = 0;  // after the highest PREFIX-N already issued
  for (const std::string& n : names)
    if (n.rfind(prefix + "-", 0) == 0 && n.size() > prefix.size() + 1 &&
        std::all_of(n.begin() + static_cast<std::ptrdiff_t>(prefix.size() + 1), n.end(),
                    [](char c) { return c >= '0' && c <= '9'; }) &&
        n.size() - prefix.size() - 1 < 9)
      next = std::max(next, std::stoi(n.substr(prefix.size() + 1)) + 1);
  std::vector<std::string> issued;
  for (int i = 0; i < count; ++i) {
    const std::string name = prefix + "-" + std::to_string(next + i);
    const std::string own = (std::filesystem::path(dir) / (name + ".token")).string();
    if (std::filesystem::exists(own)) return FailedPrecondition(own + " exists but " + file + " does not name " + name);
    const std::string token = RandomToken() + RandomToken();  // 256 bits
    ECHELON_RETURN_IF_ERROR(WriteFileAtomic(own, token + "\n", 0600));
    text += name + " " + token + "\n";
    issued.push_back(name);
  }
  ECHELON_RETURN_IF_ERROR(WriteFileAtomic(file, text, 0600));
  return issued;
}

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
