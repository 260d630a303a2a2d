// GRPO policy loss: group-normalised advantages, PPO-clip surrogate with separate low and high
// clip (DAPO's clip-higher), token-level aggregation, optional KL to a reference policy, and a
// selectable off-policy correction for stale rollouts.
//
// Notation per completion token: logp = log pi_theta (with grad), behav = log pi_behav (the
// actor's sampling log-prob), prox = log pi_prox (the learner's weights at the start of the
// update, no grad). A = the sample's advantage. clip(r) = clamp(r, 1 - eps_low, 1 + eps_high).
//   kNone:       r = exp(logp - behav);                 loss_tok = -min(r A, clip(r) A)
//   kTruncatedIS r = exp(logp - prox), w = min(exp(prox - behav), C);  loss_tok = -w min(r A, clip(r) A)
//   kDecoupled:  r = exp(logp - prox), w = exp(prox - behav), m = [w <= cap];
//                loss_tok = -m w min(r A, clip(r) A)
//   kIcePop:     r = exp(logp - prox), w = exp(prox - behav), m = [1/beta <= w <= beta];
//                loss_tok = -m w min(r A, clip(r) A)
//   kM2po:       r = exp(logp - behav), b = M2poClipBound(...);  loss_tok = -min(r A, clamp(r, e^-b, e^b) A)
// (kDecoupled is AReaL's decoupled PPO objective; kTruncatedIS caps its behaviour weight;
// kIcePop is IcePop's masked importance sampling (Ling Team, "Every Step Evolves: Scaling
// Reinforcement Learning for Trillion-Scale Thinking Model", arXiv 2510.18855): a token whose
// behaviour weight leaves [1/beta, beta] is dropped (no gradient) instead of truncated; it still
// counts in the token-level denominator; kM2po is M2PO, the second-moment trust region of
// Zheng et al., "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
// LLMs?", arXiv 2510.01161, as its released code computes it: the importance ratio to the
// behaviour policy under a PPO clip whose width comes from a second-moment budget. Of the
// "harmful" tokens (A > 0 with r > 1, A < 0 with r < 1: those the clip can hold), the squared
// log-ratios d_i are capped at one value t such that mean_i min(d_i, t) = tau, and the clip is
// [e^-sqrt(t), e^sqrt(t)]; with mean_i d_i <= tau already, nothing is clipped. The clip is never
// wider than [1/c', c'], c' = max(c, 1 + clip_high), so that a forged behaviour log-prob is
// bounded as under the other corrections. The learner takes the bound once per update from
// pi_prox over the whole batch (M2poBound), so that it does not depend on how the batch is cut
// into micro-batches and ranks; the released code takes it per micro-batch from the live
// log-probs, which with one optimizer step per update are pi_prox's.)
// Dual clip (Ye et al., "Mastering Complex Control in MOBA Games with Deep Reinforcement
// Learning", AAAI 2020; verl's clip_ratio_c): where A < 0, min(r A, clip(r) A) is floored at c A.
// With it, whatever behaviour log-probs a worker claims, a token's gradient is at most
// W max(c, 1 + clip_high) |A| / tokens, W the correction's largest weight (1 for none and m2po,
// C for tis, beta for icepop, cap for decoupled): a forged log-prob cannot make one token outweigh
// the batch (without it, a claim 19.9 nats low multiplied a token's gradient by e^19.9).
// KL (k3 estimator, Schulman): kl_tok = exp(ref - logp) - (ref - logp) - 1, added as kl_coef * kl.
// Aggregation (rl.loss_aggregation, TokenShares): each token's loss counts with its share of the
// minibatch's loss. token_mean (the default, DAPO): 1 / the minibatch's tokens, so long
// completions weigh by their token count; seq_mean_token_mean: 1 / (rows x the row's tokens),
// every completion one vote; seq_mean_token_sum_norm (Dr. GRPO): 1 / (rows x max_new_tokens), a
// constant, so no length is favoured by the normalisation. Without shares: the token mean of the
// call.
// Overlong shaping (rl.overlong, DAPO): a completion of L tokens under a limit of Lmax
// (rollout.max_new_tokens) and a buffer of B tokens gets penalty x ((Lmax - B) - L) / B added to
// its reward when L > Lmax - B (so -penalty at the limit); with `filter`, the tokens of a
// truncated completion (Lmax tokens, the last not a stop id) carry no loss.
// Sequence-level ratios (rl.ratio: sequence, GSPO: Zheng et al., "Group Sequence Policy
// Optimization", arXiv 2507.18071): every ratio and behaviour weight above is taken per
// completion, length-normalised: log s_i = mean over the row's tokens of the token log-ratio, so
// s_i = (prod_t r_t)^(1/|y_i|). Each token carries s_i as its value and s_i grad log pi_t as its
// gradient (GSPO-token: s_i.detach() x pi_t / pi_t.detach()), so the clip, the dual clip and the
// corrections act on whole completions; with seq_mean_token_mean aggregation this is GSPO's
// objective exactly. GSPO clips s_i in a narrow band (its paper: 3e-4 below, 4e-4 above):
// set rl.clip_low / rl.clip_high to match.
//
// Thread contract: pure functions over tensors.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "echelon/common/status.h"

namespace echelon::learn {

enum class Correction { kNone, kTruncatedIS, kDecoupled, kIcePop, kM2po };
enum class LossAggregation { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSumNorm };
enum class RatioLevel { kToken, kSequence };
// "token", "sequence"
Result<RatioLevel> ParseRatioLevel(const std::string& name);
// "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"
Result<LossAggregation> ParseLossAggregation(const std::string& name);
// "none", "tis", "decoupled", "icepop", "m2po"
Result<Correction> ParseCorrection(const std::string& name);

struct PolicyLossOptions {
  double clip_low = 0.2;
  double clip_high = 0.28;
  Correction correction = Correction::kNone;
  double tis_cap = 2.0;
  double icepop_beta = 2.0;  // kIcePop keeps tokens whose behaviour weight is in [1/beta, beta]
  double m2po_tau = 0.04;    // kM2po: the harmful tokens' budget of mean (log r)^2 (M2PO's default)
  // kM2po: its clip never wider than PPO's [1 - clip_low, 1 + clip_high] (the budget may only
  // tighten it); rl.staleness: auto turns it on (see RESULTS).
  bool m2po_within_clip = false;
  double decoupled_cap = 5.0;  // kDecoupled drops tokens whose w exceeds it (AReaL's behaviour weight cap)
  double clip_ratio_c = 3.0;   // dual clip: with A < 0 the objective is at least c A (verl's clip_ratio_c)
  RatioLevel ratio = RatioLevel::kToken;  // kSequence: GSPO's length-normalised sequence ratio
  double kl_coef = 0.0;
};

struct OverlongOptions {
  int64_t buffer = 0;    // B: tokens below the limit where the penalty starts; 0: no shaping
  double penalty = 1.0;  // the penalty at the limit
  bool filter = false;   // truncated completions carry no loss
};

// Whether a completion was cut at the token limit: it holds `max_new_tokens` tokens and does not
// end with a stop id (a completion that stopped exactly at the limit was not cut). The learner
// decides it from the tokens, so a worker cannot claim it either way. max_new_tokens <= 0: never.
bool Truncated(const std::vector<int64_t>& tokens, int64_t max_new_tokens, const std::vector<int64_t>& stop_ids);
// DAPO's soft overlong punishment of a completion of `length` tokens (<= 0; 0 when off).
double OverlongPenalty(int64_t length, int64_t max_new_tokens, const OverlongOptions& options);
// Each token's share of a minibatch's loss [N, T] (zero off `mask`), the rows of `mask` being the
// minibatch's: see the top. max_new_tokens is seq_mean_token_sum_norm's constant.
at::Tensor TokenShares(const at::Tensor& mask, LossAggregation how, int64_t max_new_tokens);
// Caps each group's total share of `shares` [N, T] (rows of group row_group[r]) at `cap` by
// scaling that group's tokens down; the others keep theirs (rl.max_group_share: one group of
// maximum-length completions among B carries at most `cap` of an update, whatever its length).
// cap <= 0 or >= 1: `shares` unchanged.
at::Tensor CapGroupShares(const at::Tensor& shares, const std::vector<int64_t>& row_group, double cap);
// The largest group's total of `shares` [N, T]: what one group carried (the metric
// group_share_max).
double LargestGroupShare(const at::Tensor& shares, const std::vector<int64_t>& row_group);

struct PolicyLossInputs {
  at::Tensor logp;        // [N, T], requires grad
  at::Tensor behav_logp;  // [N, T]
  at::Tensor prox_logp;   // [N, T]; undefined means logp.detach()
  at::Tensor ref_logp;    // [N, T]; needed only when kl_coef > 0
  at::Tensor advantages;  // [N]
  at::Tensor mask;        // [N, T] float, 1 on completion tokens
  // kM2po: the clip's bound on |log r| for the whole batch (M2poBound); NaN: from this call's
  // own tokens.
  double m2po_bound = std::numeric_limits<double>::quiet_NaN();
  // [N, T] each token's share of the loss (TokenShares, cut to these rows); undefined: the token
  // mean over `mask`. The KL term is weighted alike.
  at::Tensor token_share;
};

// How far the behaviour policy is from pi_prox over a batch's tokens, whatever the correction:
// token means of w = pi_prox / pi_behav (log-ratio clamped as the loss clamps it). The
// effective sample size fraction of the weights is weight_mean^2 / weight_m2 (1: on-policy);
// logratio_m2 is M2PO's second moment E[(log w)^2]. Token means, so micro-batches and ranks
// combine them by their token shares (Add).
struct ImportanceHealth {
  double weight_mean = 0;
  double weight_m2 = 0;
  double logratio_m2 = 0;
  double masked_frac = 0;  // tokens dropped by the correction (kIcePop, kDecoupled above its cap)
  void Add(const ImportanceHealth& o, double share) {
    weight_mean += share * o.weight_mean;
    weight_m2 += share * o.weight_m2;
    logratio_m2 += share * o.logratio_m2;
    masked_frac += share * o.masked_frac;
  }
  double ess_frac() const { return weight_m2 > 0 ? weight_mean * weight_mean / weight_m2 : 1.0; }
};

// The token sums behind an ImportanceHealth, for any subset of rows (a group, a staleness bin):
// sums add, means do not.
struct ImportanceSums {
  double tokens = 0, weight = 0, weight_sq = 0, logratio_sq = 0, dropped = 0;
  void Add(const ImportanceSums& o);
  ImportanceHealth Health() const;  // token means (all zero with no tokens)
};

// One ImportanceSums per row of log_w = log pi_prox - log pi_behav [N, T] (clamped as the loss
// clamps it), over the tokens of `mask`; `dropped` [N, T] bool marks the tokens the correction
// drops (undefined: none).
std::vector<ImportanceSums> RowImportanceSums(const at::Tensor& log_w, const at::Tensor& mask, const at::Tensor& dropped);

// The tokens `options.correction` drops (no gradient), as a bool tensor shaped like log_w:
// kIcePop those whose w leaves [1/beta, beta], kDecoupled those whose w exceeds its cap;
// undefined for the corrections that drop nothing.
at::Tensor DroppedTokens(const at::Tensor& log_w, const PolicyLossOptions& options);

struct PolicyLossOutput {
  at::Tensor loss;          // scalar
  double clip_frac = 0;     // fraction of tokens whose ratio was clipped in the objective
  // Of the tokens, those held by each clip: the ratio below 1 - clip_low with A < 0, above
  // 1 + clip_high with A > 0, and the dual clip's floor c A (A < 0). The first two are PPO's
  // trust region, the third the bound on forged behaviour log-probs.
  double clip_frac_low = 0, clip_frac_high = 0, clip_frac_dual = 0;
  double kl = 0;            // mean k3 KL to the reference (0 when off)
  double behav_weight_mean = 0;  // mean w (1 for kNone; dropped tokens count as 0)
  // The largest |d loss_tok / d logp| / |A| over the tokens with A != 0: w r where the unclipped
  // branch is active (0 elsewhere). The dual clip and the caps bound it (see the top).
  double max_token_weight = 0;
  ImportanceHealth health;
};

// GRPO advantages for one group: (r - mean) / (std + eps), std the sample (n-1) standard
// deviation; all zeros when the group has no reward spread. With scale_by_std false the
// advantages are r - mean (Dr. GRPO).
std::vector<double> GroupAdvantages(const std::vector<double>& rewards, bool scale_by_std, double eps = 1e-6);

PolicyLossOutput PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& options);

// M2PO's harmful tokens [N, T] bool: on `mask`, A > 0 with log_r > 0 or A < 0 with log_r < 0
// (`adv` [N, T], log_r = log pi_theta - log pi_behav).
at::Tensor M2poHarmful(const at::Tensor& log_r, const at::Tensor& adv, const at::Tensor& mask);
// M2PO's bound on |log r| (see the top) over a batch: log_r = log pi - log pi_behav [N, T],
// advantages [N], at options.ratio's level, capped at log max(c, 1 + clip_high).
double M2poBound(const at::Tensor& log_r, const at::Tensor& advantages, const at::Tensor& mask,
                 const PolicyLossOptions& options);
// M2PO's clip bound on |log r|: sqrt(t) with mean over `harmful` of min(log_r^2, t) = tau;
// infinity when the harmful tokens' mean log_r^2 is at most tau already (or there are none).
double M2poClipBound(const at::Tensor& log_r, const at::Tensor& harmful, double tau);

}  // namespace echelon::learn
