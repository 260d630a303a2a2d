#include "echelon/obs/prometheus_catalog.h"

#include <cctype>
#include <map>
#include <string>

namespace echelon::obs {
namespace {

struct Series {
  const char* name;
  MetricType type;
  const char* help;
  const char* label = "key";  // for a map of numbers
  double scale = 1.0;          // to base units
};

constexpr MetricType G = MetricType::kGauge;
constexpr MetricType C = MetricType::kCounter;

const std::map<std::string, Series>& Catalog() {
  static const std::map<std::string, Series> kCatalog = {
      {"step", {"echelon_step", G, "index t of the last learner update (t -> t+1)"}},
      {"version", {"echelon_policy_version", G, "policy version after the last update"}},
      {"wall_s", {"echelon_run_wall_seconds", G, "seconds since the run started"}},
      {"step_s", {"echelon_step_seconds", G, "the last update's cycle, waiting for groups included"}},
      {"wait_s", {"echelon_step_wait_seconds", G, "of the last cycle, seconds waiting for admissible groups"}},
      {"train_s", {"echelon_step_train_seconds", G, "of the last cycle, seconds in the update itself"}},
      {"reward_mean", {"echelon_reward_mean", G, "mean reward of the last batch"}},
      {"accuracy", {"echelon_accuracy", G, "fraction of successful episodes in the last batch"}},
      {"heldout_accuracy", {"echelon_heldout_accuracy", G, "greedy held-out accuracy at the last evaluation"}},
      {"staleness_mean", {"echelon_staleness_mean", G, "mean policy lag t - x over the last batch"}},
      {"staleness_max", {"echelon_staleness_max", G, "largest policy lag t - x in the last batch"}},
      {"staleness_bound", {"echelon_staleness_bound", G, "the staleness bound S"}},
      {"staleness_hist", {"echelon_batch_groups", G, "groups of the last batch by policy lag t - x", "staleness"}},
      {"groups_issued", {"echelon_groups_issued_total", C, "groups handed to actors"}},
      {"groups_consumed", {"echelon_groups_consumed_total", C, "groups trained on"}},
      {"groups_dropped_stale", {"echelon_groups_dropped_stale_total", C, "groups dropped for exceeding the staleness bound"}},
      {"groups_filtered", {"echelon_groups_filtered_total", C, "groups dynamic sampling dropped for having no reward spread"}},
      {"filtered_groups", {"echelon_filtered_groups", G, "groups dynamic sampling dropped while the last batch was collected"}},
      {"groups_reissued", {"echelon_groups_reissued_total", C, "groups issued again after a lease expired or an actor left"}},
      {"groups_in_flight", {"echelon_groups_in_flight", G, "groups issued and not yet settled"}},
      {"refused", {"echelon_refused_total", C, "refused submissions and calls, by reason", "reason"}},
      {"actors", {"echelon_actors", G, "live actors"}},
      {"actor_groups", {"echelon_actor_groups_total", C, "accepted groups, by actor", "actor"}},
      {"actor_forged", {"echelon_actor_forged_total", C, "forged submissions, by actor", "actor"}},
      {"learner_busy_frac", {"echelon_learner_busy_ratio", G, "update time over RL wall time so far"}},
      {"tokens_per_s", {"echelon_tokens_per_second", G, "accepted completion tokens per second of RL wall time"}},
      {"loss", {"echelon_loss", G, "loss of the last update"}},
      {"grad_norm", {"echelon_grad_norm", G, "gradient norm of the last update, before clipping"}},
      {"clip_frac", {"echelon_clip_ratio", G, "fraction of tokens whose ratio was clipped in the last update"}},
      {"kl", {"echelon_kl", G, "KL estimate against the reference in the last update"}},
      {"clip_frac_low", {"echelon_clip_low_ratio", G, "fraction of the last update's tokens held by the PPO clip's lower bound"}},
      {"clip_frac_high", {"echelon_clip_high_ratio", G, "fraction of the last update's tokens held by the PPO clip's upper bound"}},
      {"clip_frac_dual", {"echelon_clip_dual_ratio", G, "fraction of the last update's tokens held by the dual clip"}},
      {"response_length_mean", {"echelon_response_length_mean", G, "mean completion length of the last batch, in tokens"}},
      {"response_length_max", {"echelon_response_length_max", G, "longest completion of the last batch, in tokens"}},
      {"truncated_frac", {"echelon_truncated_ratio", G, "share of the last batch's episodes cut at rollout.max_new_tokens"}},
      {"behav_weight_mean", {"echelon_behaviour_weight_mean", G, "mean importance weight against the behaviour policy"}},
      {"max_token_weight",
       {"echelon_max_token_weight", G, "largest gradient weight of one token (bounded whatever workers claim)"}},
      {"actor_stats",
       {"echelon_actor_outlier_statistics", G,
        "statistics of a worker's groups flagged as outliers against the fleet's (learn/worker_stats.h), by actor",
        "actor"}},
      {"group_share_max",
       {"echelon_group_share_max", G, "largest share of a minibatch's loss one group carried (rl.max_group_share caps it)"}},
      {"is_ess_frac", {"echelon_importance_ess_ratio", G, "effective sample size fraction of the importance weights pi_prox / pi_behav (1: on-policy)"}},
      {"is_weight_m2", {"echelon_importance_weight_second_moment", G, "second moment of the importance weights pi_prox / pi_behav"}},
      {"is_logratio_m2", {"echelon_importance_logratio_second_moment", G, "mean squared log importance weight (M2PO's second moment)"}},
      {"masked_frac", {"echelon_masked_token_ratio", G, "fraction of tokens the off-policy correction dropped"}},
      {"is_ess_frac_by_staleness", {"echelon_importance_ess_ratio_by_staleness", G, "importance-weight ESS fraction of the last batch's groups, by staleness bin", "staleness"}},
      {"is_logratio_m2_by_staleness", {"echelon_importance_logratio_second_moment_by_staleness", G, "mean squared log importance weight of the last batch's groups, by staleness bin", "staleness"}},
      {"masked_frac_by_staleness", {"echelon_masked_token_ratio_by_staleness", G, "fraction of tokens dropped by the correction, by staleness bin", "staleness"}},
      {"logprob_gap", {"echelon_logprob_gap", G, "mean |learner - actor| token log-probability in the last batch"}},
      {"actor_logprob_gap", {"echelon_actor_logprob_gap", G, "mean |learner - actor| token log-probability, by actor", "actor"}},
      {"reward_metrics", {"echelon_reward_metric", G, "batch means of what the reward reported, by name", "name"}},
      {"zero_spread_groups", {"echelon_zero_spread_groups", G, "groups of the last batch whose rewards were all equal"}},
      {"skipped_nonfinite", {"echelon_skipped_nonfinite", G, "optimizer steps of the last update skipped for a non-finite loss or gradient"}},
      {"verified_groups", {"echelon_verified_groups_total", C, "groups whose behaviour log-probs were recomputed (this process)"}},
      {"verify_gap_max", {"echelon_verify_gap_max", G, "largest mean log-prob gap of a verified group that passed"}},
      {"verify_token_gap_max",
       {"echelon_verify_token_gap_max", G, "largest one token's log-prob gap in a verified group that passed"}},
      {"verify_draws_checked",
       {"echelon_verify_draws_checked_total", C, "tokens whose seeded draw the verifier recomputed (this process)"}},
      {"verify_near_ties",
       {"echelon_verify_near_ties_total", C, "checked tokens within the draw tolerance but not the exact draw"}},
      {"verify_unverifiable",
       {"echelon_verify_unverifiable_total", C, "groups drawn for verification whose version was no longer kept"}},
      {"tokens", {"echelon_step_tokens", G, "completion tokens trained on in the last update"}},
      {"moved_tokens", {"echelon_step_moved_tokens", G, "of them, tokens drawn by a newer version than their group's oldest (partial rollouts)"}},
      {"entropy", {"echelon_policy_entropy", G, "mean per-token entropy of the policy over the last update's completion tokens"}},
      {"lease_renewals", {"echelon_lease_renewals_total", C, "leases renewed by their holder's progress reports (this process)"}},
      {"learner_pad_frac", {"echelon_learner_padding_ratio", G, "share of the positions the last update's gradient forwards computed that were padding"}},
      {"router_load", {"echelon_router_load_ratio", G, "each expert's share of the last update's routed tokens over the sparse layers", "expert"}},
      {"router_aux_loss", {"echelon_router_aux_loss", G, "the router's load-balancing loss in the last update (rl.router_aux_coef > 0)"}},
      {"router_imbalance", {"echelon_router_imbalance", G, "busiest expert's load over the mean, worst sparse layer (1: balanced)"}},
      {"routes_replayed", {"echelon_routes_replayed", G, "routes the last update's turns carried (rl.router_replay)"}},
      {"route_agreement", {"echelon_route_agreement_ratio", G, "share of those routes the learner's own router chose alike"}},
      {"routes_refused", {"echelon_routes_refused", G, "of them, routes refused: beyond rl.router_replay_trust"}},
      {"broadcast_version", {"echelon_broadcast_version", G, "newest snapshot every broadcast peer held"}},
      {"broadcast_s", {"echelon_broadcast_seconds", G, "seconds from publishing that snapshot to its last peer"}},
      {"broadcast_bytes", {"echelon_broadcast_bytes", G, "payload bytes a peer pulled for that snapshot (mean over the peers)"}},
      {"broadcast_snapshot_bytes", {"echelon_broadcast_snapshot_bytes", G, "that snapshot's size whole"}},
      {"learner_rss_mb", {"echelon_learner_resident_memory_bytes", G, "the learner process's resident memory", "key", 1024.0 * 1024.0}},
      {"learner_ranks", {"echelon_learner_ranks", G, "data-parallel learner ranks that took the last update"}},
  };
  return kCatalog;
}

// A metric name from a key the table does not know: [a-zA-Z0-9_] kept, anything else '_'.
std::string FallbackName(const std::string& key) {
  std::string out = "echelon_";
  for (char c : key) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

}  // namespace

void PublishStepLine(const nlohmann::json& line, MetricsRegistry& registry) {
  for (const auto& [key, value] : line.items()) {
    if (!value.is_number() && !value.is_object()) continue;
    auto it = Catalog().find(key);
    const std::string fallback = FallbackName(key);
    const Series s = it != Catalog().end() ? it->second : Series{fallback.c_str(), G, "", "key"};
    const std::string name = s.name;
    registry.Describe(name, s.type, it != Catalog().end() ? s.help : "metrics.jsonl field " + key);
    if (value.is_number()) {
      registry.Set(name, value.get<double>() * s.scale);
      continue;
    }
    for (const auto& [k, v] : value.items()) {
      if (v.is_number()) registry.Set(name, v.get<double>() * s.scale, {{s.label, k}});
      // A worker's row of actor_stats: how many of its statistics are flagged.
      if (key == "actor_stats" && v.is_object())
        registry.Set(name, static_cast<double>(v.value("outlier", nlohmann::json::array()).size()), {{s.label, k}});
    }
  }
}

}  // namespace echelon::obs
