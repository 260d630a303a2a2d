// StepRecord: one learner update, as one line of metrics.jsonl. The one record that the
// learner (learn/learner_run.h) and the simulator (plan/simulator.h, its --out timeline)
// write, and that the report (obs/report_data.h) and `plan --from-run` (plan/run_fit.h) read:
// one set of key names, one parser.
//
// Presence: every field below is optional in a line. A missing number reads as kMissing
// (NaN), a missing count as nullopt, a missing map as empty; ToJson writes only what is
// present. Which side fills what:
//   both        step, version, wall_s, step_s, wait_s, train_s, staleness_*, groups_*,
//               learner_busy_frac
//   learner     reward_mean, reward_metrics, accuracy, heldout_accuracy (evaluation steps), consumed_groups,
//               refused, actors, actor_groups, actor_forged, loss, grad_norm, clip_frac, clip_frac_low,
//               clip_frac_high, clip_frac_dual, response_length_mean, response_length_max, truncated_frac, kl,
//               behav_weight_mean, max_token_weight, group_share_max, is_ess_frac, is_weight_m2, is_logratio_m2, masked_frac, (the last three
//               also *_by_staleness), logprob_gap, actor_logprob_gap, actor_stats, zero_spread_groups,
//               skipped_nonfinite, verified_groups, verify_gap_max, verify_token_gap_max, verify_unverifiable,
//               verify_draws_checked, verify_near_ties, tokens, moved_tokens,
//               entropy, lease_renewals, learner_pad_frac,
//               router_load, router_imbalance, router_aux_loss, routes_replayed, route_agreement,
//               routes_refused, tokens_per_s, broadcast_version, broadcast_s,
//               broadcast_bytes, broadcast_snapshot_bytes, learner_rss_mb, learner_ranks
//   simulator   active_workers, billed_by_class, cost, price_changes
// Old files keep reading: "snapshot_broadcast_s" is read as broadcast_s; lines without
// wait_s / train_s / learner_rss_mb read them as missing.
//
//   StepRecord r;  r.step = t;  r.version = t + 1;  ...;  metrics.Write(r.ToJson());
//   ECHELON_ASSIGN_OR_RETURN(StepRecord back, StepRecord::FromJson(line, "metrics.jsonl:7"));
//
// Thread contract: a plain value.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::obs {

// A number the line did not carry.
inline constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

struct StepRecord {
  int64_t step = 0;                   // update index t: this line is update t -> t+1
  std::optional<int64_t> version;     // policy version after it (t + 1)
  double wall_s = 0;                  // seconds since the run started (simulated in a timeline)
  double step_s = kMissing;           // this update's cycle, waiting for groups included
  double wait_s = kMissing;           // of which waiting until B admissible groups were there
  double train_s = kMissing;          // of which in the update itself

  // Rollouts consumed by this update.
  double reward_mean = kMissing;
  double accuracy = kMissing;         // fraction of successful episodes
  double heldout_accuracy = kMissing; // greedy held-out evaluation after this update
  double staleness_mean = kMissing;   // t - x over the batch
  std::optional<int64_t> staleness_max;
  std::optional<int64_t> staleness_bound;      // S
  std::map<int64_t, int64_t> staleness_hist;   // t - x -> groups of this batch
  std::vector<uint64_t> consumed_groups;       // group ids of the batch

  // Dispatcher counts after the update (running totals):
  // issued = consumed + dropped_stale + filtered + reissued + in_flight.
  std::optional<int64_t> groups_issued, groups_consumed, groups_dropped_stale, groups_reissued, groups_in_flight;
  std::optional<int64_t> groups_filtered;  // total dropped by dynamic sampling (counts in the sum above when present)
  std::optional<int64_t> filtered_groups;  // dynamic sampling: groups dropped while this update's batch was collected
  // Deadline-aware dispatch: Acquire calls that got nothing because no waiting group fit (total).
  std::optional<int64_t> groups_predicted_late;
  // Resumable groups: hand-outs that continued a group from its prefix (total).
  std::optional<int64_t> groups_resumed;
  // Completion tokens by fate (totals, sched::TokensByFate): consumed, stale, filtered,
  // preempted (reported by leases that ended), refused.
  std::map<std::string, int64_t> tokens_by_fate;
  std::map<std::string, int64_t> refused;       // refused submissions and calls, by reason (totals)
  std::optional<int64_t> actors;                // live actors
  std::map<std::string, int64_t> actor_groups;  // accepted groups per actor name (totals)
  // Mean seconds from a group's hand-out to its submission, per worker, over its submitted
  // groups (wall time of generation, waits for a snapshot included; not the idle time between
  // groups): what a simulation of the run takes as each worker's group time (plan --from-run).
  std::map<std::string, double> actor_group_seconds;
  std::map<std::string, int64_t> actor_forged;  // forged submissions per actor name (totals)
  double learner_busy_frac = kMissing;          // update time / RL wall time, so far
  double tokens_per_s = kMissing;               // accepted completion tokens / RL wall time

  // The update's own statistics (learn::StepStats).
  double loss = kMissing, grad_norm = kMissing, clip_frac = kMissing, kl = kMissing;
  // Of clip_frac, the tokens each clip held: PPO's low and high bounds, and the dual clip.
  double clip_frac_low = kMissing, clip_frac_high = kMissing, clip_frac_dual = kMissing;
  // The batch's completions: mean and longest length in tokens, and the share of episodes cut at
  // rollout.max_new_tokens.
  double response_length_mean = kMissing;
  std::optional<int64_t> response_length_max;
  double truncated_frac = kMissing;
  double behav_weight_mean = kMissing;
  // Staleness health (learn::ImportanceHealth): ESS fraction and second moment of the
  // importance weights pi_prox / pi_behav, E[(log w)^2], and the fraction of tokens dropped.
  double is_ess_frac = kMissing, is_weight_m2 = kMissing, is_logratio_m2 = kMissing, masked_frac = kMissing;
  // The same per staleness bin of the batch's groups (StalenessBin: "0", "1", "2-3", "4-7", ...),
  // pi_prox taken at the start of the update: where stale data starts to hurt.
  std::map<std::string, double> is_ess_frac_by_staleness, is_logratio_m2_by_staleness, masked_frac_by_staleness;
  double logprob_gap = kMissing;                      // mean |learner - actor| log-prob
  std::map<std::string, double> actor_logprob_gap;    // the same per actor name
  std::map<std::string, double> reward_metrics;       // batch means of what the reward reported
  std::optional<int64_t> zero_spread_groups;
  std::optional<int64_t> skipped_nonfinite;  // optimizer steps skipped: non-finite loss or gradient
  std::optional<int64_t> verified_groups;    // groups whose behaviour log-probs were recomputed (total, this process)
  double max_token_weight = kMissing;        // the largest token gradient weight w r (learn/grpo.h)
  double group_share_max = kMissing;         // the largest share of a minibatch's loss one group carried
  double verify_gap_max = kMissing;          // the largest mean log-prob gap of a verified group that passed
  double verify_token_gap_max = kMissing;    // the largest one token's gap in a verified group that passed
  std::optional<int64_t> verify_unverifiable;  // groups drawn whose version was no longer kept (total, this process)
  std::optional<int64_t> verify_draws_checked;  // tokens whose seeded draw was recomputed (total, this process)
  std::optional<int64_t> verify_near_ties;      // of which passed within the draw tolerance, not the exact draw
  std::optional<int64_t> tokens;                      // completion tokens trained on
  // Of them, those drawn by a newer version than their group's oldest (partial rollouts moved
  // the generation to a newer snapshot midway).
  std::optional<int64_t> moved_tokens;
  double entropy = kMissing;  // mean per-token entropy of the policy over the batch's completion tokens
  std::optional<int64_t> lease_renewals;  // leases renewed by their holder's progress (total, this process)
  double learner_pad_frac = kMissing;  // share of the positions the gradient forwards computed that were padding
  // Mixture-of-experts models: each expert's share of the routed (token, expert) pairs over
  // the sparse layers (key: the expert's index), and the worst layer's busiest expert over its
  // mean load (1: balanced).
  std::map<std::string, double> router_load;
  double router_imbalance = kMissing;
  double router_aux_loss = kMissing;  // the load-balancing loss, when rl.router_aux_coef > 0
  // Router replay (rl.router_replay): routes the batch's turns carried, the share the learner's
  // own router chose alike, and those refused (beyond rl.router_replay_trust).
  std::optional<int64_t> routes_replayed;
  double route_agreement = kMissing;
  std::optional<int64_t> routes_refused;

  std::optional<int64_t> broadcast_version;  // newest snapshot every peer held by now ...
  double broadcast_s = kMissing;             // ... seconds from publishing it to the last peer,
  std::optional<int64_t> broadcast_bytes;    // ... payload bytes a peer pulled for it (mean; deltas
                                             //     where it held the base), and
  std::optional<int64_t> broadcast_snapshot_bytes;  // ... its size whole
  double learner_rss_mb = kMissing;          // the learner process's resident memory
  std::optional<int64_t> learner_ranks;      // data-parallel learner ranks that took the update

  // Simulator.
  std::optional<int64_t> active_workers;
  std::map<std::string, int64_t> billed_by_class;
  double cost = kMissing;                // dollars so far
  nlohmann::json price_changes;          // null, or the re-activations at this update
  // Per worker over the run (learn/worker_stats.h): {"NAME": {"groups", "reward_mean",
  // "zero_spread_frac", "length_mean", "gap_mean"[, "outlier": [statistic, ...]]}}; null: none.
  nlohmann::json actor_stats;

  nlohmann::json ToJson() const;
  // Errors name `where` (e.g. "run/metrics.jsonl:7") and the field: a line without an
  // integer "step" or a number "wall_s", or a present field of the wrong type or sign.
  static Result<StepRecord> FromJson(const nlohmann::json& line, const std::string& where);
};

// The share of completion tokens wasted, by `tokens_by_fate` (StepRecord::tokens_by_fate):
// stale + preempted + refused over every token with a fate; kMissing when there are none.
double WastedTokenShare(const std::map<std::string, int64_t>& tokens_by_fate);

// The label of a staleness's power-of-two bin: 0 -> "0", 1 -> "1", 2..3 -> "2-3", 4..7 -> "4-7", ...
std::string StalenessBin(int64_t staleness);

// Sets router_load and router_imbalance from tokens routed per expert, one row per sparse layer
// (learn::StepStats::router_load); leaves them missing when nothing was routed.
void SetRouterLoad(const std::vector<std::vector<int64_t>>& load, StepRecord* r);

}  // namespace echelon::obs
