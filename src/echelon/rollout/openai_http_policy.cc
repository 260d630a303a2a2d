#include "echelon/rollout/openai_http_policy.h"

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

namespace echelon::rollout {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kAttempts = 3;  // transport failures (connection refused, reset) are retried this often
constexpr double kRetrySeconds = 1.0;

// "http://h:p/v1/" -> {"http://h:p", "/v1"}.
std::pair<std::string, std::string> SplitUrl(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  std::string root = path == std::string::npos ? url : url.substr(0, path);
  std::string prefix = path == std::string::npos ? "" : url.substr(path);
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) prefix.resize(prefix.size() - 3);
  return {root, prefix};
}

std::string ErrorText(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
    return j["error"]["message"].dump();
  if (j.is_object() && j.contains("message")) return j["message"].dump();
  return body.substr(0, 300);
}

Status WriteBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return Internal("cannot write " + path.string());
  return Status::Ok();
}

}  // namespace

struct OpenAiHttpPolicy::Http {
  explicit Http(const std::string& root) : client(root) {}
  httplib::Client client;
  std::string root;
  std::string model;  // resolved model name
};

OpenAiHttpPolicy::OpenAiHttpPolicy(OpenAiHttpOptions options, PromptEncoder encode, TokenDecoder decode,
                                   model::SamplingParams params)
    : options_(std::move(options)), encode_(std::move(encode)), decode_(std::move(decode)), params_(params) {
  auto [root, prefix] = SplitUrl(options_.url);
  base_path_ = prefix;
  http_ = std::make_unique<Http>(root);
  http_->root = root;
  const auto secs = std::chrono::duration<double>(options_.timeout_seconds);
  http_->client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
  http_->client.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
  http_->client.set_connection_timeout(std::chrono::seconds(10));
  if (!options_.api_key.empty()) http_->client.set_bearer_token_auth(options_.api_key.c_str());
  http_->model = options_.model;
}

OpenAiHttpPolicy::~OpenAiHttpPolicy() = default;

Result<std::string> OpenAiHttpPolicy::ModelName() {
  if (!http_->model.empty()) return http_->model;
  const std::string path = base_path_ + "/v1/models";
  httplib::Result r = http_->client.Get(path.c_str());
  if (!r) return Status(StatusCode::kUnavailable, "GET " + http_->root + path + ": " + httplib::to_string(r.error()));
  if (r->status != 200) return Internal("GET " + http_->root + path + ": HTTP " + std::to_string(r->status) + " " + ErrorText(r->body));
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() || !j["data"][0].contains("id"))
    return Internal("GET " + http_->root + path + ": no model listed in " + r->body.substr(0, 200));
  http_->model = j["data"][0]["id"].get<std::string>();
  return http_->model;
}

namespace {

// One choice of a /v1/completions reply into `t` (tokens, log-probs); errors name the choice.
Status ParseChoice(const json& c, size_t index, const std::string& where, data::Turn* t) {
  const std::string choice = where + ": choice " + std::to_string(index);
  const json& lp = c.contains("logprobs") ? c["logprobs"] : json();
  if (!lp.is_object() || !lp.contains("token_logprobs") || !lp["token_logprobs"].is_array())
    return Internal(choice + " has no logprobs.token_logprobs");
  for (const json& x : lp["token_logprobs"]) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() > 0)
      return Internal(choice + " has log-prob " + x.dump());
    t->logprobs.push_back(x.get<float>());
  }
  if (c.contains("token_ids") && c["token_ids"].is_array()) {
    for (const json& id : c["token_ids"]) {
      if (!id.is_number_integer()) return Internal(choice + " has token id " + id.dump());
      t->tokens.push_back(id.get<int64_t>());
    }
  } else if (lp.contains("tokens") && lp["tokens"].is_array()) {
    for (const json& s : lp["tokens"]) {
      const std::string label = s.is_string() ? s.get<std::string>() : "";
      char* end = nullptr;
      const long long id = label.rfind("token_id:", 0) == 0 ? std::strtoll(label.c_str() + 9, &end, 10) : 0;
      if (end == nullptr || end == label.c_str() + 9 || *end != '\0')
        return Internal(where + ": the server returned neither token_ids nor \"token_id:N\" logprob tokens (got " +
                        s.dump() + "); it needs return_token_ids or return_tokens_as_token_ids");
      t->tokens.push_back(id);
    }
  }
  if (t->tokens.size() != t->logprobs.size() || t->tokens.empty())
    return Internal(choice + " has " + std::to_string(t->tokens.size()) + " token ids and " +
                    std::to_string(t->logprobs.size()) + " log-probs");
  return Status::Ok();
}

}  // namespace

Result<std::vector<data::Turn>> OpenAiHttpPolicy::Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) {
  std::vector<data::Turn> turns(prompts.size());
  if (prompts.empty()) return turns;
  json prompt_ids = json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ECHELON_ASSIGN_OR_RETURN(turns[i].prompt_ids, encode_(prompts[i]));
    prompt_ids.push_back(turns[i].prompt_ids);
  }
  Result<std::string> name = ModelName();
  if (!name.ok()) return name.status().WithContext("openai-http");
  json stop_ids = json::array();
  if (params_.eos_token_id >= 0) stop_ids.push_back(params_.eos_token_id);
  for (int64_t id : params_.stop_token_ids) stop_ids.push_back(id);
  const json body = {{"model", name.value()},
                     {"prompt", prompt_ids},
                     {"max_tokens", params_.max_new_tokens},
                     {"temperature", params_.temperature},
                     {"top_p", params_.top_p},
                     // Said explicitly: a server applies its model's generation_config.json
                     // to what a request leaves out (Qwen3's sets top_k 20).
                     {"top_k", params_.top_k > 0 ? params_.top_k : -1},
                     {"min_p", params_.min_p},
                     {"repetition_penalty", 1.0},
                     {"seed", seed},
                     {"n", 1},
                     {"logprobs", 0},
                     {"stop_token_ids", stop_ids},
                     {"return_token_ids", true},
                     {"return_tokens_as_token_ids", true}};
  const std::string path = base_path_ + "/v1/completions";
  const std::string where = "openai-http POST " + http_->root + path;
  const std::string payload = body.dump();
  httplib::Result r = http_->client.Post(path.c_str(), payload, "application/json");
  for (int attempt = 2; !r && attempt <= kAttempts; ++attempt) {
    spdlog::warn("{}: {} (attempt {} of {})", where, httplib::to_string(r.error()), attempt - 1, kAttempts);
    std::this_thread::sleep_for(std::chrono::duration<double>(kRetrySeconds * (attempt - 1)));
    r = http_->client.Post(path.c_str(), payload, "application/json");
  }
  if (!r) return Status(StatusCode::kUnavailable, where + ": " + httplib::to_string(r.error()));
  if (r->status != 200) return Internal(where + ": HTTP " + std::to_string(r->status) + " " + ErrorText(r->body));
  const json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].size() != prompts.size())
    return Internal(where + ": expected " + std::to_string(prompts.size()) + " choices in " + r->body.substr(0, 300));
  for (const json& c : j["choices"]) {
    const json index_json = c.contains("index") ? c["index"] : json();
    const size_t index = index_json.is_number_unsigned() ? index_json.get<size_t>() : prompts.size();
    if (index >= prompts.size()) return Internal(where + ": choice index " + index_json.dump() + " out of range");
    data::Turn& t = turns[index];
    ECHELON_RETURN_IF_ERROR(ParseChoice(c, index, where, &t));
    t.text = decode_ ? decode_(t.tokens) : (c.contains("text") && c["text"].is_string() ? c["text"].get<std::string>() : "");
  }
  return turns;
}

Status OpenAiHttpPolicy::ReloadWeights(const std::string& dir) {
  const std::string path = base_path_ + options_.reload_path;
  const std::string where = "openai-http POST " + http_->root + path;
  const std::string payload = json{{"model_path", dir}}.dump();
  httplib::Result r = http_->client.Post(path.c_str(), payload, "application/json");
  if (!r) return Status(StatusCode::kUnavailable, where + ": " + httplib::to_string(r.error()));
  const json j = json::parse(r->body, nullptr, false);
  const bool success = j.is_object() && j.value("success", r->status == 200);
  if (r->status != 200 || !success) return FailedPrecondition(where + ": HTTP " + std::to_string(r->status) + " " + ErrorText(r->body));
  return Status::Ok();
}

Status OpenAiHttpPolicy::LoadSnapshot(const std::string& safetensors_bytes, int64_t version) {
  if (options_.snapshot_dir.empty()) return FailedPrecondition("openai-http: no snapshot directory to hand weights to the server");
  std::error_code ec;
  const fs::path dir = fs::absolute(fs::path(options_.snapshot_dir) / ("v" + std::to_string(version)), ec);
  const fs::path tmp = dir.string() + ".tmp";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Internal("cannot create " + tmp.string() + ": " + ec.message());
  for (const auto& [name, bytes] : options_.snapshot_files) ECHELON_RETURN_IF_ERROR(WriteBytes(tmp / name, bytes));
  ECHELON_RETURN_IF_ERROR(WriteBytes(tmp / "model.safetensors", safetensors_bytes));
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) return Internal("cannot rename " + tmp.string() + " to " + dir.string() + ": " + ec.message());
  Status st = ReloadWeights(dir.string());
  if (!st.ok()) {
    fs::remove_all(dir, ec);
    return st.WithContext("snapshot v" + std::to_string(version));
  }
  if (!current_dir_.empty() && current_dir_ != dir.string()) fs::remove_all(current_dir_, ec);
  current_dir_ = dir.string();
  version_ = version;
  return Status::Ok();
}

}  // namespace echelon::rollout
