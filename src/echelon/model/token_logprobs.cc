#include "echelon/model/token_logprobs.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "echelon/model/attention.h"

namespace echelon::model {
namespace {

// A chunk's logits in fp32, divided by the temperature: [n, V].
at::Tensor ScaledLogits(const at::Tensor& hidden, const at::Tensor& head, double temperature) {
  at::Tensor z = at::linear(hidden, head).to(at::kFloat);
  return temperature == 1.0 ? z : z.div_(temperature);
}

struct ChunkedLogProbs : public torch::autograd::Function<ChunkedLogProbs> {
  // hidden [N, E], head [V, E], targets [N]: {logp [N], entropy [N]} (the entropy without a
  // gradient).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                                                const at::Tensor& head, const at::Tensor& targets, double temperature,
                                                int64_t chunk) {
    const int64_t n = hidden.size(0);
    const at::TensorOptions floats = hidden.options().dtype(at::kFloat);
    at::Tensor logp = at::empty({n}, floats), entropy = at::empty({n}, floats), lse = at::empty({n}, floats);
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t m = std::min(chunk, n - i);
      const at::Tensor z = ScaledLogits(hidden.narrow(0, i, m), head, temperature);
      const at::Tensor l = at::logsumexp(z, -1);
      lse.narrow(0, i, m).copy_(l);
      logp.narrow(0, i, m).copy_(z.gather(-1, targets.narrow(0, i, m).unsqueeze(-1)).squeeze(-1) - l);
      // H = lse - sum(p z), p = exp(z - lse).
      entropy.narrow(0, i, m).copy_(l - ((z - l.unsqueeze(-1)).exp() * z).sum(-1));
    }
    ctx->save_for_backward({hidden, head, targets, lse});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->mark_non_differentiable({entropy});
    return {logp, entropy};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &head = saved[1], &targets = saved[2], &lse = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), n = hidden.size(0);
    const at::Tensor g = grads[0].defined() ? grads[0].to(at::kFloat) : at::zeros({n}, lse.options());
    const bool want_hidden = ctx->needs_input_grad(0), want_head = ctx->needs_input_grad(1);
    at::Tensor d_hidden = want_hidden ? at::empty_like(hidden) : at::Tensor();
    at::Tensor d_head = want_head ? at::zeros(head.sizes(), head.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t m = std::min(chunk, n - i);
      const at::Tensor h = hidden.narrow(0, i, m), gi = g.narrow(0, i, m).unsqueeze(-1);
      // d logp / d z = onehot(target) - softmax(z); z = logits / temperature.
      at::Tensor dz = (ScaledLogits(h, head, temperature) - lse.narrow(0, i, m).unsqueeze(-1)).exp_().mul_(gi).neg_();
      dz.scatter_add_(-1, targets.narrow(0, i, m).unsqueeze(-1), gi);
      if (temperature != 1.0) dz.div_(temperature);
      const at::Tensor dlogits = dz.to(hidden.scalar_type());
      if (want_hidden) d_hidden.narrow(0, i, m).copy_(at::matmul(dlogits, head));
      if (want_head) d_head.add_(at::matmul(dz.t(), h.to(at::kFloat)));
    }
    return {d_hidden, want_head ? d_head.to(head.scalar_type()) : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor TokenLogProbs(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& targets,
                         double temperature, at::Tensor* entropy, int64_t chunk) {
  TORCH_CHECK(hidden.dim() >= 1 && head.dim() == 2 && hidden.size(-1) == head.size(1),
              "TokenLogProbs: hidden [..., E] and head [V, E] expected, got ", hidden.sizes(), " and ", head.sizes());
  TORCH_CHECK(targets.sizes() == hidden.sizes().slice(0, hidden.dim() - 1), "TokenLogProbs: targets ",
              targets.sizes(), " for hidden ", hidden.sizes());
  TORCH_CHECK(temperature > 0, "TokenLogProbs: temperature must be positive, got ", temperature);
  if (UntiledReference()) {  // whole logits (benchmarks of what chunking saves)
    const at::Tensor logits = at::linear(hidden, head);
    if (entropy != nullptr) {
      const at::Tensor logp = at::log_softmax(logits.detach().to(at::kFloat) / temperature, -1);
      *entropy = -(logp.exp() * logp).sum(-1);
    }
    return LogitsTokenLogProbs(logits, targets, temperature);
  }
  if (chunk <= 0) chunk = std::max<int64_t>(1, kLogitChunkElements / std::max<int64_t>(1, head.size(0)));
  const at::Tensor flat = hidden.reshape({-1, hidden.size(-1)});
  const auto out = ChunkedLogProbs::apply(flat, head, targets.reshape({-1}).to(at::kLong), temperature, chunk);
  if (entropy != nullptr) *entropy = out[1].view(targets.sizes());
  return out[0].view(targets.sizes());
}

at::Tensor LogitsTokenLogProbs(const at::Tensor& logits, const at::Tensor& targets, double temperature) {
  const at::Tensor full = logits.to(at::kFloat);  // log-probs in fp32 whatever the model computes in
  const at::Tensor scaled = temperature == 1.0 ? full : full / temperature;
  return at::log_softmax(scaled, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

}  // namespace echelon::model
