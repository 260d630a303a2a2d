// Batched sampling with a KV cache.
//
//   SamplingParams sp; sp.temperature = 1.0; sp.top_p = 1.0; sp.max_new_tokens = 8; sp.seed = 7;
//   std::vector<Completion> out = Generate(model, prompts, sp);
//
// Prompts are left-padded into one batch; each row stops at EOS or a stop token (kept in its
// tokens) or at max_new_tokens. `logprobs[i]` is the log-probability of `tokens[i]` under the policy the
// token was sampled from: log_softmax(logits / temperature) before top-p truncation (so the
// learner, recomputing with the same temperature, gets the same numbers; top-p only narrows
// which tokens can be drawn). temperature == 0 is greedy (logprobs then use temperature 1).
//
// Every prompt must hold at least one token (an empty one throws std::invalid_argument).
//
// Thread contract: uses the model from the calling thread only; the RNG is local to the call.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "echelon/model/qwen3.h"

namespace echelon::model {

struct SamplingParams {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t max_new_tokens = 16;
  int64_t eos_token_id = 2;
  std::vector<int64_t> stop_token_ids;  // also end a row, kept in its tokens as EOS is
  uint64_t seed = 0;
  bool use_cache = true;  // false recomputes the whole prefix each token (for tests/benchmarks)
};

struct Completion {
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  bool finished_eos = false;
};

// Called after every decoding step with the rows still running and the token each drew (for
// streaming); returning false stops generation early (the rows end where they are).
using StepCallback = std::function<bool(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens,
                                        const std::vector<float>& logprobs)>;

std::vector<Completion> Generate(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingParams& params, const StepCallback& on_step = {});

// Log-probabilities of `completion` tokens given `prompt` (one forward pass of the whole
// sequence, no cache), at the same temperature as sampling; used by tests and the learner.
std::vector<float> ScoreCompletion(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                   const std::vector<int64_t>& completion, double temperature);

}  // namespace echelon::model
