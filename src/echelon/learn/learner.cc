#include "echelon/learn/learner.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>

namespace echelon::learn {
namespace {

// Right-padded training batch: input = seq[:-1], target = seq[1:]; completion tokens of a
// turn sit at target positions [prompt_len - 1, prompt_len - 1 + len).
struct Batch {
  at::Tensor input, target, mask, behav, adv;
  std::vector<size_t> row_group;  // which group each row came from
};

Batch BuildBatch(const std::vector<LearnerGroup>& groups, const std::vector<std::vector<double>>& advantages) {
  struct Row {
    const data::Turn* turn;
    double adv;
    size_t group;
  };
  std::vector<Row> rows;
  int64_t max_len = 0;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t e = 0; e < groups[g].episodes.size(); ++e)
      for (const data::Turn& t : groups[g].episodes[e].turns) {
        if (t.tokens.empty()) continue;
        rows.push_back({&t, advantages[g][e], g});
        max_len = std::max<int64_t>(max_len, t.prompt_ids.size() + t.tokens.size() - 1);
      }
  const int64_t n = rows.size();
  Batch b;
  b.input = at::zeros({n, max_len}, at::kLong);
  b.target = at::zeros({n, max_len}, at::kLong);
  b.mask = at::zeros({n, max_len}, at::kFloat);
  b.behav = at::zeros({n, max_len}, at::kFloat);
  b.adv = at::empty({n}, at::kFloat);
  auto in = b.input.accessor<int64_t, 2>();
  auto tg = b.target.accessor<int64_t, 2>();
  auto mk = b.mask.accessor<float, 2>();
  auto bh = b.behav.accessor<float, 2>();
  auto ad = b.adv.accessor<float, 1>();
  for (int64_t r = 0; r < n; ++r) {
    const data::Turn& t = *rows[r].turn;
    std::vector<int64_t> seq(t.prompt_ids);
    seq.insert(seq.end(), t.tokens.begin(), t.tokens.end());
    for (size_t j = 0; j + 1 < seq.size(); ++j) {
      in[r][j] = seq[j];
      tg[r][j] = seq[j + 1];
    }
    const size_t start = t.prompt_ids.size() - 1;
    for (size_t k = 0; k < t.tokens.size(); ++k) {
      mk[r][start + k] = 1.0f;
      bh[r][start + k] = t.logprobs[k];
    }
    ad[r] = static_cast<float>(rows[r].adv);
    b.row_group.push_back(rows[r].group);
  }
  return b;
}

}  // namespace

at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets, double temperature) {
  const at::Tensor scaled = temperature == 1.0 ? logits : logits / temperature;
  return at::log_softmax(scaled, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

Learner::Learner(model::Qwen3Model model, const LearnerOptions& options)
    : model_(std::move(model)), options_(options) {
  torch::optim::AdamWOptions o(options.lr);
  o.betas({options.beta1, options.beta2});
  o.weight_decay(options.weight_decay);
  optimizer_ = std::make_unique<torch::optim::AdamW>(model_->parameters(), o);
  if (options.loss.kl_coef > 0) {
    reference_ = model::Qwen3Model(model_->config());
    (void)reference_->LoadStateDict(model_->StateDict(), "reference policy");
    for (auto& p : reference_->parameters()) p.requires_grad_(false);
  }
}

Learner::~Learner() = default;

std::map<std::string, at::Tensor> Learner::OptimizerState() const {
  std::map<std::string, at::Tensor> out;
  const auto& state = optimizer_->state();
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    auto it = state.find(c10::guts::to_string(item.value().unsafeGetTensorImpl()));
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out[item.key() + ".exp_avg"] = s.exp_avg().detach();
    out[item.key() + ".exp_avg_sq"] = s.exp_avg_sq().detach();
    out[item.key() + ".step"] = at::full({1}, s.step(), at::kLong);
  }
  return out;
}

Status Learner::Restore(int64_t version, const std::map<std::string, at::Tensor>& optimizer_state,
                        const std::map<std::string, at::Tensor>& reference_weights) {
  if (version < 0) return InvalidArgument("restoring a negative policy version " + std::to_string(version));
  // Check everything before changing anything.
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::AdamWParamState>>> restored;
  size_t used = 0;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    auto step = optimizer_state.find(name + ".step");
    if (step == optimizer_state.end()) continue;
    auto m = optimizer_state.find(name + ".exp_avg");
    auto v = optimizer_state.find(name + ".exp_avg_sq");
    if (m == optimizer_state.end() || v == optimizer_state.end())
      return DataLoss("optimizer state of " + name + " is incomplete (exp_avg and exp_avg_sq are both needed)");
    if (!m->second.sizes().equals(item.value().sizes()) || !v->second.sizes().equals(item.value().sizes()))
      return DataLoss("optimizer state of " + name + " has the wrong shape");
    if (step->second.numel() != 1 || step->second.scalar_type() != at::kLong)
      return DataLoss("optimizer step count of " + name + " must be one int64");
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step->second.item<int64_t>());
    s->exp_avg(m->second.to(at::kFloat).clone());
    s->exp_avg_sq(v->second.to(at::kFloat).clone());
    restored.emplace_back(item.value(), std::move(s));
    used += 3;
  }
  if (used != optimizer_state.size())
    return DataLoss("optimizer state holds " + std::to_string(optimizer_state.size() - used) +
                    " tensors that name no parameter of this model");
  if (!restored.empty() && restored.size() != model_->parameters().size())
    return DataLoss("optimizer state covers " + std::to_string(restored.size()) + " of " +
                    std::to_string(model_->parameters().size()) + " parameters");
  if (reference_) ECHELON_RETURN_IF_ERROR(reference_->LoadStateDict(reference_weights, "reference policy"));
  auto& state = optimizer_->state();
  state.clear();
  for (auto& [param, s] : restored) state[c10::guts::to_string(param.unsafeGetTensorImpl())] = std::move(s);
  version_ = version;
  return Status::Ok();
}

namespace {

// Per-group mean |learner log-prob - actor log-prob| at the start of the update, and overall.
void LogprobGaps(const at::Tensor& start_logp, const Batch& b, size_t num_groups, StepStats* stats) {
  const at::Tensor denom = at::clamp_min(b.mask.sum(), 1.0);
  const at::Tensor gap = (start_logp - b.behav).abs() * b.mask;
  stats->logprob_gap = gap.sum().div(denom).item<double>();
  // Per group: a worker whose log-probs disagree with the learner's stands out here.
  const at::Tensor row_gap_t = gap.sum(1), row_tokens_t = b.mask.sum(1);
  auto row_gap = row_gap_t.accessor<float, 1>();
  auto row_tokens = row_tokens_t.accessor<float, 1>();
  std::vector<double> gap_sum(num_groups, 0.0), token_sum(num_groups, 0.0);
  for (size_t r = 0; r < b.row_group.size(); ++r) {
    gap_sum[b.row_group[r]] += row_gap[r];
    token_sum[b.row_group[r]] += row_tokens[r];
  }
  for (size_t g = 0; g < num_groups; ++g)
    stats->group_logprob_gap.push_back(token_sum[g] > 0 ? gap_sum[g] / token_sum[g] : 0.0);
}

// Rows of the batch split into `parts` runs of whole groups (rows of a group are adjacent).
std::vector<at::Tensor> MinibatchRows(const Batch& b, size_t num_groups, int64_t parts) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(parts));
  for (size_t r = 0; r < b.row_group.size(); ++r)
    rows[b.row_group[r] * static_cast<size_t>(parts) / num_groups].push_back(static_cast<int64_t>(r));
  std::vector<at::Tensor> out;
  for (const auto& part : rows)
    if (!part.empty()) out.push_back(at::tensor(part, at::kLong));
  return out;
}

}  // namespace

Result<StepStats> Learner::Step(const std::vector<LearnerGroup>& groups) {
  StepStats stats;
  std::vector<std::vector<double>> advantages;
  for (const LearnerGroup& g : groups) {
    std::vector<double> rewards;
    for (const data::Episode& e : g.episodes) rewards.push_back(e.reward);
    advantages.push_back(GroupAdvantages(rewards, options_.scale_by_std));
    bool spread = false;
    for (double r : rewards) spread = spread || r != rewards.front();
    stats.zero_spread_groups += spread ? 0 : 1;
  }
  Batch b = BuildBatch(groups, advantages);
  if (b.input.size(0) == 0) return InvalidArgument("learner step with no completion tokens");
  stats.tokens = static_cast<int64_t>(b.mask.sum().item<double>());

  model_->train();
  const at::Tensor positions = at::arange(b.input.size(1), at::kLong).unsqueeze(0).expand_as(b.input);
  auto log_probs = [&](model::Qwen3Model& m, const at::Tensor& rows) {
    const at::Tensor input = rows.defined() ? b.input.index_select(0, rows) : b.input;
    const at::Tensor target = rows.defined() ? b.target.index_select(0, rows) : b.target;
    return TokenLogProbs(m->Forward(input, positions.narrow(0, 0, input.size(0)), at::Tensor(), nullptr), target,
                         options_.temperature);
  };
  at::Tensor ref_logp;
  if (reference_) {
    at::NoGradGuard no_grad;
    ref_logp = log_probs(reference_, at::Tensor());
  }
  const int64_t parts = std::min<int64_t>(options_.minibatches, static_cast<int64_t>(groups.size()));
  if (parts <= 1) {
    // One optimizer step: pi_prox is the forward pass itself (PolicyLossInputs.prox_logp unset).
    PolicyLossInputs in;
    in.logp = log_probs(model_, at::Tensor());
    in.behav_logp = b.behav;
    in.advantages = b.adv;
    in.mask = b.mask;
    in.ref_logp = ref_logp;
    PolicyLossOutput out = PolicyLoss(in, options_.loss);
    LogprobGaps(in.logp.detach(), b, groups.size(), &stats);
    optimizer_->zero_grad();
    out.loss.backward();
    stats.grad_norm = torch::nn::utils::clip_grad_norm_(model_->parameters(), options_.max_grad_norm);
    optimizer_->step();
    stats.loss = out.loss.item<double>();
    stats.clip_frac = out.clip_frac;
    stats.kl = out.kl;
    stats.behav_weight_mean = out.behav_weight_mean;
  } else {
    // Several optimizer steps over minibatches of whole groups: pi_prox is the policy at the
    // start of the update, so from the second minibatch on the clipped ratio against it is a
    // trust region (and decoupled / tis weigh by pi_prox / pi_behav as AReaL does).
    at::Tensor prox;
    {
      at::NoGradGuard no_grad;
      prox = log_probs(model_, at::Tensor());
    }
    LogprobGaps(prox, b, groups.size(), &stats);
    const std::vector<at::Tensor> minibatches = MinibatchRows(b, groups.size(), parts);
    stats.behav_weight_mean = 0;  // averaged over the minibatches below
    for (const at::Tensor& rows : minibatches) {
      PolicyLossInputs in;
      in.logp = log_probs(model_, rows);
      in.behav_logp = b.behav.index_select(0, rows);
      in.prox_logp = prox.index_select(0, rows);
      in.advantages = b.adv.index_select(0, rows);
      in.mask = b.mask.index_select(0, rows);
      if (ref_logp.defined()) in.ref_logp = ref_logp.index_select(0, rows);
      PolicyLossOutput out = PolicyLoss(in, options_.loss);
      optimizer_->zero_grad();
      out.loss.backward();
      stats.grad_norm += torch::nn::utils::clip_grad_norm_(model_->parameters(), options_.max_grad_norm);
      optimizer_->step();
      stats.loss += out.loss.item<double>();
      stats.clip_frac += out.clip_frac;
      stats.kl += out.kl;
      stats.behav_weight_mean += out.behav_weight_mean;
    }
    const double n = static_cast<double>(minibatches.size());
    stats.grad_norm /= n;
    stats.loss /= n;
    stats.clip_frac /= n;
    stats.kl /= n;
    stats.behav_weight_mean /= n;
  }
  ++version_;
  return stats;
}

}  // namespace echelon::learn
