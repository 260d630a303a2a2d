#include "echelon/model/generate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/testing.h"

namespace echelon::model {
namespace {

// The reference-written tied checkpoint: random weights scaled so that next-token
// distributions are peaked but not one-hot, which makes sampling and top-p meaningful.
Qwen3Model ReferenceModel() {
  const std::string dir = std::string(ECHELON_TEST_DATA) + "/model/qwen3_tied/";
  Result<ModelConfig> cfg = ModelConfig::FromJsonText(ReadFile(dir + "config.json").value(), dir + "config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  Qwen3Model m(cfg.value());
  Status st = m->LoadStateDict(ReadSafetensors(dir + "model.safetensors").value().tensors, dir);
  EXPECT_TRUE(st.ok()) << st.message();
  return m;
}

// Prompts of different lengths, so the batch is left-padded.
const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 200, 3}, {9}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {250, 42}};

SamplingParams Params(double temperature, uint64_t seed, bool use_cache) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_new_tokens = 12;
  p.eos_token_id = -1;  // never stop early unless a test asks
  p.seed = seed;
  p.use_cache = use_cache;
  return p;
}

std::vector<std::vector<int64_t>> Tokens(const std::vector<Completion>& out) {
  std::vector<std::vector<int64_t>> t;
  for (const Completion& c : out) t.push_back(c.tokens);
  return t;
}

double MaxLogprobDiff(const std::vector<Completion>& a, const std::vector<Completion>& b) {
  double m = 0;
  for (size_t r = 0; r < a.size(); ++r) {
    for (size_t i = 0; i < a[r].logprobs.size(); ++i)
      m = std::max(m, double(std::abs(a[r].logprobs[i] - b[r].logprobs[i])));
  }
  return m;
}

TEST(GenerateTest, CacheAndNoCacheAgreeGreedyAndSampled) {
  Qwen3Model m = ReferenceModel();
  const auto cached = Generate(m, kPrompts, Params(0.0, 0, true));
  const auto uncached = Generate(m, kPrompts, Params(0.0, 0, false));
  ASSERT_EQ(cached.size(), kPrompts.size());
  EXPECT_EQ(Tokens(cached), Tokens(uncached));
  EXPECT_LT(MaxLogprobDiff(cached, uncached), 1e-5);
  for (const Completion& c : cached) {
    EXPECT_EQ(c.tokens.size(), 12u);
    EXPECT_FALSE(c.finished_eos);
  }

  const auto sampled = Generate(m, kPrompts, Params(1.0, 7, true));
  EXPECT_EQ(Tokens(sampled), Tokens(Generate(m, kPrompts, Params(1.0, 7, false))));
  EXPECT_EQ(Tokens(sampled), Tokens(Generate(m, kPrompts, Params(1.0, 7, true)))) << "same seed, same tokens";
  EXPECT_NE(Tokens(sampled), Tokens(Generate(m, kPrompts, Params(1.0, 8, true)))) << "the seed must matter";
  EXPECT_NE(Tokens(sampled), Tokens(cached)) << "temperature 1 should not reduce to greedy on this model";
}

TEST(GenerateTest, SampledLogprobsEqualRescoringPerRow) {
  Qwen3Model m = ReferenceModel();
  for (double temperature : {0.0, 0.7, 1.3}) {
    SamplingParams p = Params(temperature, 3, true);
    p.top_p = 0.9;
    const auto out = Generate(m, kPrompts, p);
    for (size_t r = 0; r < kPrompts.size(); ++r) {
      const auto rescored = ScoreCompletion(m, kPrompts[r], out[r].tokens, temperature);
      ASSERT_EQ(rescored.size(), out[r].logprobs.size());
      for (size_t i = 0; i < rescored.size(); ++i) {
        EXPECT_NEAR(out[r].logprobs[i], rescored[i], 1e-4) << "T=" << temperature << " row " << r << " token " << i;
        EXPECT_LE(out[r].logprobs[i], 0.0f);
      }
    }
  }
}

TEST(GenerateTest, LogprobsUseTheSamplingTemperature) {
  Qwen3Model m = ReferenceModel();
  const auto out = Generate(m, {kPrompts[0]}, Params(0.5, 1, true));
  const auto at_t1 = ScoreCompletion(m, kPrompts[0], out[0].tokens, 1.0);
  const auto at_t05 = ScoreCompletion(m, kPrompts[0], out[0].tokens, 0.5);
  double diff_t1 = 0;
  for (size_t i = 0; i < at_t1.size(); ++i)
    diff_t1 = std::max(diff_t1, double(std::abs(at_t1[i] - out[0].logprobs[i])));
  EXPECT_GT(diff_t1, 1e-3) << "logprobs must be of logits / temperature, not of raw logits";
  EXPECT_NEAR(out[0].logprobs[0], at_t05[0], 1e-4);
}

TEST(GenerateTest, BatchedGenerationEqualsOneByOne) {
  Qwen3Model m = ReferenceModel();
  const auto batch = Generate(m, kPrompts, Params(0.0, 0, true));
  for (size_t r = 0; r < kPrompts.size(); ++r) {
    const auto alone = Generate(m, {kPrompts[r]}, Params(0.0, 0, true));
    EXPECT_EQ(alone[0].tokens, batch[r].tokens) << "row " << r;
  }
}

TEST(GenerateTest, TinyTopPIsGreedy) {
  Qwen3Model m = ReferenceModel();
  SamplingParams p = Params(1.0, 99, true);
  p.top_p = 1e-6;
  const auto nucleus = Generate(m, kPrompts, p);
  const auto greedy = Generate(m, kPrompts, Params(0.0, 0, true));
  EXPECT_EQ(Tokens(nucleus), Tokens(greedy));
  EXPECT_LT(MaxLogprobDiff(nucleus, greedy), 1e-6) << "top-p must not change the reported logprobs";
}

TEST(GenerateTest, EosStopsEachRowAndIsKept) {
  Qwen3Model m = ReferenceModel();
  const auto free_run = Generate(m, kPrompts, Params(0.0, 0, true));
  SamplingParams p = Params(0.0, 0, true);
  p.eos_token_id = free_run[0].tokens[3];
  const auto stopped = Generate(m, kPrompts, p);
  int finished = 0;
  for (size_t r = 0; r < kPrompts.size(); ++r) {
    const auto& full = free_run[r].tokens;
    auto it = std::find(full.begin(), full.end(), p.eos_token_id);
    const bool has_eos = it != full.end();
    const std::vector<int64_t> expected(full.begin(), has_eos ? it + 1 : full.end());
    EXPECT_EQ(stopped[r].tokens, expected) << "row " << r;
    EXPECT_EQ(stopped[r].logprobs.size(), expected.size());
    EXPECT_EQ(stopped[r].finished_eos, has_eos) << "row " << r;
    finished += has_eos;
  }
  EXPECT_GE(finished, 1);
  EXPECT_LE(stopped[0].tokens.size(), 4u);
}

TEST(GenerateTest, EosAsFirstTokenGivesOneTokenCompletion) {
  Qwen3Model m = ReferenceModel();
  const auto free_run = Generate(m, {kPrompts[1]}, Params(0.0, 0, true));
  SamplingParams p = Params(0.0, 0, true);
  p.eos_token_id = free_run[0].tokens[0];
  const auto out = Generate(m, {kPrompts[1]}, p);
  EXPECT_EQ(out[0].tokens.size(), 1u);
  EXPECT_TRUE(out[0].finished_eos);
}

TEST(GenerateTest, DefaultTinyModelProducesValidTokens) {
  ModelConfig c;
  c.vocab_size = 17;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.tie_word_embeddings = true;
  Qwen3Model m(c);
  m->InitWeights(1);
  SamplingParams p;
  p.max_new_tokens = 5;
  p.eos_token_id = 2;
  const auto out = Generate(m, std::vector<std::vector<int64_t>>(8, {1, 6, 10, 13}), p);
  for (const Completion& comp : out) {
    ASSERT_FALSE(comp.tokens.empty());
    EXPECT_LE(comp.tokens.size(), 5u);
    EXPECT_EQ(comp.finished_eos, comp.tokens.back() == 2);
    for (int64_t t : comp.tokens) EXPECT_TRUE(t >= 0 && t < 17) << t;
  }
  EXPECT_TRUE(Generate(m, {{1, 2}}, SamplingParams{1.0, 1.0, 0}).at(0).tokens.empty());
}

}  // namespace
}  // namespace echelon::model

namespace echelon::model {
namespace {

// Greedy decoding with vLLM's penalties computed by hand: a whole forward pass per token (no
// cache) and plain loops over the logits, independent of Generate's tensor code.
std::vector<int64_t> HandPenalizedGreedy(Qwen3Model& m, const std::vector<int64_t>& prompt, int64_t steps,
                                         double repetition, double frequency, double presence) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt, out;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t len = static_cast<int64_t>(seq.size());
    at::Tensor ids = at::tensor(seq, at::kLong).unsqueeze(0);
    at::Tensor logits = m->Forward(ids, at::arange(len, at::kLong).unsqueeze(0), at::Tensor(), nullptr)[0][len - 1]
                            .to(at::kFloat)
                            .contiguous();
    std::vector<float> l(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
    for (size_t v = 0; v < l.size(); ++v) {
      const int64_t id = static_cast<int64_t>(v);
      const bool seen = std::count(seq.begin(), seq.end(), id) > 0;
      const auto count = static_cast<float>(std::count(out.begin(), out.end(), id));
      if (seen) l[v] = l[v] > 0 ? l[v] / static_cast<float>(repetition) : l[v] * static_cast<float>(repetition);
      l[v] -= static_cast<float>(frequency) * count + static_cast<float>(presence) * (count > 0 ? 1.0f : 0.0f);
    }
    const int64_t next = std::max_element(l.begin(), l.end()) - l.begin();
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

TEST(SamplerTest, PenaltiesEqualAHandComputation) {
  Qwen3Model m = ReferenceModel();
  m->eval();
  const std::vector<int64_t> prompt = kPrompts[2];
  struct Case {
    double repetition, frequency, presence;
  };
  for (const Case c : {Case{1.8, 0, 0}, Case{1, 5, 0}, Case{1, 0, 50}, Case{1.3, 2.5, -0.2}}) {
    SamplingParams p = Params(0.0, 0, true);
    p.repetition_penalty = c.repetition;
    p.frequency_penalty = c.frequency;
    p.presence_penalty = c.presence;
    const std::vector<int64_t> want = HandPenalizedGreedy(m, prompt, p.max_new_tokens, c.repetition, c.frequency, c.presence);
    EXPECT_EQ(Generate(m, {prompt}, p)[0].tokens, want) << c.repetition << " " << c.frequency << " " << c.presence;
    EXPECT_NE(want, Generate(m, {prompt}, Params(0.0, 0, true))[0].tokens)
        << "the case must change what greedy decoding picks: " << c.repetition << " " << c.frequency << " " << c.presence;
  }
}

TEST(SamplerTest, TopKOfOneAndMinPOfOneAreGreedyAndKeepTheLogprobs) {
  Qwen3Model m = ReferenceModel();
  const auto greedy = Generate(m, kPrompts, Params(0.0, 0, true));
  for (int which = 0; which < 2; ++which) {
    SamplingParams p = Params(1.0, 5, true);
    if (which == 0) p.top_k = 1;
    else p.min_p = 1.0;
    const auto out = Generate(m, kPrompts, p);
    EXPECT_EQ(Tokens(out), Tokens(greedy)) << (which == 0 ? "top_k 1" : "min_p 1");
    // Reported log-probs are the temperature-1 policy's, greedy's too.
    EXPECT_LT(MaxLogprobDiff(out, greedy), 1e-6);
  }
}

// The first token drawn by 256 rows of one prompt: with top_k = 3 only the 3 most likely tokens
// appear; without it more do (so the check can fail). Temperature 2 spreads the draw (at 1 the
// tokens outside the top 3 hold 0.06% of the mass, too little to show up in 256 draws).
TEST(SamplerTest, TopKDrawsOnlyAmongTheKMostLikely) {
  Qwen3Model m = ReferenceModel();
  m->eval();
  const std::vector<int64_t> prompt = kPrompts[0];
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    const int64_t len = static_cast<int64_t>(prompt.size());
    logits = m->Forward(at::tensor(prompt, at::kLong).unsqueeze(0), at::arange(len, at::kLong).unsqueeze(0),
                        at::Tensor(), nullptr)[0][len - 1];
  }
  const at::Tensor top3 = std::get<1>(logits.topk(3));
  std::set<int64_t> allowed(top3.data_ptr<int64_t>(), top3.data_ptr<int64_t>() + 3);
  const std::vector<std::vector<int64_t>> rows(256, prompt);
  auto firsts = [&](int64_t k) {
    SamplingParams p = Params(2.0, 11, true);
    p.max_new_tokens = 1;
    p.top_k = k;
    std::set<int64_t> seen;
    for (const Completion& c : Generate(m, rows, p)) seen.insert(c.tokens[0]);
    return seen;
  };
  const std::set<int64_t> limited = firsts(3);
  for (int64_t t : limited) EXPECT_TRUE(allowed.count(t)) << "token " << t << " is not among the 3 most likely";
  EXPECT_GT(firsts(0).size(), 3u);
}

TEST(SamplerTest, MinTokensHoldsOffEosAndIgnoreEosRunsToTheLimit) {
  Qwen3Model m = ReferenceModel();
  const auto free_run = Generate(m, {kPrompts[1]}, Params(0.0, 0, true));
  SamplingParams p = Params(0.0, 0, true);
  p.eos_token_id = free_run[0].tokens[0];  // greedy would end at once
  p.min_tokens = 4;
  const auto held = Generate(m, {kPrompts[1]}, p);
  ASSERT_GE(held[0].tokens.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(held[0].tokens[i], p.eos_token_id) << "token " << i;
  p.min_tokens = 0;
  p.ignore_eos = true;
  const auto ignored = Generate(m, {kPrompts[1]}, p);
  EXPECT_EQ(ignored[0].tokens, free_run[0].tokens);
  EXPECT_FALSE(ignored[0].finished_eos);
}

}  // namespace
}  // namespace echelon::model

namespace echelon::model {
namespace {

// Rows that repeat a prompt (a group's samples) share one prefill; what they draw and the
// log-probs they report are those of prefilling every row.
TEST(GenerateTest, SharedPrefixLogprobsEqualUnshared) {
  Qwen3Model m = ReferenceModel();
  const std::vector<std::vector<int64_t>> rows = {kPrompts[0], kPrompts[0], kPrompts[2], kPrompts[0],
                                                  kPrompts[2], kPrompts[1], kPrompts[0]};
  for (double temperature : {0.0, 2.0}) {
    SamplingParams shared = Params(temperature, 5, true);
    SamplingParams unshared = shared;
    unshared.share_prefix = false;
    const auto a = Generate(m, rows, shared);
    const auto b = Generate(m, rows, unshared);
    EXPECT_EQ(Tokens(a), Tokens(b)) << "T=" << temperature;
    EXPECT_LT(MaxLogprobDiff(a, b), 1e-5) << "T=" << temperature;
    if (temperature > 0) {
      EXPECT_TRUE(a[0].tokens != a[1].tokens || a[0].tokens != a[3].tokens || a[0].tokens != a[6].tokens)
          << "rows of one prompt draw independently";
    }
  }
}

}  // namespace
}  // namespace echelon::model

namespace echelon::model {
namespace {

// Rows of several prompts (some repeated, one of a single token) that end at different lengths.
const std::vector<std::vector<int64_t>> kMixedRows = {kPrompts[0], kPrompts[2], kPrompts[0], {7},        kPrompts[3],
                                                      kPrompts[0], kPrompts[1], kPrompts[2], kPrompts[0], {7}};

SamplingParams Mixed(double temperature) {
  SamplingParams p = Params(temperature, 21, true);
  p.max_new_tokens = 14;
  p.max_new_tokens_per_row = {14, 3, 14, 9, 1, 14, 6, 14, 11, 14};
  return p;
}

// A slot that takes a waiting row never carries anything of the row it held before: with any
// slot count, continuous or static, shared prefill or not, every row's tokens and log-probs are
// those of running it alone in one slot.
TEST(ContinuousBatchingTest, SlotRefillNeverMixesSequences) {
  Qwen3Model m = ReferenceModel();
  for (double temperature : {0.0, 1.0}) {
    SamplingParams solo = Mixed(temperature);
    solo.slots = 1;
    solo.share_prefix = false;
    const auto want = Generate(m, kMixedRows, solo);
    // The case must exercise ends at different steps: by the per-row limit and by EOS.
    SamplingParams eos = solo;
    eos.eos_token_id = want[0].tokens[1];
    const auto want_eos = Generate(m, kMixedRows, eos);
    std::set<size_t> lengths;
    for (const Completion& c : want_eos) lengths.insert(c.tokens.size());
    EXPECT_GE(lengths.size(), 4u) << "T=" << temperature;
    EXPECT_TRUE(want_eos[0].finished_eos);
    for (int64_t slots : {2, 3, 7, 0}) {
      for (bool continuous : {true, false}) {
        for (bool share : {true, false}) {
          for (const SamplingParams* base : {&solo, &eos}) {
            SamplingParams p = *base;
            p.slots = slots;
            p.continuous = continuous;
            p.share_prefix = share;
            const auto got = Generate(m, kMixedRows, p);
            const auto& expected = base == &solo ? want : want_eos;
            const std::string what = "T=" + std::to_string(temperature) + " slots=" + std::to_string(slots) +
                                     (continuous ? " continuous" : " static") + (share ? " shared" : "") +
                                     (base == &eos ? " eos" : "");
            EXPECT_EQ(Tokens(got), Tokens(expected)) << what;
            EXPECT_LT(MaxLogprobDiff(got, expected), 1e-5) << what;
            for (size_t r = 0; r < got.size(); ++r) EXPECT_EQ(got[r].finished_eos, expected[r].finished_eos) << what;
          }
        }
      }
    }
    for (size_t r = 0; r < want.size(); ++r) {
      EXPECT_EQ(static_cast<int64_t>(want[r].tokens.size()), solo.max_new_tokens_per_row[r]) << "row " << r;
      const auto rescored = ScoreCompletion(m, kMixedRows[r], want[r].tokens, temperature);
      for (size_t i = 0; i < rescored.size(); ++i) EXPECT_NEAR(want[r].logprobs[i], rescored[i], 1e-5) << r << " " << i;
    }
  }
}

// One prompt's group of 8 samples through 3 slots: one shared prefill serves rows admitted at
// different times, and the draws are those of 8 slots.
TEST(ContinuousBatchingTest, GroupLargerThanTheSlots) {
  Qwen3Model m = ReferenceModel();
  const std::vector<std::vector<int64_t>> group(8, kPrompts[0]);
  SamplingParams wide = Params(1.0, 4, true);
  wide.max_new_tokens_per_row = {12, 2, 7, 12, 1, 9, 12, 5};
  SamplingParams narrow = wide;
  narrow.slots = 3;
  const auto a = Generate(m, group, wide);
  const auto b = Generate(m, group, narrow);
  EXPECT_EQ(Tokens(a), Tokens(b));
  EXPECT_LT(MaxLogprobDiff(a, b), 1e-5);
  std::set<std::vector<int64_t>> distinct;
  for (const Completion& c : b) distinct.insert(std::vector<int64_t>(c.tokens.begin(), c.tokens.begin() + 1));
  EXPECT_GT(distinct.size(), 1u) << "the samples of one prompt draw independently";
  for (size_t r = 0; r < b.size(); ++r) {
    const auto rescored = ScoreCompletion(m, group[r], b[r].tokens, 1.0);
    for (size_t i = 0; i < rescored.size(); ++i) EXPECT_NEAR(b[r].logprobs[i], rescored[i], 1e-5) << r << " " << i;
  }
}

// EOS as the very first token frees the slot after one step; the next row takes it.
TEST(ContinuousBatchingTest, EosAtTheFirstTokenFreesTheSlot) {
  Qwen3Model m = ReferenceModel();
  const std::vector<std::vector<int64_t>> rows = {kPrompts[1], kPrompts[0], kPrompts[1], kPrompts[2]};
  SamplingParams p = Params(0.0, 0, true);
  p.eos_token_id = Generate(m, {kPrompts[1]}, p)[0].tokens[0];
  SamplingParams one_slot = p;
  one_slot.slots = 1;
  std::vector<std::vector<int64_t>> steps;  // the rows drawing at each step
  const auto out = Generate(m, rows, one_slot, [&](const std::vector<int64_t>& r, const auto&, const auto&) {
    steps.push_back(r);
    return true;
  });
  ASSERT_EQ(out[0].tokens.size(), 1u);
  EXPECT_TRUE(out[0].finished_eos);
  EXPECT_TRUE(out[2].finished_eos);
  EXPECT_EQ(Tokens(out), Tokens(Generate(m, rows, p)));
  ASSERT_GE(steps.size(), 2u);
  EXPECT_EQ(steps[0], std::vector<int64_t>{0});
  EXPECT_EQ(steps[1], std::vector<int64_t>{1}) << "row 1 decodes in the step right after row 0 ended";
  size_t total = 0;
  for (const Completion& c : out) total += c.tokens.size();
  EXPECT_EQ(steps.size(), total) << "one slot: every step draws exactly one token, none for a finished row";
}

// Continuous batching computes no finished row: rows of lengths 1..8 in 8 slots take 36 row
// forwards (8 + 7 + ... + 1), static batches 64 (all 8 rows for 8 steps); one shared prefill
// serves a group.
TEST(ContinuousBatchingTest, NoStepComputesAFinishedRow) {
  Qwen3Model m = ReferenceModel();
  const std::vector<std::vector<int64_t>> rows(8, kPrompts[0]);
  SamplingParams p = Params(1.0, 3, true);
  p.max_new_tokens_per_row = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<size_t> drawing;
  GenerateStats stats;
  const auto out = Generate(
      m, rows, p,
      [&](const std::vector<int64_t>& r, const auto&, const auto&) {
        drawing.push_back(r.size());
        return true;
      },
      &stats);
  EXPECT_EQ(drawing, (std::vector<size_t>{8, 7, 6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(stats.steps, 8);
  EXPECT_EQ(stats.decode_rows, 36);
  EXPECT_EQ(stats.prefill_tokens, 3) << "one prefill of the prompt but its last token";

  SamplingParams fixed = p;
  fixed.continuous = false;
  fixed.share_prefix = false;
  GenerateStats static_stats;
  EXPECT_EQ(Tokens(Generate(m, rows, fixed, {}, &static_stats)), Tokens(out));
  EXPECT_EQ(static_stats.steps, 8);
  EXPECT_EQ(static_stats.decode_rows, 64);
  EXPECT_EQ(static_stats.prefill_tokens, 24);
}

// Where the fused decoding attention does not apply (bf16 here, CUDA on a GPU build), prompts
// are copied into the slots and the generic attention masks each row to its own length: slot
// refill still never mixes rows.
TEST(ContinuousBatchingTest, GenericAttentionPathKeepsRowsApart) {
  Qwen3Model m = ReferenceModel();
  m->to(at::kBFloat16);
  for (bool share : {true, false}) {
    SamplingParams solo = Mixed(0.0);
    solo.slots = 1;
    solo.share_prefix = share;
    SamplingParams three = solo;
    three.slots = 3;
    const auto a = Generate(m, kMixedRows, solo);
    const auto b = Generate(m, kMixedRows, three);
    EXPECT_EQ(Tokens(a), Tokens(b)) << (share ? "shared" : "unshared");
    EXPECT_LT(MaxLogprobDiff(a, b), 0.1) << (share ? "shared" : "unshared");  // bf16 logits: ~3 digits
  }
}

TEST(ContinuousBatchingTest, PerRowLimitsMustMatchThePrompts) {
  Qwen3Model m = ReferenceModel();
  SamplingParams p = Params(0.0, 0, true);
  p.max_new_tokens_per_row = {1, 2};
  EXPECT_THROW(Generate(m, kPrompts, p), std::invalid_argument);
  p.max_new_tokens_per_row = {0, 2, 0, 5};
  const auto out = Generate(m, kPrompts, p);
  EXPECT_TRUE(out[0].tokens.empty());
  EXPECT_EQ(out[1].tokens.size(), 2u);
  EXPECT_TRUE(out[2].tokens.empty());
  EXPECT_EQ(out[3].tokens.size(), 5u);
}

// A row interrupted after 3 tokens and continued (prompt + its tokens, the same sample index,
// from position 3) draws what the uninterrupted row draws: draws depend on (seed, sample,
// position) only, which is what lets a partial rollout stay a verifiable sequence of draws.
TEST(GenerateTest, AContinuedRowDrawsWhatTheUninterruptedRowDraws) {
  Qwen3Model m = ReferenceModel();
  SamplingParams full = Params(1.0, 21, true);
  full.top_k = 40;
  const std::vector<Completion> whole = Generate(m, kPrompts, full);
  SamplingParams first = full;
  first.max_new_tokens = 3;
  const std::vector<Completion> head = Generate(m, kPrompts, first);
  // Continue rows 2 and 0 only (in that order: their row indices in this call are 0 and 1).
  SamplingParams rest = full;
  rest.max_new_tokens = full.max_new_tokens - 3;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r : {2, 0}) {
    prompts.push_back(kPrompts[r]);
    prompts.back().insert(prompts.back().end(), head[r].tokens.begin(), head[r].tokens.end());
    rest.sample_ids.push_back(r);
    rest.first_positions.push_back(3);
  }
  const std::vector<Completion> tail = Generate(m, prompts, rest);
  for (size_t i = 0; i < 2; ++i) {
    const int64_t r = i == 0 ? 2 : 0;
    std::vector<int64_t> joined = head[r].tokens;
    joined.insert(joined.end(), tail[i].tokens.begin(), tail[i].tokens.end());
    EXPECT_EQ(joined, whole[r].tokens) << "row " << r;
  }
}

// Seeded draws follow the policy: 8,000 samples of one token from a 16-token model, counted
// against the exact probabilities (top_k 10 renormalised), by a chi-square test at p = 0.001.
TEST(GenerateTest, SeededDrawsFollowThePolicysDistribution) {
  Qwen3Model m(TinyTestConfig(/*vocab=*/16, /*hidden=*/32));
  m->InitWeights(3);
  const std::vector<int64_t> prompt = {1, 7, 4};
  SamplingParams sp;
  sp.temperature = 0.7;
  sp.top_k = 10;
  sp.max_new_tokens = 1;
  sp.eos_token_id = -1;
  sp.seed = 99;
  const int64_t n = 8000;
  at::Tensor probs;
  std::vector<Completion> out;
  {
    at::NoGradGuard no_grad;
    out = Generate(m, std::vector<std::vector<int64_t>>(n, prompt), sp);
    const at::Tensor ids = at::tensor(prompt, at::kLong).unsqueeze(0);
    const at::Tensor logits = m->Forward(ids, at::arange(3, at::kLong).unsqueeze(0), at::Tensor(), nullptr)[0][2];
    probs = SamplingProbs(logits.unsqueeze(0), sp)[0];
    probs = (probs / probs.sum()).to(at::kDouble).contiguous();
  }
  std::vector<int64_t> count(16, 0);
  for (const Completion& x : out) ++count[static_cast<size_t>(x.tokens.at(0))];
  double chi2 = 0;
  int64_t bins = 0;
  for (int64_t t = 0; t < 16; ++t) {
    const double expected = probs[t].item<double>() * n;
    if (expected == 0) {
      EXPECT_EQ(count[t], 0) << "token " << t << " is outside top_k";
      continue;
    }
    chi2 += (count[t] - expected) * (count[t] - expected) / expected;
    ++bins;
  }
  EXPECT_EQ(bins, 10);
  EXPECT_LT(chi2, 27.88) << "chi-square with 9 degrees of freedom, p = 0.001";
  // And a different seed draws differently.
  sp.seed = 100;
  std::vector<Completion> other;
  {
    at::NoGradGuard no_grad;
    other = Generate(m, std::vector<std::vector<int64_t>>(64, prompt), sp);
  }
  int64_t same = 0;
  for (size_t i = 0; i < other.size(); ++i) same += other[i].tokens == out[i].tokens;
  EXPECT_LT(same, 64);
}

}  // namespace
}  // namespace echelon::model

namespace echelon::model {
namespace {

// Router replay: every route an actor records is the one a teacher-forced forward of the whole
// sequence takes at that position and layer (prefill tiles, shared prefixes, slots refilled),
// and with a margin only the close ones are kept.
TEST(RouteRecordingTest, RecordedRoutesAreTheTeacherForcedChoicesWhereTheyAreClose) {
  Qwen3Model m = PeakedModel(FourLayerConfig(/*moe=*/true));
  const ModelConfig& cfg = m->config();
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 3}, {5, 17, 3}, {9}, {1, 2, 3, 4, 5, 6, 7}, {5, 17, 3}};
  for (const double margin : {1e9, 0.05}) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_new_tokens = 10;
    sp.eos_token_id = cfg.eos_token_id;
    sp.seed = 7;
    sp.slots = 2;  // rows wait and take freed slots
    sp.route_margin = margin;
    const std::vector<Completion> out = Generate(m, prompts, sp);
    int64_t kept = 0, total = 0;
    for (size_t r = 0; r < prompts.size(); ++r) {
      std::vector<int64_t> seq = prompts[r];
      seq.insert(seq.end(), out[r].tokens.begin(), out[r].tokens.end());
      const int64_t fed = static_cast<int64_t>(seq.size()) - 1;
      // The teacher-forced forward of every fed position, recorded.
      RouteTape tape;
      tape.record = true;
      m->SetRouteTape(&tape);
      {
        at::NoGradGuard no_grad;
        m->Forward(at::tensor(std::vector<int64_t>(seq.begin(), seq.end() - 1), at::kLong).unsqueeze(0),
                   at::arange(fed, at::kLong).unsqueeze(0), at::Tensor(), nullptr);
      }
      m->SetRouteTape(nullptr);
      EXPECT_EQ(out[r].routes_seen, fed * 3) << "row " << r << ": every fed position of the 3 sparse layers";
      const Routes& got = out[r].routes;
      ASSERT_EQ(got.k(), got.empty() ? 0u : 2u);
      size_t e = 0;
      for (int64_t p = 0; p < fed; ++p)
        for (int16_t l = 1; l <= 3; ++l) {
          const double gap = tape.margin[l][p].item<double>();
          const bool listed = e < got.size() && got.positions[e] == p && got.layers[e] == l;
          if (std::abs(gap - margin) > 1e-4) EXPECT_EQ(listed, gap < margin) << "row " << r << " position " << p << " layer " << l;
          ++total;
          if (!listed) continue;
          const at::Tensor want = std::get<0>(tape.chosen[l][p].sort());
          const at::Tensor have =
              std::get<0>(at::tensor(std::vector<int64_t>(got.experts.begin() + 2 * e, got.experts.begin() + 2 * e + 2),
                                     at::kLong)
                              .sort());
          EXPECT_TRUE(want.equal(have)) << "row " << r << " position " << p << " layer " << l;
          ++e;
          ++kept;
        }
      EXPECT_EQ(e, got.size()) << "row " << r << ": entries past the fed positions, or out of order";
    }
    if (margin >= 1e9) EXPECT_EQ(kept, total) << "every route";
    else EXPECT_LT(kept, total) << "a margin keeps the close routes only";
    EXPECT_GT(kept, 0) << "margin " << margin;
  }
}

}  // namespace
}  // namespace echelon::model
