#include "echelon/learn/grpo.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

namespace echelon::learn {

Result<Correction> ParseCorrection(const std::string& name) {
  if (name == "none") return Correction::kNone;
  if (name == "tis") return Correction::kTruncatedIS;
  if (name == "decoupled") return Correction::kDecoupled;
  if (name == "icepop") return Correction::kIcePop;
  if (name == "m2po") return Correction::kM2po;
  return InvalidArgument("unknown off-policy correction '" + name + "'; expected none, tis, decoupled, icepop or m2po");
}

Result<RatioLevel> ParseRatioLevel(const std::string& name) {
  if (name == "token") return RatioLevel::kToken;
  if (name == "sequence") return RatioLevel::kSequence;
  return InvalidArgument("unknown ratio level '" + name + "'; expected token or sequence");
}

Result<LossAggregation> ParseLossAggregation(const std::string& name) {
  if (name == "token_mean") return LossAggregation::kTokenMean;
  if (name == "seq_mean_token_mean") return LossAggregation::kSeqMeanTokenMean;
  if (name == "seq_mean_token_sum_norm") return LossAggregation::kSeqMeanTokenSumNorm;
  return InvalidArgument("unknown loss aggregation '" + name +
                         "'; expected token_mean, seq_mean_token_mean or seq_mean_token_sum_norm");
}

bool Truncated(const std::vector<int64_t>& tokens, int64_t max_new_tokens, const std::vector<int64_t>& stop_ids) {
  if (max_new_tokens <= 0 || static_cast<int64_t>(tokens.size()) < max_new_tokens) return false;
  return std::find(stop_ids.begin(), stop_ids.end(), tokens.back()) == stop_ids.end();
}

double OverlongPenalty(int64_t length, int64_t max_new_tokens, const OverlongOptions& options) {
  if (options.buffer <= 0 || max_new_tokens <= 0) return 0.0;
  const int64_t start = max_new_tokens - options.buffer;
  if (length <= start) return 0.0;
  if (length > max_new_tokens) return -options.penalty;
  return options.penalty * static_cast<double>(start - length) / static_cast<double>(options.buffer);
}

at::Tensor TokenShares(const at::Tensor& mask, LossAggregation how, int64_t max_new_tokens) {
  at::NoGradGuard no_grad;
  const at::Tensor m = mask.to(at::kFloat);
  if (how == LossAggregation::kTokenMean) return m / at::clamp_min(m.sum(), 1.0);
  const at::Tensor row_tokens = m.sum(1, /*keepdim=*/true);
  const double rows = std::max(1.0, (row_tokens > 0).sum().item<double>());  // rows with a token to train
  if (how == LossAggregation::kSeqMeanTokenMean) return m / at::clamp_min(row_tokens, 1.0) / rows;
  TORCH_CHECK(max_new_tokens > 0, "seq_mean_token_sum_norm needs the token limit (rollout.max_new_tokens)");
  return m / (static_cast<double>(max_new_tokens) * rows);
}

namespace {

// Each group's total of `shares` [N, T] (rows of group row_group[r]).
std::map<int64_t, double> GroupTotals(const at::Tensor& shares, const std::vector<int64_t>& row_group) {
  at::NoGradGuard no_grad;
  TORCH_CHECK(static_cast<int64_t>(row_group.size()) == shares.size(0), "group shares: one group per row");
  const at::Tensor row_share = shares.sum(1).to(at::kCPU, at::kDouble).contiguous();
  const double* rs = row_share.data_ptr<double>();
  std::map<int64_t, double> total;
  for (size_t r = 0; r < row_group.size(); ++r) total[row_group[r]] += rs[r];
  return total;
}

}  // namespace

at::Tensor CapGroupShares(const at::Tensor& shares, const std::vector<int64_t>& row_group, double cap) {
  if (cap <= 0 || cap >= 1) return shares;
  at::NoGradGuard no_grad;
  std::map<int64_t, double> group_share = GroupTotals(shares, row_group);
  std::vector<double> scale(row_group.size(), 1.0);
  for (size_t r = 0; r < row_group.size(); ++r) {
    const double g = group_share[row_group[r]];
    if (g > cap) scale[r] = cap / g;
  }
  return shares * at::tensor(scale, at::kDouble).to(shares.device(), shares.scalar_type()).unsqueeze(1);
}

double LargestGroupShare(const at::Tensor& shares, const std::vector<int64_t>& row_group) {
  double largest = 0;
  for (const auto& [group, share] : GroupTotals(shares, row_group)) largest = std::max(largest, share);
  return largest;
}

std::vector<double> GroupAdvantages(const std::vector<double>& rewards, bool scale_by_std, double eps) {
  const size_t n = rewards.size();
  std::vector<double> adv(n, 0.0);
  if (n < 2) return adv;
  const double mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / n;
  double ss = 0;
  for (double r : rewards) ss += (r - mean) * (r - mean);
  const double std = std::sqrt(ss / (n - 1));
  if (std == 0.0) return adv;
  for (size_t i = 0; i < n; ++i) adv[i] = scale_by_std ? (rewards[i] - mean) / (std + eps) : rewards[i] - mean;
  return adv;
}

namespace {

// exp of a log-ratio clamped to [-20, 20], as verl clamps it: a token whose ratio leaves
// [e^-20, e^20] (only a forged or broken behaviour log-prob gets there) adds no gradient and
// cannot overflow fp32 (e^88.7) into an infinite loss.
constexpr double kMaxLogRatio = 20.0;
at::Tensor ExpClamped(const at::Tensor& log_ratio) { return at::exp(at::clamp(log_ratio, -kMaxLogRatio, kMaxLogRatio)); }

// Each row's mean of `x` over its masked tokens, broadcast back over the row: [N, T].
at::Tensor RowMean(const at::Tensor& x, const at::Tensor& mask) {
  return ((x * mask).sum(1, /*keepdim=*/true) / at::clamp_min(mask.sum(1, /*keepdim=*/true), 1.0)).expand_as(x);
}

// The ratio pi_theta / pi_base per token from log-ratios `log_r` (with the gradient of logp),
// at the token or, for GSPO, the sequence level: exp of the row's mean log-ratio as the value,
// its gradient through each token's own log-prob.
at::Tensor Ratio(const at::Tensor& log_r, const at::Tensor& logp, const at::Tensor& mask, RatioLevel level) {
  if (level == RatioLevel::kToken) return ExpClamped(log_r);
  const at::Tensor sequence = ExpClamped(RowMean(log_r.detach(), mask));
  return sequence * at::exp(logp - logp.detach());
}

}  // namespace

PolicyLossOutput PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& options) {
  const at::Tensor mask = in.mask;
  const at::Tensor prox = in.prox_logp.defined() ? in.prox_logp : in.logp.detach();
  const at::Tensor adv = in.advantages.unsqueeze(1).expand_as(in.logp);

  at::Tensor ratio;
  at::Tensor weight;
  const bool sequence = options.ratio == RatioLevel::kSequence;
  if (options.correction == Correction::kNone || options.correction == Correction::kM2po) {
    ratio = Ratio(in.logp - in.behav_logp, in.logp, mask, options.ratio);
    weight = at::ones_like(in.logp);
  } else {
    ratio = Ratio(in.logp - prox, in.logp, mask, options.ratio);
    // The behaviour weight at the ratio's level (sequence-level TIS and masks under GSPO).
    const at::Tensor log_weight = prox - in.behav_logp;
    weight = ExpClamped(sequence ? RowMean(log_weight, mask) : log_weight);
    if (options.correction == Correction::kTruncatedIS) weight = at::clamp_max(weight, options.tis_cap);
  }
  // The behaviour weight's log (at the ratio's level), for the masks and the health.
  const at::Tensor log_w = (sequence ? RowMean(prox - in.behav_logp, mask) : prox - in.behav_logp).detach();
  const at::Tensor dropped = DroppedTokens(log_w, options);
  if (dropped.defined()) weight = weight.masked_fill(dropped, 0.0);
  at::Tensor clipped = at::clamp(ratio, 1.0 - options.clip_low, 1.0 + options.clip_high);
  if (options.correction == Correction::kM2po) {
    const double bound = std::isnan(in.m2po_bound) ? M2poBound(in.logp - in.behav_logp, in.advantages, mask, options)
                                                   : in.m2po_bound;
    const double low = options.m2po_within_clip ? std::max(std::exp(-bound), 1.0 - options.clip_low) : std::exp(-bound);
    const double high = options.m2po_within_clip ? std::min(std::exp(bound), 1.0 + options.clip_high) : std::exp(bound);
    clipped = at::clamp(ratio, low, high);
  }
  const at::Tensor unclipped_obj = ratio * adv;
  const at::Tensor clipped_obj = clipped * adv;
  // Dual clip: with A < 0 the objective is floored at c A, so a ratio above c (a behaviour
  // log-prob claimed far below the policy's) adds no gradient instead of r times one.
  const at::Tensor surrogate = at::minimum(unclipped_obj, clipped_obj);
  const at::Tensor objective = at::where(adv < 0, at::maximum(surrogate, options.clip_ratio_c * adv), surrogate);
  const at::Tensor per_token = -weight * objective;

  const at::Tensor denom = at::clamp_min(mask.sum(), 1.0);
  const at::Tensor share = in.token_share.defined() ? in.token_share.to(per_token.scalar_type()) : mask / denom;
  at::Tensor loss = (per_token * share).sum();

  PolicyLossOutput out;
  if (options.kl_coef > 0) {
    const at::Tensor d = in.ref_logp - in.logp;
    const at::Tensor kl = at::exp(d) - d - 1.0;
    loss = loss + options.kl_coef * (kl * share).sum();
    out.kl = ((kl * mask).sum() / denom).item<double>();
  }
  out.loss = loss;
  // A token is "clipped" when a clipped branch (PPO's or the dual clip) is active and differs.
  const at::Tensor was_clipped = (objective != unclipped_obj).to(at::kFloat);
  out.clip_frac = ((was_clipped * mask).sum() / denom).item<double>();
  const auto share_of = [&](const at::Tensor& which) { return ((which.to(at::kFloat) * mask).sum() / denom).item<double>(); };
  const at::Tensor ppo_clipped = surrogate != unclipped_obj;  // the PPO clip's branch holds
  const at::Tensor dual = (adv < 0) & (objective != surrogate);
  out.clip_frac_low = share_of(ppo_clipped & (adv < 0) & ~dual);
  out.clip_frac_high = share_of(ppo_clipped & (adv > 0));
  out.clip_frac_dual = share_of(dual);
  out.behav_weight_mean = ((weight * mask).sum() / denom).item<double>();
  // A token's gradient is w r A / tokens where its unclipped branch is active, else 0.
  const at::Tensor active = (objective == unclipped_obj) & (mask > 0) & (adv != 0);
  out.max_token_weight = (weight * ratio).detach().masked_fill(~active, 0.0).max().item<double>();
  ImportanceSums all;
  for (const ImportanceSums& row : RowImportanceSums(log_w, mask, dropped)) all.Add(row);
  out.health = all.Health();
  return out;
}

void ImportanceSums::Add(const ImportanceSums& o) {
  tokens += o.tokens;
  weight += o.weight;
  weight_sq += o.weight_sq;
  logratio_sq += o.logratio_sq;
  dropped += o.dropped;
}

ImportanceHealth ImportanceSums::Health() const {
  if (tokens <= 0) return {};
  return {weight / tokens, weight_sq / tokens, logratio_sq / tokens, dropped / tokens};
}

std::vector<ImportanceSums> RowImportanceSums(const at::Tensor& log_w, const at::Tensor& mask, const at::Tensor& dropped) {
  at::NoGradGuard no_grad;
  // Summed where the tensors live; only [rows, 5] comes to the CPU.
  const at::Tensor lw = at::clamp(log_w, -kMaxLogRatio, kMaxLogRatio).to(at::kDouble);
  const at::Tensor m = mask.to(lw.device(), at::kDouble);
  const at::Tensor d = dropped.defined() ? dropped.to(lw.device(), at::kDouble) * m : at::zeros_like(m);
  const at::Tensor sums = at::stack({m.sum(1), (lw.exp() * m).sum(1), ((2.0 * lw).exp() * m).sum(1), (lw * lw * m).sum(1),
                                     d.sum(1)},
                                    1)
                              .to(at::kCPU)
                              .contiguous();
  auto s = sums.accessor<double, 2>();
  std::vector<ImportanceSums> out(static_cast<size_t>(sums.size(0)));
  for (int64_t r = 0; r < sums.size(0); ++r) out[r] = {s[r][0], s[r][1], s[r][2], s[r][3], s[r][4]};
  return out;
}

at::Tensor DroppedTokens(const at::Tensor& log_w, const PolicyLossOptions& options) {
  at::NoGradGuard no_grad;
  if (options.correction == Correction::kIcePop) {
    const at::Tensor w = ExpClamped(log_w);
    return (w < 1.0 / options.icepop_beta) | (w > options.icepop_beta);
  }
  if (options.correction == Correction::kDecoupled) return ExpClamped(log_w) > options.decoupled_cap;
  return {};
}

at::Tensor M2poHarmful(const at::Tensor& log_r, const at::Tensor& adv, const at::Tensor& mask) {
  at::NoGradGuard no_grad;
  return (mask > 0) & (((adv > 0) & (log_r > 0)) | ((adv < 0) & (log_r < 0)));
}

double M2poBound(const at::Tensor& log_r, const at::Tensor& advantages, const at::Tensor& mask,
                 const PolicyLossOptions& options) {
  at::NoGradGuard no_grad;
  const at::Tensor r = options.ratio == RatioLevel::kSequence ? RowMean(log_r, mask) : log_r;
  const at::Tensor adv = advantages.unsqueeze(1).expand_as(r);
  // Never wider than the dual clip's c: the bound on a forged behaviour log-prob's pull.
  return std::min(M2poClipBound(r, M2poHarmful(r, adv, mask), options.m2po_tau),
                  std::log(std::max(options.clip_ratio_c, 1.0 + options.clip_high)));
}

double M2poClipBound(const at::Tensor& log_r, const at::Tensor& harmful, double tau) {
  at::NoGradGuard no_grad;
  const at::Tensor sq = log_r.masked_select(harmful).to(at::kCPU, at::kDouble).pow(2).contiguous();
  const int64_t n = sq.numel();
  if (n == 0) return std::numeric_limits<double>::infinity();
  std::vector<double> d(sq.data_ptr<double>(), sq.data_ptr<double>() + n);
  std::sort(d.begin(), d.end());
  const double target = tau * static_cast<double>(n);
  double below = 0;  // the sum of the k smallest
  for (double x : d) below += x;
  if (below <= target) return std::numeric_limits<double>::infinity();
  // The cap t with sum_i min(d_i, t) = target: the k smallest lie under it, the rest take t.
  below = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double t = (target - below) / static_cast<double>(n - k);
    if (t <= d[k]) return std::sqrt(std::max(t, 0.0));
    below += d[k];
  }
  return std::sqrt(d.back());  // not reached: the sum exceeds the target
}

}  // namespace echelon::learn
