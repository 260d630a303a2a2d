// Rewards from a scoring service over HTTP, for verifiers in any language or in a sandbox
// (code execution). One POST per group:
//   request   {"samples": [{"data_source": "...", "solution_str": "...", "ground_truth": "...",
//                           "extra_info": <the row's extra_info or null>}, ...]}
//   response  {"scores": [0.5, {"score": 1.0, "passed": 3}, ...]}   one per sample, in order;
//             a dict's other numbers become metrics
// Retries, time limit and errors as data/json_http.h says; an answer of the wrong shape is one
// error naming the URL and what came back.
//
//   ECHELON_ASSIGN_OR_RETURN(auto http, HttpReward::Create("http://127.0.0.1:8000/score", 30));
//   ECHELON_ASSIGN_OR_RETURN(std::vector<ExternalScore> s, http->Score(samples));
//
// Thread contract: Score may be called from any thread at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/json_http.h"
#include "echelon/data/reward_spec.h"

namespace echelon::data {


class HttpReward {
 public:
  // `url`: http://HOST:PORT/PATH. Errors name a malformed URL.
  static Result<std::unique_ptr<HttpReward>> Create(const std::string& url, double timeout_seconds);

  // `budget_seconds` > 0 bounds the request, retries included (JsonHttp::Post).
  Result<std::vector<ExternalScore>> Score(const std::vector<RewardSample>& samples, double budget_seconds = 0) const;

 private:
  explicit HttpReward(JsonHttp service) : service_(std::move(service)) {}

  const JsonHttp service_;
};

}  // namespace echelon::data
