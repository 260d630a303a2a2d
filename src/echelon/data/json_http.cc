#include "echelon/data/json_http.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

namespace echelon::data {
namespace {

constexpr int kAttempts = 3;
constexpr double kRetrySeconds = 0.5;  // doubled after each failed attempt

}  // namespace

std::string Clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

Result<JsonHttp> JsonHttp::Create(const std::string& url, double timeout_seconds, const std::string& what) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    return InvalidArgument(what + " URL \"" + url + "\": expected http://HOST:PORT/PATH");
  const size_t slash = url.find('/', scheme.size());
  const std::string root = slash == std::string::npos ? url : url.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : url.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (root.size() == scheme.size()) return InvalidArgument(what + " URL \"" + url + "\": no host");
  if (!httplib::Client(root).is_valid()) return InvalidArgument(what + " URL \"" + url + "\": not a valid URL");
  return JsonHttp(url, root, path, timeout_seconds, what);
}

Result<nlohmann::json> JsonHttp::Post(const std::string& subpath, const nlohmann::json& body) const {
  const std::string path = (path_ + subpath).empty() ? "/" : path_ + subpath;
  const std::string where = what_ + " POST " + root_ + path;
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  httplib::Client client(root_);
  const auto limit = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(timeout_seconds_));
  client.set_connection_timeout(limit);
  client.set_read_timeout(limit);
  client.set_write_timeout(limit);
  double backoff = kRetrySeconds;
  httplib::Result r = client.Post(path, text, "application/json");
  for (int attempt = 2; attempt <= kAttempts && (!r || r->status >= 500); ++attempt) {
    spdlog::warn("{}: {} (attempt {} of {}; retrying in {} s)", where,
                 r ? "HTTP " + std::to_string(r->status) : httplib::to_string(r.error()), attempt - 1, kAttempts, backoff);
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff *= 2;
    r = client.Post(path, text, "application/json");
  }
  if (!r) return Unavailable(where + ": " + httplib::to_string(r.error()) + " after " + std::to_string(kAttempts) + " attempts");
  if (r->status != 200) return Unavailable(where + ": HTTP " + std::to_string(r->status) + " " + Clip(r->body, 300));
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(where + ": the answer is not JSON: " + Clip(r->body, 300));
  return j;
}

}  // namespace echelon::data
