#include "echelon/data/json_http.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
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

Result<nlohmann::json> JsonHttp::Post(const std::string& subpath, const nlohmann::json& body,
                                      double budget_seconds) const {
  const std::string path = (path_ + subpath).empty() ? "/" : path_ + subpath;
  const std::string where = what_ + " POST " + root_ + path;
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  using SteadyClock = std::chrono::steady_clock;
  const SteadyClock::time_point start = SteadyClock::now();
  // Seconds the next attempt may take: the time limit, or what is left of the budget.
  const auto allowed = [&] {
    if (budget_seconds <= 0) return timeout_seconds_;
    return std::min(timeout_seconds_, budget_seconds - std::chrono::duration<double>(SteadyClock::now() - start).count());
  };
  const auto spent = [&] {
    return ResourceExhausted(where + ": the reward budget of " + std::to_string(budget_seconds) + " s is spent");
  };
  httplib::Client client(root_);
  const auto attempt_post = [&] {
    const auto limit = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(allowed()));
    client.set_connection_timeout(limit);
    client.set_read_timeout(limit);
    client.set_write_timeout(limit);
    return client.Post(path, text, "application/json");
  };
  if (budget_seconds > 0 && allowed() <= 0) return spent();
  double backoff = kRetrySeconds;
  httplib::Result r = attempt_post();
  for (int attempt = 2; attempt <= kAttempts && (!r || r->status >= 500); ++attempt) {
    if (budget_seconds > 0 && allowed() <= backoff) return spent();
    spdlog::warn("{}: {} (attempt {} of {}; retrying in {} s)", where,
                 r ? "HTTP " + std::to_string(r->status) : httplib::to_string(r.error()), attempt - 1, kAttempts, backoff);
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff *= 2;
    r = attempt_post();
  }
  if (!r && budget_seconds > 0 && allowed() <= 0) return spent();
  if (!r) return Unavailable(where + ": " + httplib::to_string(r.error()) + " after " + std::to_string(kAttempts) + " attempts");
  if (r->status != 200) return Unavailable(where + ": HTTP " + std::to_string(r->status) + " " + Clip(r->body, 300));
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(where + ": the answer is not JSON: " + Clip(r->body, 300));
  return j;
}

}  // namespace echelon::data
