#include "echelon/data/http_reward.h"

#include <cmath>

namespace echelon::data {

using nlohmann::json;

Result<std::unique_ptr<HttpReward>> HttpReward::Create(const std::string& url, double timeout_seconds) {
  ECHELON_ASSIGN_OR_RETURN(JsonHttp service, JsonHttp::Create(url, timeout_seconds, "reward service"));
  return std::unique_ptr<HttpReward>(new HttpReward(std::move(service)));
}

Result<std::vector<ExternalScore>> HttpReward::Score(const std::vector<RewardSample>& samples,
                                                     double budget_seconds) const {
  json request = {{"samples", json::array()}};
  for (const RewardSample& s : samples) {
    const json extra = json::parse(s.extra_info_json, nullptr, /*allow_exceptions=*/false);
    request["samples"].push_back({{"data_source", s.data_source},
                                  {"solution_str", s.solution_str},
                                  {"ground_truth", s.ground_truth},
                                  {"extra_info", extra.is_discarded() ? json() : extra}});
  }
  const std::string where = "reward service POST " + service_.url();
  ECHELON_ASSIGN_OR_RETURN(const json j, service_.Post("", request, budget_seconds));
  if (!j.is_object() || !j.contains("scores") || !j["scores"].is_array() || j["scores"].size() != samples.size())
    return InvalidArgument(where + ": expected {\"scores\": [...]} with " + std::to_string(samples.size()) +
                           " entries, got " + Clip(j.dump(), 300));
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
