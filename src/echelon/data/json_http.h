// JSON over HTTP for the services a task talks to (a scoring service, an environment): one
// POST of a JSON body, one JSON answer. Connection failures and HTTP 5xx are retried (3
// attempts in all, 0.5 s then 1 s apart); every attempt has the time limit. A service that
// stays down, a 4xx, or an answer that is not JSON is one error naming `what`, the URL and
// what came back.
//
//   ECHELON_ASSIGN_OR_RETURN(JsonHttp env, JsonHttp::Create("http://127.0.0.1:8000", 30, "environment"));
//   ECHELON_ASSIGN_OR_RETURN(nlohmann::json reply, env.Post("/reset", {{"seed", 7}}));
//
// Thread contract: Post may be called from any thread at once (each call has its own
// connection).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "echelon/common/status.h"

namespace echelon::data {

class JsonHttp {
 public:
  // `url`: http://HOST:PORT[/PATH]; `what` names the service in errors ("reward service").
  static Result<JsonHttp> Create(const std::string& url, double timeout_seconds, const std::string& what);

  // POSTs `body` to the URL's path followed by `subpath` ("" or "/reset"). `budget_seconds` > 0
  // bounds the whole call, retries included: an attempt gets at most what is left, and a call
  // that runs out of it is ResourceExhausted (a reward group's budget, not a broken service).
  Result<nlohmann::json> Post(const std::string& subpath, const nlohmann::json& body,
                              double budget_seconds = 0) const;

  const std::string& url() const { return url_; }

 private:
  JsonHttp(std::string url, std::string root, std::string path, double timeout_seconds, std::string what)
      : url_(std::move(url)), root_(std::move(root)), path_(std::move(path)), timeout_seconds_(timeout_seconds),
        what_(std::move(what)) {}

  std::string url_;
  std::string root_;  // http://HOST:PORT
  std::string path_;  // "" or "/PATH" without a trailing slash
  double timeout_seconds_ = 30;
  std::string what_;
};

// The first n bytes of s, with "..." when cut (for error messages quoting what came back).
std::string Clip(const std::string& s, size_t n);

}  // namespace echelon::data
