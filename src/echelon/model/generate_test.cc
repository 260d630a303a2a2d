#include "echelon/model/generate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/model/safetensors.h"

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
// appear; without it more do (so the check can fail).
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
    SamplingParams p = Params(1.0, 11, true);
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
    if (temperature > 0)
      EXPECT_TRUE(a[0].tokens != a[1].tokens || a[0].tokens != a[3].tokens || a[0].tokens != a[6].tokens)
          << "rows of one prompt draw independently";
  }
}

}  // namespace
}  // namespace echelon::model
