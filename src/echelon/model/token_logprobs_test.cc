#include "echelon/model/token_logprobs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace echelon::model {
namespace {

double MaxDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Chunked log-probs equal the full log_softmax's, forward and in the gradients of the hidden
// states and the head, at any chunk size and temperature; entropies equal the full softmax's.
TEST(TokenLogProbsTest, ChunksEqualTheFullSoftmaxForwardAndBackward) {
  at::manual_seed(21);
  const int64_t rows = 3, len = 11, e = 16, vocab = 97;
  for (double temperature : {1.0, 0.7}) {
    for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{0}}) {
      const at::Tensor hidden = at::randn({rows, len, e}).requires_grad_(true);
      const at::Tensor head = (at::randn({vocab, e}) * 0.5).requires_grad_(true);
      const at::Tensor targets = at::randint(vocab, {rows, len}, at::kLong);
      const at::Tensor w = at::randn({rows, len});
      at::Tensor entropy;
      const at::Tensor chunked = TokenLogProbs(hidden, head, targets, temperature, &entropy, chunk);
      const at::Tensor logits = at::linear(hidden, head);
      const at::Tensor full = LogitsTokenLogProbs(logits, targets, temperature);
      EXPECT_EQ(chunked.sizes(), targets.sizes());
      EXPECT_LT(MaxDiff(chunked, full), 1e-5) << "T " << temperature << " chunk " << chunk;
      const at::Tensor logp_all = at::log_softmax(logits.detach() / temperature, -1);
      EXPECT_LT(MaxDiff(entropy, -(logp_all.exp() * logp_all).sum(-1)), 1e-5);
      EXPECT_FALSE(entropy.requires_grad());
      const auto g_chunked = torch::autograd::grad({(chunked * w).sum()}, {hidden, head});
      const auto g_full = torch::autograd::grad({(full * w).sum()}, {hidden, head});
      EXPECT_LT(MaxDiff(g_chunked[0], g_full[0]), 1e-5) << "d hidden, T " << temperature << " chunk " << chunk;
      EXPECT_LT(MaxDiff(g_chunked[1], g_full[1]), 1e-5) << "d head, T " << temperature << " chunk " << chunk;
    }
  }
}

// A frozen head (LoRA) gets no gradient and the hidden states still do.
TEST(TokenLogProbsTest, AFrozenHeadTakesNoGradient) {
  const at::Tensor hidden = at::randn({4, 8}).requires_grad_(true);
  const at::Tensor head = at::randn({10, 8});
  const at::Tensor logp = TokenLogProbs(hidden, head, at::randint(10, {4}, at::kLong), 1.0, nullptr, 3);
  const auto g = torch::autograd::grad({logp.sum()}, {hidden});
  EXPECT_TRUE(g[0].defined() && g[0].abs().sum().item<double>() > 0);
}

TEST(TokenLogProbsTest, RefusesShapesThatDoNotFit) {
  EXPECT_THROW(TokenLogProbs(at::randn({4, 8}), at::randn({10, 7}), at::zeros({4}, at::kLong), 1.0), c10::Error);
  EXPECT_THROW(TokenLogProbs(at::randn({4, 8}), at::randn({10, 8}), at::zeros({5}, at::kLong), 1.0), c10::Error);
  EXPECT_THROW(TokenLogProbs(at::randn({4, 8}), at::randn({10, 8}), at::zeros({4}, at::kLong), 0.0), c10::Error);
}

}  // namespace
}  // namespace echelon::model
