// Batched sampling. Rows are left-padded so every row's next token sits in the same column,
// which lets one KV cache (with a common length) serve the whole batch; padding slots are
// masked as keys and given no rotary position, so a padded row computes what it would alone.
#include "echelon/model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

namespace echelon::model {
namespace {

struct PaddedBatch {
  at::Tensor ids;        // [B, P] prompts, left-padded
  at::Tensor valid;      // [B, P + N] bool: false for padding; generated slots are valid
  at::Tensor positions;  // [B, P + N] rotary position of each slot (0 for padding)
  int64_t prompt_len = 0;
  bool padded = false;
};

PaddedBatch LeftPad(const std::vector<std::vector<int64_t>>& prompts, int64_t new_tokens, int64_t pad_id) {
  PaddedBatch b;
  const int64_t rows = static_cast<int64_t>(prompts.size());
  for (const auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("Generate: empty prompt (every prompt needs at least one token)");
    b.prompt_len = std::max<int64_t>(b.prompt_len, static_cast<int64_t>(p.size()));
  }
  const int64_t width = b.prompt_len + new_tokens;
  b.ids = at::full({rows, b.prompt_len}, pad_id, at::kLong);
  b.valid = at::ones({rows, width}, at::kBool);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& p = prompts[static_cast<size_t>(r)];
    const int64_t pad = b.prompt_len - static_cast<int64_t>(p.size());
    b.padded = b.padded || pad > 0;
    std::copy(p.begin(), p.end(), b.ids[r].data_ptr<int64_t>() + pad);
    b.valid[r].narrow(0, 0, pad).fill_(false);
  }
  b.positions = (b.valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  return b;
}

// For each row, the index of its prompt among the distinct prompts in order of first appearance.
std::vector<int64_t> DistinctPromptIndex(const std::vector<std::vector<int64_t>>& prompts) {
  std::map<std::vector<int64_t>, int64_t> index;
  std::vector<int64_t> out;
  out.reserve(prompts.size());
  for (const auto& p : prompts) out.push_back(index.emplace(p, static_cast<int64_t>(index.size())).first->second);
  return out;
}

// Keeps the smallest set of most likely tokens whose mass reaches top_p (at least one).
at::Tensor TopP(const at::Tensor& probs, double top_p) {
  auto [sorted, order] = probs.sort(-1, /*descending=*/true);
  at::Tensor mass_before = sorted.cumsum(-1) - sorted;
  at::Tensor drop = mass_before >= top_p;
  drop.select(-1, 0).fill_(false);
  return at::zeros_like(probs).scatter_(-1, order, sorted.masked_fill(drop, 0.0));
}

// Per-row token statistics for the penalties; kept only when one is on.
struct TokenCounts {
  at::Tensor output;  // [B, V] float: how often each token was generated
  at::Tensor seen;    // [B, V] bool: in the prompt or the output

  static TokenCounts Start(const std::vector<std::vector<int64_t>>& prompts, int64_t vocab) {
    TokenCounts c;
    const int64_t rows = static_cast<int64_t>(prompts.size());
    c.output = at::zeros({rows, vocab}, at::kFloat);
    c.seen = at::zeros({rows, vocab}, at::kBool);
    for (int64_t r = 0; r < rows; ++r) {
      bool* row = c.seen[r].data_ptr<bool>();
      for (int64_t id : prompts[static_cast<size_t>(r)])
        if (id >= 0 && id < vocab) row[id] = true;
    }
    return c;
  }
  void Add(const at::Tensor& token) {
    const at::Tensor idx = token.unsqueeze(1);
    output.scatter_add_(1, idx, at::ones({token.size(0), 1}, at::kFloat));
    seen.scatter_(1, idx, true);
  }
};

bool HasPenalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
}

// Steps 1-2 of generate.h on fp32 CPU logits [B, V]; `generated` tokens so far per row (all
// rows generate in lockstep).
at::Tensor Penalize(at::Tensor logits, const SamplingParams& params, const TokenCounts* counts, int64_t generated) {
  const int64_t vocab = logits.size(-1);
  if (generated < params.min_tokens) {
    logits = logits.clone();
    if (!params.ignore_eos && params.eos_token_id >= 0 && params.eos_token_id < vocab)
      logits.select(1, params.eos_token_id).fill_(-INFINITY);
    for (int64_t id : params.stop_token_ids)
      if (id >= 0 && id < vocab) logits.select(1, id).fill_(-INFINITY);
  }
  if (counts) {
    if (params.repetition_penalty != 1.0) {
      const at::Tensor penalized =
          at::where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty);
      logits = at::where(counts->seen, penalized, logits);
    }
    if (params.frequency_penalty != 0.0 || params.presence_penalty != 0.0)
      logits = logits - params.frequency_penalty * counts->output -
               params.presence_penalty * counts->output.gt(0).to(at::kFloat);
  }
  return logits;
}

// Zeroes every probability below min_p x the row's largest (step 4).
at::Tensor MinP(const at::Tensor& probs, double min_p) {
  const at::Tensor threshold = std::get<0>(probs.max(-1, /*keepdim=*/true)) * min_p;
  return probs.masked_fill(probs < threshold, 0.0);
}

// Keeps the k most likely tokens of each row (step 5; ties at the k-th probability kept).
at::Tensor TopK(const at::Tensor& probs, int64_t k) {
  if (k <= 0 || k >= probs.size(-1)) return probs;
  const at::Tensor kth = std::get<0>(probs.topk(k, -1)).narrow(-1, k - 1, 1);
  return probs.masked_fill(probs < kth, 0.0);
}

// Chooses the next token of every row; writes its log-probability (see generate.h). Sampling
// runs in fp32 on the CPU whatever the model's device and dtype, so a seed draws the same
// tokens everywhere.
at::Tensor NextToken(const at::Tensor& device_logits, const SamplingParams& params, const TokenCounts* counts,
                     int64_t generated, at::Generator& gen, at::Tensor* logprob) {
  const at::Tensor logits = device_logits.to(at::kCPU, at::kFloat);
  const at::Tensor drawn_from = Penalize(logits, params, counts, generated);
  const bool shifted = !drawn_from.is_same(logits);
  at::Tensor token;
  at::Tensor logp;
  if (params.temperature <= 0) {
    logp = at::log_softmax(logits, -1);
    token = drawn_from.argmax(-1);
  } else {
    logp = at::log_softmax(logits / params.temperature, -1);
    at::Tensor probs = shifted ? at::softmax(drawn_from / params.temperature, -1) : logp.exp();
    const bool filtered = params.min_p > 0 || (params.top_k > 0 && params.top_k < probs.size(-1));
    if (params.min_p > 0) probs = MinP(probs, params.min_p);
    probs = TopK(probs, params.top_k);
    if (filtered) probs = probs / probs.sum(-1, /*keepdim=*/true);
    if (params.top_p < 1.0) probs = TopP(probs, params.top_p);
    token = at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(1);
  }
  *logprob = logp.gather(-1, token.unsqueeze(1)).squeeze(1);
  return token;
}

std::vector<Completion> Collect(const at::Tensor& tokens, const at::Tensor& logprobs, const at::Tensor& lengths,
                                const at::Tensor& eos) {
  const int64_t steps = tokens.size(1);
  std::vector<Completion> out(static_cast<size_t>(tokens.size(0)));
  for (size_t r = 0; r < out.size(); ++r) {
    const int64_t n = lengths.data_ptr<int64_t>()[r];
    const int64_t* t = tokens.data_ptr<int64_t>() + r * steps;
    const float* lp = logprobs.data_ptr<float>() + r * steps;
    out[r].tokens.assign(t, t + n);
    out[r].logprobs.assign(lp, lp + n);
    out[r].finished_eos = eos.data_ptr<bool>()[r];
  }
  return out;
}

}  // namespace

std::vector<Completion> Generate(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingParams& params, const StepCallback& on_step) {
  if (prompts.empty() || params.max_new_tokens <= 0) return std::vector<Completion>(prompts.size());
  at::NoGradGuard no_grad;
  const int64_t rows = static_cast<int64_t>(prompts.size()), steps = params.max_new_tokens;
  const int64_t pad_id = std::max<int64_t>(model->config().pad_token_id, 0);
  const at::Device device = model->device();
  PaddedBatch b = LeftPad(prompts, steps, pad_id);
  b.ids = b.ids.to(device);
  b.valid = b.valid.to(device);
  b.positions = b.positions.to(device);
  const int64_t p = b.prompt_len;
  const at::Tensor valid = b.padded ? b.valid : at::Tensor();
  auto slots = [&](const at::Tensor& t, int64_t begin, int64_t len) {
    return t.defined() ? t.narrow(1, begin, len) : t;
  };
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(params.seed);
  std::optional<TokenCounts> counts;
  if (HasPenalties(params)) counts = TokenCounts::Start(prompts, model->config().vocab_size);

  KVCache cache;
  at::Tensor logits;
  at::Tensor seq = b.ids;
  if (params.use_cache) {
    const std::vector<int64_t> prompt_of = params.share_prefix ? DistinctPromptIndex(prompts) : std::vector<int64_t>{};
    const int64_t distinct = params.share_prefix ? *std::max_element(prompt_of.begin(), prompt_of.end()) + 1 : rows;
    if (distinct == rows) {
      cache = model->NewCache(rows, p + steps);
      logits = model->Forward(b.ids, b.positions.narrow(1, 0, p), slots(valid, 0, p), &cache).select(1, -1);
    } else {
      // Prefill each distinct prompt once, then give every row its prompt's keys and values.
      std::vector<int64_t> pick;  // the first row of each distinct prompt
      for (int64_t r = 0; r < rows; ++r)
        if (prompt_of[static_cast<size_t>(r)] == static_cast<int64_t>(pick.size())) pick.push_back(r);
      const at::Tensor pick_t = at::tensor(pick, at::kLong).to(device);
      const at::Tensor expand = at::tensor(prompt_of, at::kLong).to(device);
      KVCache shared = model->NewCache(distinct, p + steps);
      const at::Tensor shared_valid = valid.defined() ? valid.index_select(0, pick_t).narrow(1, 0, p) : valid;
      logits = model->Forward(b.ids.index_select(0, pick_t), b.positions.narrow(1, 0, p).index_select(0, pick_t),
                              shared_valid, &shared)
                   .select(1, -1)
                   .index_select(0, expand);
      cache.capacity = shared.capacity;
      cache.length = shared.length;
      for (size_t i = 0; i < shared.k.size(); ++i) {
        cache.k.push_back(shared.k[i].index_select(0, expand));
        cache.v.push_back(shared.v[i].index_select(0, expand));
      }
    }
  }
  at::Tensor tokens = at::zeros({rows, steps}, at::kLong);
  at::Tensor logprobs = at::zeros({rows, steps}, at::kFloat);
  at::Tensor lengths = at::zeros({rows}, at::kLong);
  at::Tensor done = at::zeros({rows}, at::kBool);
  for (int64_t step = 0; step < steps; ++step) {
    if (!params.use_cache) {
      const int64_t len = p + step;
      logits = model->Forward(seq, b.positions.narrow(1, 0, len), slots(valid, 0, len), nullptr).select(1, -1);
    }
    at::Tensor logprob;
    at::Tensor token = NextToken(logits, params, counts ? &*counts : nullptr, step, gen, &logprob);
    if (counts) counts->Add(token);
    tokens.select(1, step).copy_(token);
    logprobs.select(1, step).copy_(logprob);
    // Rows that finished earlier keep running (one batch) but record nothing more.
    lengths.masked_fill_(~done, step + 1);
    bool keep_going = true;
    if (on_step) {
      std::vector<int64_t> live, drawn;
      std::vector<float> lps;
      const auto d = done.accessor<bool, 1>();
      const auto tk = token.accessor<int64_t, 1>();
      const auto lp = logprob.accessor<float, 1>();
      for (int64_t r = 0; r < rows; ++r)
        if (!d[r]) {
          live.push_back(r);
          drawn.push_back(tk[r]);
          lps.push_back(lp[r]);
        }
      keep_going = on_step(live, drawn, lps);
    }
    at::Tensor stop = params.ignore_eos ? at::zeros_like(token, at::kBool) : token == params.eos_token_id;
    for (int64_t id : params.stop_token_ids) stop.logical_or_(token == id);
    done.logical_or_(stop);
    if (!keep_going || step + 1 == steps || done.all().item<bool>()) break;
    if (params.use_cache) {
      logits = model->Forward(token.unsqueeze(1).to(device), b.positions.narrow(1, p + step, 1),
                              slots(valid, 0, p + step + 1), &cache)
                   .select(1, -1);
    } else {
      seq = at::cat({seq, token.unsqueeze(1).to(device)}, 1);
    }
  }
  return Collect(tokens, logprobs, lengths, done);
}

std::vector<float> ScoreCompletion(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                   const std::vector<int64_t>& completion, double temperature) {
  if (prompt.empty()) throw std::invalid_argument("ScoreCompletion: empty prompt");
  if (completion.empty()) return {};
  at::NoGradGuard no_grad;
  std::vector<int64_t> all(prompt);
  all.insert(all.end(), completion.begin(), completion.end());
  const int64_t len = static_cast<int64_t>(all.size()), p = static_cast<int64_t>(prompt.size());
  const int64_t c = static_cast<int64_t>(completion.size());
  at::Tensor ids = at::tensor(all, at::kLong).unsqueeze(0).to(model->device());
  at::Tensor positions = at::arange(len, at::kLong).unsqueeze(0).to(model->device());
  // The logits at position i predict token i + 1.
  at::Tensor logits =
      model->Forward(ids, positions, at::Tensor(), nullptr)[0].narrow(0, p - 1, c).to(at::kCPU, at::kFloat);
  if (temperature > 0) logits = logits / temperature;
  at::Tensor target = at::tensor(completion, at::kLong).unsqueeze(1);
  at::Tensor lp = at::log_softmax(logits, -1).gather(-1, target).squeeze(1).contiguous();
  return std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + c);
}

}  // namespace echelon::model
