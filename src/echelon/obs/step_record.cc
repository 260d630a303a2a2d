#include "echelon/obs/step_record.h"

#include <cmath>

namespace echelon::obs {
namespace {

using nlohmann::json;

// The fields of a StepRecord after "step" and "wall_s", once, for the writer and the reader.
// `R` is StepRecord or const StepRecord; `V` a visitor with Number, Count, Counts, Numbers,
// Hist, Ids and Json members.
template <typename R, typename V>
void VisitFields(R& r, V& v) {
  v.Count("version", r.version);
  v.Number("step_s", r.step_s);
  v.Number("wait_s", r.wait_s);
  v.Number("train_s", r.train_s);
  v.Number("reward_mean", r.reward_mean);
  v.Number("accuracy", r.accuracy);
  v.Number("heldout_accuracy", r.heldout_accuracy);
  v.Number("staleness_mean", r.staleness_mean);
  v.Count("staleness_max", r.staleness_max);
  v.Count("staleness_bound", r.staleness_bound);
  v.Hist("staleness_hist", r.staleness_hist);
  v.Ids("consumed_groups", r.consumed_groups);
  v.Counts("refused", r.refused);
  v.Count("groups_consumed", r.groups_consumed);
  v.Count("groups_dropped_stale", r.groups_dropped_stale);
  v.Count("groups_filtered", r.groups_filtered);
  v.Count("filtered_groups", r.filtered_groups);
  v.Count("groups_reissued", r.groups_reissued);
  v.Count("groups_issued", r.groups_issued);
  v.Count("groups_in_flight", r.groups_in_flight);
  v.Count("groups_predicted_late", r.groups_predicted_late);
  v.Count("groups_resumed", r.groups_resumed);
  v.Counts("tokens_by_fate", r.tokens_by_fate);
  v.Count("actors", r.actors);
  v.Counts("actor_groups", r.actor_groups);
  v.Numbers("actor_group_seconds", r.actor_group_seconds);
  v.Counts("actor_forged", r.actor_forged);
  v.Number("learner_busy_frac", r.learner_busy_frac);
  v.Number("loss", r.loss);
  v.Number("grad_norm", r.grad_norm);
  v.Number("clip_frac", r.clip_frac);
  v.Number("clip_frac_low", r.clip_frac_low);
  v.Number("clip_frac_high", r.clip_frac_high);
  v.Number("clip_frac_dual", r.clip_frac_dual);
  v.Number("response_length_mean", r.response_length_mean);
  v.Count("response_length_max", r.response_length_max);
  v.Number("truncated_frac", r.truncated_frac);
  v.Number("kl", r.kl);
  v.Number("behav_weight_mean", r.behav_weight_mean);
  v.Number("max_token_weight", r.max_token_weight);
  v.Number("group_share_max", r.group_share_max);
  v.Number("is_ess_frac", r.is_ess_frac);
  v.Number("is_weight_m2", r.is_weight_m2);
  v.Number("is_logratio_m2", r.is_logratio_m2);
  v.Number("masked_frac", r.masked_frac);
  v.Numbers("is_ess_frac_by_staleness", r.is_ess_frac_by_staleness);
  v.Numbers("is_logratio_m2_by_staleness", r.is_logratio_m2_by_staleness);
  v.Numbers("masked_frac_by_staleness", r.masked_frac_by_staleness);
  v.Number("logprob_gap", r.logprob_gap);
  v.Numbers("actor_logprob_gap", r.actor_logprob_gap);
  v.Json("actor_stats", r.actor_stats);
  v.Numbers("reward_metrics", r.reward_metrics);
  v.Count("zero_spread_groups", r.zero_spread_groups);
  v.Count("skipped_nonfinite", r.skipped_nonfinite);
  v.Count("verified_groups", r.verified_groups);
  v.Number("verify_gap_max", r.verify_gap_max);
  v.Number("verify_token_gap_max", r.verify_token_gap_max);
  v.Count("verify_unverifiable", r.verify_unverifiable);
  v.Count("verify_draws_checked", r.verify_draws_checked);
  v.Count("verify_near_ties", r.verify_near_ties);
  v.Count("tokens", r.tokens);
  v.Count("moved_tokens", r.moved_tokens);
  v.Number("entropy", r.entropy);
  v.Count("lease_renewals", r.lease_renewals);
  v.Number("learner_pad_frac", r.learner_pad_frac);
  v.Numbers("router_load", r.router_load);
  v.Number("router_imbalance", r.router_imbalance);
  v.Number("router_aux_loss", r.router_aux_loss);
  v.Count("routes_replayed", r.routes_replayed);
  v.Number("route_agreement", r.route_agreement);
  v.Count("routes_refused", r.routes_refused);
  v.Number("tokens_per_s", r.tokens_per_s);
  v.Count("broadcast_version", r.broadcast_version);
  v.Number("broadcast_s", r.broadcast_s);
  v.Count("broadcast_bytes", r.broadcast_bytes);
  v.Count("broadcast_snapshot_bytes", r.broadcast_snapshot_bytes);
  v.Number("learner_rss_mb", r.learner_rss_mb);
  v.Count("learner_ranks", r.learner_ranks);
  v.Count("active_workers", r.active_workers);
  v.Counts("billed_by_class", r.billed_by_class);
  v.Number("cost", r.cost);
  v.Json("price_changes", r.price_changes);
}

struct Writer {
  json& out;
  void Number(const char* key, double v) {
    if (!std::isnan(v)) out[key] = v;
  }
  void Count(const char* key, const std::optional<int64_t>& v) {
    if (v) out[key] = *v;
  }
  template <typename M>
  void Counts(const char* key, const M& m) {
    if (!m.empty()) out[key] = m;
  }
  void Numbers(const char* key, const std::map<std::string, double>& m) { Counts(key, m); }
  void Hist(const char* key, const std::map<int64_t, int64_t>& m) {
    if (m.empty()) return;
    json h = json::object();
    for (const auto& [s, n] : m) h[std::to_string(s)] = n;
    out[key] = h;
  }
  void Ids(const char* key, const std::vector<uint64_t>& ids) {
    if (!ids.empty()) out[key] = ids;
  }
  void Json(const char* key, const json& j) {
    if (!j.is_null()) out[key] = j;
  }
};

// Reads present fields, remembering the first problem; absent or null fields stay unset.
struct Reader {
  const json& in;
  const std::string& where;
  Status status;

  const json* Find(const char* key) {
    auto it = in.find(key);
    return it == in.end() || it->is_null() || !status.ok() ? nullptr : &*it;
  }
  void Fail(const char* key, const json& v, const char* expected) {
    status = InvalidArgument(where + ": field '" + key + "' is " + v.dump() + "; expected " + expected);
  }
  static bool IsCount(const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; }

  void Number(const char* key, double& v) {
    if (const json* j = Find(key)) j->is_number() ? void(v = j->get<double>()) : Fail(key, *j, "a number");
  }
  void Count(const char* key, std::optional<int64_t>& v) {
    if (const json* j = Find(key)) IsCount(*j) ? void(v = j->get<int64_t>()) : Fail(key, *j, "a non-negative integer");
  }
  void Counts(const char* key, std::map<std::string, int64_t>& m) {
    const json* j = Find(key);
    if (j == nullptr) return;
    if (!j->is_object()) return Fail(key, *j, "an object of counts");
    for (const auto& [name, v] : j->items()) {
      if (!IsCount(v)) {
        status = InvalidArgument(where + ": " + key + "[\"" + name + "\"] is " + v.dump() +
                                 "; expected a non-negative integer");
        return;
      }
      m[name] = v.get<int64_t>();
    }
  }
  void Numbers(const char* key, std::map<std::string, double>& m) {
    const json* j = Find(key);
    if (j == nullptr) return;
    if (!j->is_object()) return Fail(key, *j, "an object of numbers");
    for (const auto& [name, v] : j->items()) {
      if (!v.is_number()) return Fail(key, *j, "an object of numbers");
      m[name] = v.get<double>();
    }
  }
  void Hist(const char* key, std::map<int64_t, int64_t>& m) {
    std::map<std::string, int64_t> counts;
    Counts(key, counts);
    for (const auto& [k, n] : counts) {
      const bool digits = !k.empty() && k.size() < 19 && k.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) {
        status = InvalidArgument(where + ": " + key + " key \"" + k + "\" is not a non-negative integer");
        return;
      }
      m[std::stoll(k)] = n;
    }
  }
  void Ids(const char* key, std::vector<uint64_t>& ids) {
    const json* j = Find(key);
    if (j == nullptr) return;
    if (!j->is_array()) return Fail(key, *j, "an array of group ids");
    for (const json& id : *j) {
      if (!IsCount(id)) return Fail(key, *j, "an array of group ids");
      ids.push_back(id.get<uint64_t>());
    }
  }
  void Json(const char* key, json& v) {
    if (const json* j = Find(key)) v = *j;
  }
};

}  // namespace

double WastedTokenShare(const std::map<std::string, int64_t>& tokens_by_fate) {
  double all = 0, wasted = 0;
  for (const auto& [fate, n] : tokens_by_fate) {
    all += static_cast<double>(n);
    if (fate == "stale" || fate == "preempted" || fate == "refused") wasted += static_cast<double>(n);
  }
  return all > 0 ? wasted / all : kMissing;
}

json StepRecord::ToJson() const {
  json out = {{"step", step}, {"wall_s", wall_s}};
  Writer w{out};
  VisitFields(*this, w);
  return out;
}

Result<StepRecord> StepRecord::FromJson(const json& line, const std::string& where) {
  if (!line.is_object()) return InvalidArgument(where + ": not a JSON object");
  StepRecord r;
  auto step = line.find("step");
  if (step == line.end() || !step->is_number_integer())
    return InvalidArgument(where + ": a training line needs an integer 'step' (or an \"event\" field)");
  r.step = step->get<int64_t>();
  auto wall = line.find("wall_s");
  if (wall == line.end() || !wall->is_number()) return InvalidArgument(where + ": a training line needs a number 'wall_s'");
  r.wall_s = wall->get<double>();
  Reader reader{line, where, Status::Ok()};
  VisitFields(r, reader);
  // Written by releases before the field was renamed.
  if (std::isnan(r.broadcast_s)) reader.Number("snapshot_broadcast_s", r.broadcast_s);
  ECHELON_RETURN_IF_ERROR(reader.status);
  return r;
}

std::string StalenessBin(int64_t staleness) {
  if (staleness <= 1) return std::to_string(staleness);
  int64_t low = 2;
  while (low * 2 <= staleness) low *= 2;
  return std::to_string(low) + "-" + std::to_string(2 * low - 1);
}

void SetRouterLoad(const std::vector<std::vector<int64_t>>& load, StepRecord* r) {
  std::vector<int64_t> by_expert;
  int64_t total = 0;
  double imbalance = 0;
  for (const std::vector<int64_t>& layer : load) {
    by_expert.resize(std::max(by_expert.size(), layer.size()), 0);
    int64_t layer_total = 0, busiest = 0;
    for (size_t j = 0; j < layer.size(); ++j) {
      by_expert[j] += layer[j];
      layer_total += layer[j];
      busiest = std::max(busiest, layer[j]);
    }
    total += layer_total;
    if (layer_total > 0)
      imbalance = std::max(imbalance, static_cast<double>(busiest) * static_cast<double>(layer.size()) / layer_total);
  }
  if (total == 0) return;
  r->router_load.clear();
  for (size_t j = 0; j < by_expert.size(); ++j)
    r->router_load[std::to_string(j)] = static_cast<double>(by_expert[j]) / static_cast<double>(total);
  r->router_imbalance = imbalance;
}

}  // namespace echelon::obs
