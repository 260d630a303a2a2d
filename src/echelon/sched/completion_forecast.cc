#include "echelon/sched/completion_forecast.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace echelon::sched {
namespace {

void Blend(double* mean, double value, bool first) { *mean = first ? value : *mean + kForecastWeight * (value - *mean); }

}  // namespace

void CompletionForecast::ObserveGroup(const std::string& worker, uint64_t prompt, double tokens, double seconds,
                                      double lag) {
  if (lag >= 0 && std::isfinite(lag)) {
    auto l = lag_.find(worker);
    Blend(&lag_[worker], lag, l == lag_.end());
  }
  if (!(tokens > 0) || !std::isfinite(tokens)) return;
  auto t = tokens_.find(prompt);
  Blend(&tokens_[prompt], tokens, t == tokens_.end());
  ++groups_;
  ++histogram_[std::clamp(static_cast<int>(std::floor(4 * std::log2(std::max(tokens, 1.0)))), 0, kBins - 1)];
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

double CompletionForecast::WorkerLag(const std::string& worker) const {
  auto it = lag_.find(worker);
  return it != lag_.end() ? it->second : 0.0;
}

double CompletionForecast::PromptTokens(uint64_t prompt) const {
  auto it = tokens_.find(prompt);
  return it != tokens_.end() ? it->second : TokensQuantile(kUnseenPromptQuantile);
}

double CompletionForecast::TokensQuantile(double q) const {
  if (groups_ == 0) return 0;
  const auto rank = static_cast<int64_t>(std::ceil(q * static_cast<double>(groups_)));
  int64_t seen = 0;
  for (int i = 0; i < kBins; ++i) {
    seen += histogram_[i];
    if (seen >= rank) return std::exp2((i + 1) / 4.0);  // the bin's upper edge: errs long
  }
  return std::exp2(kBins / 4.0);
}

bool CompletionForecast::AmongTheFastest(const std::string& worker) const {
  const std::optional<double> mine = WorkerRate(worker);
  if (!mine) return true;
  double best = 0;
  for (const auto& [name, rate] : rate_) best = std::max(best, rate);
  return *mine >= kPassedOverRateFraction * best;
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

double CompletionForecast::Slack(const std::string& worker, uint64_t prompt, int64_t staleness, double now,
                                 std::optional<double> lag, std::optional<Prefix> prefix) const {
  constexpr double kUnknown = std::numeric_limits<double>::infinity();
  std::optional<double> seconds = GroupSeconds(worker, prompt);
  const std::optional<double> update = UpdateSeconds();
  if (staleness <= 0 || !seconds || !update) return kUnknown;
  double behind = lag.value_or(WorkerLag(worker));
  if (prefix) {  // what is left of it, against its oldest token's deadline
    seconds = std::max(0.0, PromptTokens(prompt) - prefix->tokens) / *WorkerRate(worker);
    behind = std::max(behind, prefix->lag);
  }
  const double since = std::max(0.0, now - last_version_at_);  // into the update now running
  return kForecastSafety * ((static_cast<double>(staleness) - behind) * *update - since) - *seconds;
}

}  // namespace echelon::sched
