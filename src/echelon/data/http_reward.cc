#include "echelon/data/http_reward.h"

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <thread>

namespace echelon::data {
namespace {

using nlohmann::json;

constexpr int kAttempts = 3;
constexpr double kRetrySeconds = 0.5;  // doubled after each failed attempt

std::string Clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

}  // namespace

HttpReward::HttpReward(std::string url, std::string path, std::unique_ptr<httplib::Client> client)
    : url_(std::move(url)), path_(std::move(path)), client_(std::move(client)) {}

HttpReward::~HttpReward() = default;

Result<std::unique_ptr<HttpReward>> HttpReward::Create(const std::string& url, double timeout_seconds) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    return InvalidArgument("reward_url \"" + url + "\": expected http://HOST:PORT/PATH");
  const size_t slash = url.find('/', scheme.size());
  const std::string root = slash == std::string::npos ? url : url.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : url.substr(slash);
  if (root.size() == scheme.size()) return InvalidArgument("reward_url \"" + url + "\": no host");
  auto client = std::make_unique<httplib::Client>(root);
  if (!client->is_valid()) return InvalidArgument("reward_url \"" + url + "\": not a valid URL");
  const auto limit = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(timeout_seconds));
  client->set_connection_timeout(limit);
  client->set_read_timeout(limit);
  client->set_write_timeout(limit);
  return std::unique_ptr<HttpReward>(new HttpReward(url, path, std::move(client)));
}

Result<std::vector<ExternalScore>> HttpReward::Score(const std::vector<RewardSample>& samples) {
  json request = {{"samples", json::array()}};
  for (const RewardSample& s : samples) {
    const json extra = json::parse(s.extra_info_json, nullptr, /*allow_exceptions=*/false);
    request["samples"].push_back({{"data_source", s.data_source},
                                  {"solution_str", s.solution_str},
                                  {"ground_truth", s.ground_truth},
                                  {"extra_info", extra.is_discarded() ? json() : extra}});
  }
  const std::string body = request.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string where = "reward service POST " + url_;
  std::lock_guard<std::mutex> lock(mu_);
  double backoff = kRetrySeconds;
  httplib::Result r = client_->Post(path_, body, "application/json");
  for (int attempt = 2; attempt <= kAttempts && (!r || r->status >= 500); ++attempt) {
    spdlog::warn("{}: {} (attempt {} of {}; retrying in {} s)", where,
                 r ? "HTTP " + std::to_string(r->status) : httplib::to_string(r.error()), attempt - 1, kAttempts, backoff);
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff *= 2;
    r = client_->Post(path_, body, "application/json");
  }
  if (!r) return Unavailable(where + ": " + httplib::to_string(r.error()) + " after " + std::to_string(kAttempts) + " attempts");
  if (r->status != 200) return Unavailable(where + ": HTTP " + std::to_string(r->status) + " " + Clip(r->body, 300));
  const json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("scores") || !j["scores"].is_array() || j["scores"].size() != samples.size())
    return InvalidArgument(where + ": expected {\"scores\": [...]} with " + std::to_string(samples.size()) +
                           " entries, got " + Clip(r->body, 300));
  std::vector<ExternalScore> out(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const json& v = j["scores"][i];
    const json& score = v.is_object() && v.contains("score") ? v["score"] : v;
    if (!score.is_number() || !std::isfinite(score.get<double>()))
      return InvalidArgument(where + ": scores[" + std::to_string(i) + "] is " + Clip(v.dump(), 100) +
                             ", not a finite number (or {\"score\": number, ...})");
    out[i].score = score.get<double>();
    if (!v.is_object()) continue;
    for (const auto& [k, x] : v.items()) {
      if (k == "score") continue;
      if (!x.is_number() || !std::isfinite(x.get<double>()))
        return InvalidArgument(where + ": scores[" + std::to_string(i) + "]." + k + " is " + Clip(x.dump(), 100) +
                               ": the other keys must be finite numbers (they become metrics)");
      out[i].extras[k] = x.get<double>();
    }
  }
  return out;
}

}  // namespace echelon::data
