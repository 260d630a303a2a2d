// Sampling with a KV cache and continuous batching.
//
//   SamplingParams sp; sp.temperature = 1.0; sp.top_p = 1.0; sp.max_new_tokens = 8; sp.seed = 7;
//   std::vector<Completion> out = Generate(model, prompts, sp);
//
// Rows run in a fixed number of sequence slots (`slots`, default one per row). A row stops at
// EOS or a stop token (kept in its tokens) or at its token limit; its slot then takes the next
// waiting row at once, or is dropped from the batch when none waits, so no step computes a
// finished row. Each slot keeps its own cache length in one block KV cache. Rows with the
// same prompt (a group's G samples) share one prefill, whose keys and values are copied into
// each row's slot.
//
// `logprobs[i]` is the log-probability of `tokens[i]` under the model at the sampling
// temperature: log_softmax(logits / temperature), before any of the processing below (so the
// learner, recomputing with the same temperature, gets the same numbers). temperature == 0 is
// greedy (logprobs then use temperature 1).
//
// What is drawn follows vLLM's sampler, step by step on each row's logits:
//   1. min_tokens: EOS (unless ignore_eos) and the stop tokens cannot be drawn before the row
//      holds min_tokens tokens;
//   2. repetition_penalty r (tokens of the prompt or the output so far: a positive logit is
//      divided by r, a negative one multiplied), then frequency_penalty f and presence_penalty p
//      (output tokens: logit -= f * count + p * [count > 0]);
//   3. temperature (or argmax when 0); 4. min_p (drop tokens below min_p x the most likely
//      one's probability); 5. top_k; 6. top_p; then one draw.
// Filters (4-6) narrow the draw without changing the reported log-probs; the penalties and
// min_tokens shift the draw away from the reported policy, so RL rollouts leave them off
// (rollout.top_k and rollout.min_p exist; the penalties are `echelon serve`'s).
//
// Draws are a function of (seed, sample, position): the token at completion position t of
// sample j (row j, or sample_ids[j]) inverts the cumulative distribution of the filtered
// probabilities (token ids in order) at the counter-based uniform DrawUniform(seed, j, t).
// So a row's tokens depend on the seed, its sample index and its prompt only, not on the slot
// count, the other rows, the order rows were admitted in or where generation was interrupted
// and continued (up to float rounding of the batched arithmetic); and a verifier that
// recomputes the logits by teacher forcing checks that each token is the seeded draw
// (SamplingProbs, SeededToken) without sampling anything.
//
// Every prompt must hold at least one token (an empty one throws std::invalid_argument).
//
// Thread contract: uses the model from the calling thread only; the random streams are local
// to the call.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "echelon/common/routes.h"
#include "echelon/model/qwen3.h"

namespace echelon::model {

struct SamplingParams {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t max_new_tokens = 16;
  int64_t eos_token_id = 2;
  std::vector<int64_t> stop_token_ids;  // also end a row, kept in its tokens as EOS is
  int64_t top_k = 0;                     // <= 0: off
  double min_p = 0.0;                    // 0: off
  double repetition_penalty = 1.0;       // 1: off
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  bool ignore_eos = false;               // EOS does not end a row (stop_token_ids still do)
  int64_t min_tokens = 0;
  uint64_t seed = 0;
  // When not empty, one limit per prompt: row i stops after min(max_new_tokens, this[i]).
  std::vector<int64_t> max_new_tokens_per_row;
  // Sequence slots (rows decoding at once); <= 0: one per row.
  int64_t slots = 0;
  // false: static batches, as a padded-batch engine runs them: a batch of `slots` rows starts
  // together, finished rows keep being computed (their tokens dropped) until the batch's last
  // row ends, and only then does the next batch start (for benchmarks and tests).
  bool continuous = true;
  bool use_cache = true;  // false recomputes the whole prefix each token (for tests/benchmarks)
  // With the cache: rows with the same prompt (a group's G samples) share one prefill, whose
  // keys and values are copied to each of them; false prefills every row (for benchmarks).
  bool share_prefix = true;
  // Row r draws as sample first_row + r: a call over rows [a, b) of a larger batch, with
  // first_row = a, draws what the whole batch's call draws for them.
  int64_t first_row = 0;
  // When not empty, one per prompt: row r draws as sample sample_ids[r] (instead of
  // first_row + r), its first token at completion position first_positions[r] (instead of 0):
  // a continuation of a partial completion draws what the uninterrupted row would have.
  std::vector<int64_t> sample_ids;
  std::vector<int64_t> first_positions;
  // Router replay: > 0 records, for a mixture-of-experts model, the routes of every fed
  // position (prompt and completion) whose top-k margin (RouteTape::margin, nats of router
  // logit) is below it in Completion::routes (1e9: every route). 0: none.
  double route_margin = 0;
};

struct Completion {
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  bool finished_eos = false;
  // SamplingParams::route_margin > 0: the routes recorded, by position (of prompt + tokens)
  // then layer. The last token is never fed, so it has none.
  Routes routes;
  int64_t routes_seen = 0;  // (position, sparse layer) pairs routed, recorded or not
};

// Called after every decoding step with the rows that drew a token and the token each drew
// (for streaming); returning false stops generation early (the rows end where they are; rows
// not yet admitted to a slot end empty).
using StepCallback = std::function<bool(const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens,
                                        const std::vector<float>& logprobs)>;

// What a Generate call computed (for tests and benchmarks).
struct GenerateStats {
  int64_t steps = 0;           // decoding steps (one forward of one token per live slot)
  int64_t decode_rows = 0;     // rows computed over all steps, finished rows of static batches included
  int64_t prefill_tokens = 0;  // prompt tokens run through prefills
};

std::vector<Completion> Generate(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingParams& params, const StepCallback& on_step = {},
                                 GenerateStats* stats = nullptr);

// A pipeline stage after the first (model/pipeline.h) runs the same engine over its layers
// and replays the first stage's draws instead of sampling, so both make the same decisions
// (which rows are admitted, prefilled, retired) and call Forward in the same order.
class DrawSource {
 public:
  virtual ~DrawSource() = default;
  // The tokens drawn at this step for `rows` (in that order); nullopt: generation stopped
  // there (the first stage's on_step returned false).
  virtual std::optional<std::vector<int64_t>> Next(const std::vector<int64_t>& rows) = 0;
};

// Generate with draws from `source`; completions carry the tokens and zero log-probs.
std::vector<Completion> Replay(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                               const SamplingParams& params, DrawSource& source);

// The uniform in [0, 1) (53 bits) that sample `sample` draws its token at completion position
// `position` with, under `seed`: splitmix64 of the three, the same on every platform.
double DrawUniform(uint64_t seed, int64_t sample, int64_t position);
// Steps 3-6 of the sampler on fp32 logits [N, V] (no penalties, no min_tokens): the filtered,
// unnormalised probabilities a draw inverts (temperature > 0).
at::Tensor SamplingProbs(const at::Tensor& logits, const SamplingParams& params);
// Where a uniform lands in one row's filtered probabilities `probs` [V]: the drawn token, and
// how far (in probability mass, as a fraction of the row's total) `token` is from being the
// draw: 0 when it is, else the gap between its cumulative interval and the uniform's point.
struct DrawCheck {
  int64_t drawn = 0;
  double miss = 0;
};
DrawCheck SeededToken(const at::Tensor& probs, double uniform, int64_t token);

// Log-probabilities of `completion` tokens given `prompt` (one forward pass of the whole
// sequence, no cache), at the same temperature as sampling; used by tests and the learner.
std::vector<float> ScoreCompletion(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                   const std::vector<int64_t>& completion, double temperature);

}  // namespace echelon::model
