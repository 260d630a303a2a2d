#include "echelon/sched/completion_forecast.h"

#include <cmath>
#include <limits>

namespace echelon::sched {
namespace {

void Blend(double* mean, double value, bool first) { *mean = first ? value : *mean + kForecastWeight * (value - *mean); }

}  // namespace

void CompletionForecast::ObserveGroup(const std::string& worker, uint64_t prompt, double tokens, double seconds) {
  if (!(tokens > 0) || !std::isfinite(tokens)) return;
  auto t = tokens_.find(prompt);
  Blend(&tokens_[prompt], tokens, t == tokens_.end());
  ++groups_;
  mean_tokens_ += (tokens - mean_tokens_) / static_cast<double>(groups_);
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  auto r = rate_.find(worker);
  Blend(&rate_[worker], tokens / seconds, r == rate_.end());
}

void CompletionForecast::ObserveVersion(int64_t version, double now) {
  if (version <= last_version_) return;
  if (last_version_ >= 0 && now > last_version_at_) {
    const double per_update = (now - last_version_at_) / static_cast<double>(version - last_version_);
    Blend(&update_seconds_, per_update, update_seconds_ == 0);
  }
  last_version_ = version;
  last_version_at_ = now;
}

std::optional<double> CompletionForecast::WorkerRate(const std::string& worker) const {
  auto it = rate_.find(worker);
  if (it == rate_.end()) return std::nullopt;
  return it->second;
}

double CompletionForecast::PromptTokens(uint64_t prompt) const {
  auto it = tokens_.find(prompt);
  return it != tokens_.end() ? it->second : mean_tokens_;
}

std::optional<double> CompletionForecast::GroupSeconds(const std::string& worker, uint64_t prompt) const {
  const std::optional<double> rate = WorkerRate(worker);
  const double tokens = PromptTokens(prompt);
  if (!rate || !(*rate > 0) || !(tokens > 0)) return std::nullopt;
  return tokens / *rate;
}

std::optional<double> CompletionForecast::UpdateSeconds() const {
  if (!(update_seconds_ > 0)) return std::nullopt;
  return update_seconds_;
}

double CompletionForecast::Slack(const std::string& worker, uint64_t prompt, int64_t staleness) const {
  constexpr double kUnknown = std::numeric_limits<double>::infinity();
  const std::optional<double> seconds = GroupSeconds(worker, prompt);
  const std::optional<double> update = UpdateSeconds();
  if (staleness <= 0 || !seconds || !update) return kUnknown;
  return kForecastSafety * static_cast<double>(staleness) * *update - *seconds;
}

}  // namespace echelon::sched
