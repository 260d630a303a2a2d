// The generation engine: sequence slots over one block KV cache with a length per slot (blocks
// added as the longest slot grows), refilled from the queue of waiting rows as rows finish. The
// prompts of the rows admitted together, all but their last token, are prefilled in left-padded
// batches of similar lengths (once per distinct prompt when shared), in tiles of kPrefillTile
// positions, and copied into the rows' slots; the last prompt token is fed by the next decoding
// step together with every other slot's latest token, so every step is one forward of one token
// per live slot.
#include "echelon/model/generate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

#include "echelon/model/decode_attention.h"
#include "echelon/model/token_logprobs.h"

namespace echelon::model {
namespace {

// Prompt positions per prefill forward: long prompts are prefilled in tiles, so the activations
// of one forward (and its attention tiles) stay bounded whatever the prompt's length.
constexpr int64_t kPrefillTile = 2048;

struct PaddedBatch {
  at::Tensor ids;        // [B, P] prompts, left-padded
  at::Tensor valid;      // [B, P] bool: false for padding
  at::Tensor positions;  // [B, P] rotary position of each slot (0 for padding)
  bool padded = false;
};

PaddedBatch LeftPad(const std::vector<std::vector<int64_t>>& seqs, int64_t pad_id) {
  PaddedBatch b;
  const int64_t rows = static_cast<int64_t>(seqs.size());
  int64_t width = 0;
  for (const auto& p : seqs) width = std::max<int64_t>(width, static_cast<int64_t>(p.size()));
  b.ids = at::full({rows, width}, pad_id, at::kLong);
  b.valid = at::ones({rows, width}, at::kBool);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& p = seqs[static_cast<size_t>(r)];
    const int64_t pad = width - static_cast<int64_t>(p.size());
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

// splitmix64's finaliser: spreads (seed, row) over the whole 64-bit seed space.
uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

double DrawUniform(uint64_t seed, int64_t sample, int64_t position) {
  const uint64_t stream = Mix64(seed ^ Mix64(static_cast<uint64_t>(sample)));
  return static_cast<double>(Mix64(stream ^ Mix64(~static_cast<uint64_t>(position))) >> 11) * 0x1.0p-53;
}

namespace {

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
  at::Tensor output;  // [rows, V] float: how often each token was generated
  at::Tensor seen;    // [rows, V] bool: in the prompt or the output

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
  TokenCounts Rows(const at::Tensor& rows) const { return {output.index_select(0, rows), seen.index_select(0, rows)}; }
  // `rows` are distinct, so no (row, token) pair repeats.
  void Add(const at::Tensor& rows, const at::Tensor& token) {
    const c10::List<c10::optional<at::Tensor>> at_pairs({rows, token});
    output.index_put_(at_pairs, at::ones({rows.size(0)}, at::kFloat), /*accumulate=*/true);
    seen.index_put_(at_pairs, at::ones({rows.size(0)}, at::kBool));
  }
};

bool HasPenalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
}

// Steps 1-2 of generate.h on fp32 CPU logits [B, V]; `held` marks the rows still under
// min_tokens (undefined: none).
at::Tensor Penalize(at::Tensor logits, const SamplingParams& params, const TokenCounts* counts, const at::Tensor& held) {
  const int64_t vocab = logits.size(-1);
  if (held.defined()) {
    logits = logits.clone();
    auto block = [&](int64_t id) {
      if (id >= 0 && id < vocab) logits.select(1, id).masked_fill_(held, -INFINITY);
    };
    if (!params.ignore_eos) block(params.eos_token_id);
    for (int64_t id : params.stop_token_ids) block(id);
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

// Steps 4-6 of generate.h on probabilities [N, V].
at::Tensor Filter(at::Tensor probs, const SamplingParams& params) {
  const bool filtered = params.min_p > 0 || (params.top_k > 0 && params.top_k < probs.size(-1));
  if (params.min_p > 0) probs = MinP(probs, params.min_p);
  probs = TopK(probs, params.top_k);
  if (params.top_p < 1.0) {
    if (filtered) probs = probs / probs.sum(-1, /*keepdim=*/true);
    probs = TopP(probs, params.top_p);
  }
  return probs;
}

// Inverse-CDF draw: in each row, the first token whose cumulative probability exceeds the
// row's uniform times its total.
at::Tensor Draw(const at::Tensor& probs, const std::vector<double>& uniforms) {
  const at::Tensor cdf = probs.to(at::kDouble).cumsum(-1);
  const int64_t vocab = cdf.size(-1);
  const at::Tensor target = at::tensor(uniforms, at::kDouble).unsqueeze(1) * cdf.narrow(-1, vocab - 1, 1);
  return at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(vocab - 1);
}

// Chooses the next token of every row; writes its log-probability (see generate.h). Sampling
// runs in fp32 on the CPU whatever the model's device and dtype, so a seed draws the same
// tokens everywhere.
at::Tensor NextToken(const at::Tensor& device_logits, const SamplingParams& params, const TokenCounts* counts,
                     const at::Tensor& held, const std::vector<double>& uniforms, at::Tensor* logprob) {
  const at::Tensor logits = device_logits.to(at::kCPU, at::kFloat);
  const at::Tensor drawn_from = Penalize(logits, params, counts, held);
  const bool shifted = !drawn_from.is_same(logits);
  at::Tensor token;
  at::Tensor logp;
  if (params.temperature <= 0) {
    logp = at::log_softmax(logits, -1);
    token = drawn_from.argmax(-1);
  } else {
    logp = at::log_softmax(logits / params.temperature, -1);
    const at::Tensor probs = shifted ? Filter(at::softmax(drawn_from / params.temperature, -1), params)
                                     : Filter(logp.exp(), params);
    token = Draw(probs, uniforms);  // the draw needs no normalised row
  }
  *logprob = logp.gather(-1, token.unsqueeze(1)).squeeze(1);
  return token;
}

}  // namespace

at::Tensor SamplingProbs(const at::Tensor& logits, const SamplingParams& params) {
  return Filter(at::softmax(logits.to(at::kFloat) / params.temperature, -1), params);
}

DrawCheck SeededToken(const at::Tensor& probs, double uniform, int64_t token) {
  const at::Tensor cdf = probs.to(at::kCPU, at::kDouble).contiguous().cumsum(-1);
  const double* c = cdf.data_ptr<double>();
  const int64_t vocab = cdf.numel();
  const double total = c[vocab - 1], target = uniform * total;
  DrawCheck out;
  out.drawn = std::min<int64_t>(std::upper_bound(c, c + vocab, target) - c, vocab - 1);
  if (token < 0 || token >= vocab) {
    out.miss = 1.0;
    return out;
  }
  // Token t is drawn for targets in [cdf[t-1], cdf[t]).
  const double lo = token > 0 ? c[token - 1] : 0.0, hi = c[token];
  const double gap = target < lo ? lo - target : target >= hi ? target - hi : 0.0;
  out.miss = out.drawn == token ? 0.0 : total > 0 ? std::max(gap, 0.0) / total : 1.0;
  return out;
}

namespace {

class Engine {
 public:
  Engine(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& params,
         DrawSource* replay = nullptr)
      : model_(model),
        replay_(replay),
        prompts_(prompts),
        params_(params),
        device_(model->device()),
        rows_(static_cast<int64_t>(prompts.size())),
        slots_(params.slots > 0 ? std::min(params.slots, rows_) : rows_),
        slot_row_(static_cast<size_t>(slots_)),
        slot_token_(static_cast<size_t>(slots_)),
        slot_done_(static_cast<size_t>(slots_)),
        slot_base_(static_cast<size_t>(slots_)),
        slot_prefix_(static_cast<size_t>(slots_)),
        by_reference_(params.use_cache &&
                      DecodeAttentionSupports(at::empty({0}, at::TensorOptions().dtype(model->dtype()).device(device_)))),
        record_routes_(params.route_margin > 0 && model->config().moe() && replay == nullptr),
        out_(prompts.size()) {
    int64_t longest = 0;
    for (const auto& p : prompts) {
      if (p.empty()) throw std::invalid_argument("Generate: empty prompt (every prompt needs at least one token)");
      longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
    }
    if (!params.max_new_tokens_per_row.empty() && params.max_new_tokens_per_row.size() != prompts.size())
      throw std::invalid_argument("Generate: max_new_tokens_per_row holds " +
                                  std::to_string(params.max_new_tokens_per_row.size()) + " limits for " +
                                  std::to_string(prompts.size()) + " prompts");
    for (const auto* v : {&params.sample_ids, &params.first_positions})
      if (!v->empty() && v->size() != prompts.size())
        throw std::invalid_argument("Generate: sample_ids / first_positions hold " + std::to_string(v->size()) +
                                    " entries for " + std::to_string(prompts.size()) + " prompts");
    if (HasPenalties(params)) counts_ = TokenCounts::Start(prompts, model->config().vocab_size);
    if (params.use_cache) {
      // By reference a slot holds only its own tokens: the last prompt token and the generated.
      cache_ = model->NewCache(slots_, (by_reference_ ? 1 : longest) + params.max_new_tokens);
      cache_.row_lengths.assign(static_cast<size_t>(slots_), 0);
      if (params.share_prefix) {
        prompt_of_ = DistinctPromptIndex(prompts);
        waiting_of_prompt_.assign(static_cast<size_t>(*std::max_element(prompt_of_.begin(), prompt_of_.end()) + 1), 0);
        for (int64_t d : prompt_of_) ++waiting_of_prompt_[static_cast<size_t>(d)];
      }
    }
    if (record_routes_) {  // last: nothing after it throws, so the destructor takes it back
      tape_.record = true;
      model->SetRouteTape(&tape_);
    }
  }

  ~Engine() {
    if (record_routes_) model_->SetRouteTape(nullptr);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::vector<Completion> Run(const StepCallback& on_step) {
    Fill();
    while (live_ > 0) {
      const at::Tensor logits = Forward();  // undefined when replaying
      std::vector<int64_t> drawing, rows;  // slots (and their rows) that draw this step
      for (int64_t s = 0; s < live_; ++s) {
        if (slot_done_[static_cast<size_t>(s)]) continue;
        drawing.push_back(s);
        rows.push_back(slot_row_[static_cast<size_t>(s)]);
      }
      const int64_t n = static_cast<int64_t>(rows.size());
      if (replay_ != nullptr) {
        const std::optional<std::vector<int64_t>> drawn = replay_->Next(rows);
        if (!drawn) break;
        if (static_cast<int64_t>(drawn->size()) != n)
          throw std::runtime_error("Replay: " + std::to_string(drawn->size()) + " tokens for " + std::to_string(n) +
                                   " rows");
        Record(drawing, rows, *drawn, std::vector<float>(static_cast<size_t>(n), 0.0f));
        continue;
      }
      const at::Tensor rows_t = at::tensor(rows, at::kLong);
      at::Tensor held;
      if (params_.min_tokens > 0) {
        std::vector<int64_t> generated;
        for (int64_t r : rows) generated.push_back(static_cast<int64_t>(out_[static_cast<size_t>(r)].tokens.size()));
        held = at::tensor(generated, at::kLong) < params_.min_tokens;
      }
      std::vector<double> uniforms;
      if (params_.temperature > 0)
        for (int64_t r : rows) {
          const size_t i = static_cast<size_t>(r);
          const int64_t sample = i < params_.sample_ids.size() ? params_.sample_ids[i] : params_.first_row + r;
          const int64_t first = i < params_.first_positions.size() ? params_.first_positions[i] : 0;
          uniforms.push_back(DrawUniform(params_.seed, sample, first + static_cast<int64_t>(out_[i].tokens.size())));
        }
      std::optional<TokenCounts> counts;
      if (counts_) counts = counts_->Rows(rows_t);
      at::Tensor logprob;
      const at::Tensor token =
          NextToken(n == live_ ? logits : logits.index_select(0, at::tensor(drawing, at::kLong).to(device_)), params_,
                    counts ? &*counts : nullptr, held, uniforms, &logprob);
      if (counts_) counts_->Add(rows_t, token);

      const at::Tensor token_c = token.contiguous(), logprob_c = logprob.contiguous();
      const std::vector<int64_t> drawn(token_c.data_ptr<int64_t>(), token_c.data_ptr<int64_t>() + n);
      const std::vector<float> logprobs(logprob_c.data_ptr<float>(), logprob_c.data_ptr<float>() + n);
      if (on_step && !on_step(rows, drawn, logprobs)) {
        Append(drawing, rows, drawn, logprobs);
        break;
      }
      Record(drawing, rows, drawn, logprobs);
    }
    if (record_routes_)
      for (Completion& c : out_) SortRoutes(&c.routes);
    return std::move(out_);
  }
  const GenerateStats& stats() const { return stats_; }

 private:
  // Hands each route the last Forward recorded to keep(flat position, layer, experts, k), experts
  // nullptr where the margin is not below the threshold (counted, not kept).
  template <typename Keep>
  void TakeRoutes(Keep keep) {
    for (size_t l = 0; l < tape_.chosen.size(); ++l) {
      if (!tape_.chosen[l].defined()) continue;
      const at::Tensor chosen = tape_.chosen[l].contiguous(), margin = tape_.margin[l].contiguous();
      const int64_t k = chosen.size(1);
      const float* m = margin.data_ptr<float>();
      const int64_t* c = chosen.data_ptr<int64_t>();
      for (int64_t i = 0; i < margin.numel(); ++i)
        keep(i, static_cast<int16_t>(l), m[i] < params_.route_margin ? c + i * k : nullptr, static_cast<size_t>(k));
    }
    tape_.chosen.clear();
    tape_.margin.clear();
  }
  // By position, then layer.
  static void SortRoutes(Routes* r) {
    const size_t n = r->size(), k = r->k();
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_pair(r->positions[a], r->layers[a]) < std::make_pair(r->positions[b], r->layers[b]);
    });
    Routes sorted;
    for (size_t i : order) {
      const std::vector<int64_t> e(r->experts.begin() + static_cast<std::ptrdiff_t>(i * k),
                                   r->experts.begin() + static_cast<std::ptrdiff_t>((i + 1) * k));
      sorted.Add(r->positions[i], r->layers[i], e.data(), k);
    }
    *r = std::move(sorted);
  }

  // Appends this step's draws to the rows' completions; returns the slots whose rows ended.
  std::vector<int64_t> Append(const std::vector<int64_t>& drawing, const std::vector<int64_t>& rows,
                              const std::vector<int64_t>& drawn, const std::vector<float>& logprobs) {
    std::vector<int64_t> finished;
    for (size_t u = 0; u < rows.size(); ++u) {
      Completion& c = out_[static_cast<size_t>(rows[u])];
      c.tokens.push_back(drawn[u]);
      c.logprobs.push_back(logprobs[u]);
      const bool stop = (!params_.ignore_eos && drawn[u] == params_.eos_token_id) ||
                        std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), drawn[u]) !=
                            params_.stop_token_ids.end();
      c.finished_eos = stop;
      if (stop || static_cast<int64_t>(c.tokens.size()) >= Limit(rows[u])) finished.push_back(drawing[u]);
      slot_token_[static_cast<size_t>(drawing[u])] = drawn[u];
    }
    return finished;
  }
  // Appends the draws, then frees the finished slots and refills them.
  void Record(const std::vector<int64_t>& drawing, const std::vector<int64_t>& rows, const std::vector<int64_t>& drawn,
              const std::vector<float>& logprobs) {
    Retire(Append(drawing, rows, drawn, logprobs));
    Fill();
  }

  int64_t Limit(int64_t row) const {
    const auto& per_row = params_.max_new_tokens_per_row;
    return per_row.empty() ? params_.max_new_tokens
                           : std::min(params_.max_new_tokens, per_row[static_cast<size_t>(row)]);
  }

  // Admits waiting rows into free slots (static batches: only once the whole batch is done).
  void Fill() {
    if (!params_.continuous && live_ > 0) return;
    std::vector<int64_t> admit;
    while (live_ + static_cast<int64_t>(admit.size()) < slots_ && next_row_ < rows_) {
      const int64_t row = next_row_++;
      if (Limit(row) > 0) admit.push_back(row);
      else if (!prompt_of_.empty()) TakeShared(row);
    }
    if (admit.empty()) return;
    if (params_.use_cache) Prefill(admit);
    for (int64_t row : admit) Admit(live_++, row);
  }

  // The prefill a row takes: its distinct prompt's when shared, its own otherwise.
  int64_t PrefillKey(int64_t row) const { return prompt_of_.empty() ? -1 - row : PromptOf(row); }

  // Prefills every prompt (all but its last token) that the rows need and that is not
  // prefilled yet, in left-padded batches of similar lengths: longest first, a batch takes
  // prompts down to kPadFloor of its longest, so padding stays under a quarter of its tokens.
  void Prefill(const std::vector<int64_t>& rows) {
    constexpr double kPadFloor = 0.75;
    std::vector<std::pair<int64_t, std::vector<int64_t>>> todo;  // (key, prefix)
    for (int64_t row : rows) {
      const std::vector<int64_t>& prompt = prompts_[static_cast<size_t>(row)];
      const int64_t key = PrefillKey(row);
      const bool queued = std::any_of(todo.begin(), todo.end(), [&](const auto& t) { return t.first == key; });
      if (prompt.size() == 1 || prefills_.count(key) > 0 || queued) continue;
      todo.emplace_back(key, std::vector<int64_t>(prompt.begin(), prompt.end() - 1));
    }
    std::stable_sort(todo.begin(), todo.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    for (size_t first = 0; first < todo.size();) {
      size_t end = first + 1;
      while (end < todo.size() &&
             static_cast<double>(todo[end].second.size()) >= kPadFloor * static_cast<double>(todo[first].second.size()))
        ++end;
      PrefillBatch(todo.begin() + static_cast<std::ptrdiff_t>(first), todo.begin() + static_cast<std::ptrdiff_t>(end));
      first = end;
    }
  }

  template <typename It>
  void PrefillBatch(It begin, It end) {
    std::vector<std::vector<int64_t>> prefixes;
    for (It it = begin; it != end; ++it) prefixes.push_back(it->second);
    const PaddedBatch b = LeftPad(prefixes, std::max<int64_t>(model_->config().pad_token_id, 0));
    const int64_t width = b.ids.size(1);
    KVCache batch = model_->NewCache(static_cast<int64_t>(prefixes.size()), width);
    // In tiles of kPrefillTile positions: a long prompt's activations stay one tile long.
    const at::Tensor valid = b.padded ? b.valid.to(device_) : at::Tensor();
    for (int64_t first = 0; first < width; first += kPrefillTile) {
      const int64_t n = std::min(kPrefillTile, width - first);
      model_->Forward(b.ids.narrow(1, first, n).to(device_), b.positions.narrow(1, first, n).to(device_), valid, &batch,
                      /*compute_logits=*/false);
      if (record_routes_)
        TakeRoutes([&](int64_t i, int16_t layer, const int64_t* experts, size_t k) {
          const int64_t j = i / n, position = first + i % n - (width - static_cast<int64_t>(prefixes[j].size()));
          if (position < 0) return;  // padding
          Completion& r = prefill_routes_[(begin + j)->first];
          ++r.routes_seen;
          if (experts != nullptr) r.routes.Add(static_cast<int32_t>(position), layer, experts, k);
        });
    }
    int64_t j = 0;
    for (It it = begin; it != end; ++it, ++j) {
      const int64_t len = static_cast<int64_t>(it->second.size());
      stats_.prefill_tokens += len;
      KVPrefix& entry = prefills_[it->first];
      entry.length = len;
      for (size_t i = 0; i < batch.layers(); ++i) {  // the batch's valid columns, [KV, len, D]
        entry.k.push_back(batch.Read(i, /*keys=*/true, j, width - len, len));
        entry.v.push_back(batch.Read(i, /*keys=*/false, j, width - len, len));
      }
    }
  }

  // Puts `row` in `slot`: its prompt but the last token as the slot's prefix (its prefill, read
  // in place or copied into the slot's cache), the last token to be fed next.
  void Admit(int64_t slot, int64_t row) {
    const size_t s = static_cast<size_t>(slot);
    const std::vector<int64_t>& prompt = prompts_[static_cast<size_t>(row)];
    const int64_t prefix = static_cast<int64_t>(prompt.size()) - 1;
    slot_row_[s] = row;
    slot_token_[s] = prompt.back();
    slot_done_[s] = false;
    if (!params_.use_cache) return;
    const int64_t key = PrefillKey(row);
    if (const auto routed = prefill_routes_.find(key); routed != prefill_routes_.end()) {
      out_[static_cast<size_t>(row)].routes = routed->second.routes;
      out_[static_cast<size_t>(row)].routes_seen = routed->second.routes_seen;
    }
    if (by_reference_) {
      cache_.row_lengths[s] = 0;
      slot_base_[s] = prefix;
      slot_prefix_[s] = prefix > 0 ? &prefills_.at(key) : nullptr;
      if (prefix > 0) ++readers_[key];
    } else {
      cache_.row_lengths[s] = prefix;
      if (prefix > 0) {
        const KVPrefix& source = prefills_.at(key);
        cache_.Reserve(prefix);
        for (size_t i = 0; i < cache_.layers(); ++i) cache_.WriteRow(i, slot, 0, source.k[i], source.v[i]);
      }
    }
    if (!prompt_of_.empty()) TakeShared(row);
    else MaybeFree(key);
  }

  // The slot's row is done with its prefix.
  void Vacate(int64_t slot) {
    const size_t s = static_cast<size_t>(slot);
    if (slot_prefix_[s] == nullptr) return;
    slot_prefix_[s] = nullptr;
    const int64_t key = PrefillKey(slot_row_[s]);
    --readers_[key];
    MaybeFree(key);
  }

  int64_t PromptOf(int64_t row) const { return prompt_of_[static_cast<size_t>(row)]; }
  // `row` no longer waits for its shared prefill.
  void TakeShared(int64_t row) {
    --waiting_of_prompt_[static_cast<size_t>(PromptOf(row))];
    MaybeFree(PromptOf(row));
  }
  // Frees a prefill that no row waits for or reads.
  void MaybeFree(int64_t key) {
    if (key >= 0 && waiting_of_prompt_[static_cast<size_t>(key)] > 0) return;
    const auto it = readers_.find(key);
    if (it != readers_.end() && it->second > 0) return;
    if (it != readers_.end()) readers_.erase(it);
    prefills_.erase(key);
    prefill_routes_.erase(key);
  }

  // One token per live slot -> logits [live, V].
  at::Tensor Forward() {
    ++stats_.steps;
    stats_.decode_rows += live_;
    const at::Tensor ids =
        at::tensor(std::vector<int64_t>(slot_token_.begin(), slot_token_.begin() + live_), at::kLong).view({live_, 1});
    if (!params_.use_cache) {  // each row's whole sequence so far, left-padded
      std::vector<std::vector<int64_t>> seqs;
      for (int64_t s = 0; s < live_; ++s) {
        const int64_t row = slot_row_[static_cast<size_t>(s)];
        seqs.push_back(prompts_[static_cast<size_t>(row)]);
        const std::vector<int64_t>& drawn = out_[static_cast<size_t>(row)].tokens;
        seqs.back().insert(seqs.back().end(), drawn.begin(), drawn.end());
      }
      const PaddedBatch b = LeftPad(seqs, std::max<int64_t>(model_->config().pad_token_id, 0));
      const at::Tensor logits = model_->Forward(b.ids.to(device_), b.positions.to(device_),
                                                b.padded ? b.valid.to(device_) : at::Tensor(), nullptr);
      const int64_t width = b.ids.size(1);
      if (record_routes_)  // each row's last column: the token fed now
        TakeRoutes([&](int64_t i, int16_t layer, const int64_t* experts, size_t k) {
          const int64_t s = i / width;
          if (i % width == width - 1) KeepRoute(s, static_cast<int64_t>(seqs[s].size()) - 1, layer, experts, k);
        });
      return logits.defined() ? logits.select(1, -1) : logits;
    }
    // The live slots' rows of the cache, with the block their next token needs.
    cache_.Reserve(*std::max_element(cache_.row_lengths.begin(), cache_.row_lengths.begin() + live_) + 1);
    KVCache view = cache_.Rows(0, live_);
    view.row_lengths.assign(cache_.row_lengths.begin(), cache_.row_lengths.begin() + live_);
    if (by_reference_) view.row_prefix.assign(slot_prefix_.begin(), slot_prefix_.begin() + live_);
    std::vector<int64_t> positions_at(static_cast<size_t>(live_));
    for (size_t s = 0; s < positions_at.size(); ++s) positions_at[s] = slot_base_[s] + view.row_lengths[s];
    const at::Tensor positions = at::tensor(positions_at, at::kLong).view({live_, 1});
    const at::Tensor logits = model_->Forward(ids.to(device_), positions.to(device_), at::Tensor(), &view);
    std::copy(view.row_lengths.begin(), view.row_lengths.end(), cache_.row_lengths.begin());
    if (record_routes_)
      TakeRoutes([&](int64_t s, int16_t layer, const int64_t* experts, size_t k) {
        KeepRoute(s, positions_at[static_cast<size_t>(s)], layer, experts, k);
      });
    return logits.defined() ? logits.select(1, 0) : logits;
  }

  // A decoding step's route of `slot`'s fed token at `position` (none for a finished row of a
  // static batch).
  void KeepRoute(int64_t slot, int64_t position, int16_t layer, const int64_t* experts, size_t k) {
    if (slot_done_[static_cast<size_t>(slot)]) return;
    Completion& c = out_[static_cast<size_t>(slot_row_[static_cast<size_t>(slot)])];
    ++c.routes_seen;
    if (experts != nullptr) c.routes.Add(static_cast<int32_t>(position), layer, experts, k);
  }

  // Frees the finished slots: continuous batching moves the last live slot into each (so live
  // slots stay [0, live)); static batches keep computing them until all are done.
  void Retire(const std::vector<int64_t>& finished) {
    if (!params_.continuous) {
      for (int64_t s : finished) slot_done_[static_cast<size_t>(s)] = true;
      if (std::all_of(slot_done_.begin(), slot_done_.begin() + live_, [](bool d) { return d; })) {
        for (int64_t s = 0; s < live_; ++s) Vacate(s);
        live_ = 0;
      }
      return;
    }
    for (auto it = finished.rbegin(); it != finished.rend(); ++it) {  // descending: `last` is never finished
      Vacate(*it);
      const int64_t last = --live_;
      if (*it != last) MoveSlot(last, *it);
    }
  }

  void MoveSlot(int64_t from, int64_t to) {
    const size_t f = static_cast<size_t>(from), t = static_cast<size_t>(to);
    slot_row_[t] = slot_row_[f];
    slot_token_[t] = slot_token_[f];
    slot_done_[t] = slot_done_[f];
    slot_base_[t] = slot_base_[f];
    slot_prefix_[t] = slot_prefix_[f];
    slot_prefix_[f] = nullptr;
    if (!params_.use_cache) return;
    const int64_t len = cache_.row_lengths[f];
    cache_.row_lengths[t] = len;
    cache_.CopyRow(from, to, len);
  }

  Qwen3Model& model_;
  DrawSource* const replay_;
  const std::vector<std::vector<int64_t>>& prompts_;
  const SamplingParams& params_;
  const at::Device device_;
  const int64_t rows_, slots_;
  int64_t next_row_ = 0;  // the first row not yet admitted
  int64_t live_ = 0;      // slots [0, live_) hold rows
  std::vector<int64_t> slot_row_, slot_token_;  // each slot's row, and the token it feeds next
  std::vector<bool> slot_done_;                 // static batches: finished, still computed
  // Prompts read in place by the fused decoding attention (by_reference_): each slot's prefix
  // (its prefill) and the position of its first own token; otherwise prefixes are copied into
  // the slots and slot_base_ stays 0.
  std::vector<int64_t> slot_base_;
  std::vector<const KVPrefix*> slot_prefix_;
  const bool by_reference_;
  KVCache cache_;                               // [slots, ...], a length per slot, blocks as rows grow
  // Prefix sharing: each row's distinct prompt and the rows of each not yet admitted. The
  // prefills (all but the last token) of the rows being admitted, by PrefillKey.
  std::vector<int64_t> prompt_of_;
  std::vector<int64_t> waiting_of_prompt_;
  std::map<int64_t, KVPrefix> prefills_;  // std::map: slot_prefix_ points into it
  std::map<int64_t, int64_t> readers_;   // live rows reading each prefill in place
  // Router replay: the tape the model records into, and each prefill's routes (by PrefillKey).
  const bool record_routes_;
  RouteTape tape_;
  std::map<int64_t, Completion> prefill_routes_;
  std::vector<Completion> out_;
  std::optional<TokenCounts> counts_;
  GenerateStats stats_;
};

}  // namespace

std::vector<Completion> Generate(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingParams& params, const StepCallback& on_step, GenerateStats* stats) {
  if (prompts.empty() || params.max_new_tokens <= 0) return std::vector<Completion>(prompts.size());
  at::NoGradGuard no_grad;
  Engine engine(model, prompts, params);
  std::vector<Completion> out = engine.Run(on_step);
  if (stats != nullptr) *stats = engine.stats();
  return out;
}

std::vector<Completion> Replay(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                               const SamplingParams& params, DrawSource& source) {
  if (prompts.empty() || params.max_new_tokens <= 0) return std::vector<Completion>(prompts.size());
  at::NoGradGuard no_grad;
  Engine engine(model, prompts, params, &source);
  return engine.Run({});
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
  const at::Tensor ids = at::tensor(all, at::kLong).unsqueeze(0).to(model->device());
  const at::Tensor positions = at::arange(len, at::kLong).unsqueeze(0).to(model->device());
  // The hidden state at position i predicts token i + 1; log-probs in chunks (no [len, V] logits).
  const at::Tensor hidden = model->Hidden(ids, positions, at::Tensor())[0].narrow(0, p - 1, c);
  const at::Tensor target = at::tensor(completion, at::kLong).to(model->device());
  const at::Tensor lp =
      TokenLogProbs(hidden, model->head(), target, temperature > 0 ? temperature : 1.0).to(at::kCPU).contiguous();
  return std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + c);
}

}  // namespace echelon::model
