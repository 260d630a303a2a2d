// Per-token log-probabilities and entropies from the final hidden states and the LM head, in
// chunks of tokens, forward and backward, so no T x vocab tensor is ever held: at Qwen3's
// 151,936-entry vocabulary one fp32 row of logits is 0.6 MB, a 20k-token sequence's logits
// 12 GB, and a chunk of kLogitChunkElements a bounded 128 MiB whatever the length.
//
//   at::Tensor entropy;
//   at::Tensor logp = TokenLogProbs(model->Hidden(ids, positions, {}), model->head(), targets,
//                                   /*temperature=*/1.0, &entropy);
//
// logp[i] = log_softmax(hidden[i] . head^T / temperature)[targets[i]], computed as transformers'
// logits are (the matmul in the weights' dtype) and then in fp32; entropy[i] is the entropy of
// that distribution. The forward keeps each token's log-sum-exp; the backward pass recomputes a
// chunk's logits from it: d logits = g (onehot(target) - softmax) / temperature.
//
// Thread contract: a pure function of its arguments.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace echelon::model {

// Logit elements (tokens x vocab) per chunk: 32M fp32 = 128 MiB, a few of which (logits,
// probabilities, their gradient) live at once. Small models' whole batches fit one chunk.
inline constexpr int64_t kLogitChunkElements = int64_t{32} << 20;

// hidden [..., E] and targets [...] (int64, same leading shape) against head [V, E]. Returns
// fp32 log-probabilities shaped as targets, differentiable in hidden and head. `entropy`
// (optional) receives the per-token entropies (fp32, no gradient). chunk <= 0: tokens per chunk
// from kLogitChunkElements.
at::Tensor TokenLogProbs(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& targets,
                         double temperature, at::Tensor* entropy = nullptr, int64_t chunk = 0);

// The same from whole logits [..., V] (for logits already at hand, and as the reference the
// chunked path is checked against).
at::Tensor LogitsTokenLogProbs(const at::Tensor& logits, const at::Tensor& targets, double temperature);

}  // namespace echelon::model
