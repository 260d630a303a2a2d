#include "echelon/net/auth.h"

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include "echelon/common/fs.h"

namespace echelon::net {

Result<std::string> LoadToken(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const size_t begin = text.find_first_not_of(" \t\r\n");
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) return InvalidArgument("token file " + path + " is empty");
  return text.substr(begin, end - begin + 1);
}

bool TokenMatches(const grpc::ServerContext& ctx, const std::string& token) {
  if (token.empty()) return true;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return false;
  const std::string got(it->second.data(), it->second.size());
  const std::string want = "Bearer " + token;
  if (got.size() != want.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff |= static_cast<unsigned char>(got[i] ^ want[i]);
  return diff == 0;
}

void AttachToken(grpc::ClientContext& ctx, const std::string& token) {
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
}

}  // namespace echelon::net
