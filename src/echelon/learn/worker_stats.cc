#include "echelon/learn/worker_stats.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace echelon::learn {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void WorkerStats::Add(const std::string& worker, const GroupSummary& g) {
  Sums& s = sums_[worker];
  ++s.groups;
  s.reward += g.reward_mean;
  s.zero_spread += g.zero_spread ? 1 : 0;
  s.length += g.length_mean;
  s.gap += g.gap;
  s.routes += g.routes;
  s.routes_same += g.routes_same;
}

void WorkerStats::FlagCanaries(std::map<std::string, Row>& rows) const {
  int64_t samples = 0, successes = 0, counted = 0;
  for (const auto& [worker, c] : canaries_) {
    if (c.samples <= 0) continue;
    Row& r = rows[worker];
    r.canary_groups = c.groups;
    r.canary_pass = static_cast<double>(c.successes) / static_cast<double>(c.samples);
    samples += c.samples;
    successes += c.successes;
    counted += c.samples >= kCanaryMinSamples ? 1 : 0;
  }
  if (counted < kOutlierMinWorkers) return;
  for (const auto& [worker, c] : canaries_) {
    if (c.samples < kCanaryMinSamples) continue;
    const double n = static_cast<double>(c.samples);
    const double p = static_cast<double>(successes - c.successes) / static_cast<double>(samples - c.samples);
    const double bound = std::max(kCanaryScale * std::sqrt(p * (1.0 - p) / n), kCanaryFloor);
    if (std::abs(static_cast<double>(c.successes) / n - p) > bound) rows[worker].outlier.push_back("canary_pass");
  }
}

std::map<std::string, WorkerStats::Row> WorkerStats::Rows() const {
  std::map<std::string, Row> rows;
  for (const auto& [worker, s] : sums_) {
    Row& r = rows[worker];
    const double n = static_cast<double>(s.groups);
    r.groups = s.groups;
    r.reward_mean = s.reward / n;
    r.zero_spread_frac = static_cast<double>(s.zero_spread) / n;
    r.length_mean = s.length / n;
    r.gap_mean = s.gap / n;
    if (s.routes > 0) r.route_agreement = static_cast<double>(s.routes_same) / static_cast<double>(s.routes);
  }
  FlagCanaries(rows);
  std::vector<Row*> fleet;
  for (auto& [worker, r] : rows)
    if (r.groups >= kOutlierMinGroups) fleet.push_back(&r);
  if (static_cast<int>(fleet.size()) < kOutlierMinWorkers) return rows;
  struct Statistic {
    const char* name;
    std::function<double(const Row&)> value;
    std::function<double(double median)> floor;
  };
  const Statistic statistics[] = {
      {"reward_mean", [](const Row& r) { return r.reward_mean; }, [](double) { return kRewardFloor; }},
      {"zero_spread_frac", [](const Row& r) { return r.zero_spread_frac; }, [](double) { return kZeroSpreadFloor; }},
      {"length_mean", [](const Row& r) { return r.length_mean; },
       [](double m) { return std::max(1.0, kLengthFloorFrac * std::abs(m)); }},
      {"gap_mean", [](const Row& r) { return r.gap_mean; }, [](double) { return kGapFloor; }},
      {"route_agreement", [](const Row& r) { return r.route_agreement; },
       [](double) { return kRouteAgreementFloor; }},
  };
  for (const Statistic& st : statistics) {
    std::vector<double> values;  // of the workers that have the statistic (NaN: not)
    for (const Row* r : fleet)
      if (!std::isnan(st.value(*r))) values.push_back(st.value(*r));
    if (static_cast<int>(values.size()) < kOutlierMinWorkers) continue;
    const double median = Median(values);
    std::vector<double> deviations;
    for (double v : values) deviations.push_back(std::abs(v - median));
    const double scale = std::max(1.4826 * Median(deviations), st.floor(median));
    for (Row* r : fleet)
      if (!std::isnan(st.value(*r)) && std::abs(st.value(*r) - median) > kOutlierScale * scale)
        r->outlier.push_back(st.name);
  }
  return rows;
}

nlohmann::json WorkerStats::ToJson() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [worker, r] : Rows()) {
    nlohmann::json j = {{"groups", r.groups},
                        {"reward_mean", r.reward_mean},
                        {"zero_spread_frac", r.zero_spread_frac},
                        {"length_mean", r.length_mean},
                        {"gap_mean", r.gap_mean}};
    if (!std::isnan(r.route_agreement)) j["route_agreement"] = r.route_agreement;
    if (!std::isnan(r.canary_pass)) {
      j["canary_groups"] = r.canary_groups;
      j["canary_pass"] = r.canary_pass;
    }
    if (!r.outlier.empty()) j["outlier"] = r.outlier;
    out[worker] = std::move(j);
  }
  return out;
}

}  // namespace echelon::learn
