// Generation throughput of the default tiny model (the math task's policy), with and without
// the KV cache. tokens_per_s counts generated tokens (batch x new tokens) per wall second,
// prefill included. Rows never stop early (no EOS) so every run does the same work. Greedy
// decoding, as the PyTorch-eager reference bench does (bench/generate_vs_pytorch.sh).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "echelon/model/generate.h"

namespace echelon::model {
namespace {

ModelConfig DefaultTinyConfig() {
  ModelConfig c;
  c.vocab_size = 17;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.tie_word_embeddings = true;
  return c;
}

// Generates until the benchmark has its time; tokens_per_s counts the generated tokens.
void Measure(benchmark::State& state, Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
             SamplingParams params) {
  int64_t tokens = 0;
  for (auto _ : state) {
    std::vector<Completion> out = Generate(model, prompts, params);
    for (const Completion& c : out) tokens += static_cast<int64_t>(c.tokens.size());
    benchmark::DoNotOptimize(out.data());
    ++params.seed;
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

// Args: use_cache, batch, prompt length, new tokens.
void BM_Generate(benchmark::State& state) {
  Qwen3Model model(DefaultTinyConfig());
  model->InitWeights(1);
  const int64_t batch = state.range(1), prompt_len = state.range(2);
  at::Tensor ids = at::randint(3, 17, {batch, prompt_len}, at::kLong);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < batch; ++r)
    prompts.emplace_back(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + prompt_len);
  SamplingParams params;
  params.temperature = 0.0;
  params.max_new_tokens = state.range(3);
  params.eos_token_id = -1;
  params.use_cache = state.range(0) != 0;
  Measure(state, model, prompts, params);
}

BENCHMARK(BM_Generate)
    ->ArgNames({"cache", "batch", "prompt", "new"})
    ->Args({1, 256, 6, 8})
    ->Args({0, 256, 6, 8})
    ->Args({1, 16, 32, 64})
    ->Args({0, 16, 32, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A group's samples share their prompt: 4 prompts x G = 8 rows, with and without one prefill
// per distinct prompt. Args: share_prefix, prompt length, new tokens. Sampled at temperature 1
// (as rollouts are), no EOS.
void BM_GroupPrefill(benchmark::State& state) {
  Qwen3Model model(DefaultTinyConfig());
  model->InitWeights(1);
  const int64_t groups = 4, group_size = 8, prompt_len = state.range(1);
  at::Tensor ids = at::randint(3, 17, {groups, prompt_len}, at::kLong);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < group_size; ++i)
      prompts.emplace_back(ids[g].data_ptr<int64_t>(), ids[g].data_ptr<int64_t>() + prompt_len);
  SamplingParams params;
  params.max_new_tokens = state.range(2);
  params.eos_token_id = -1;
  params.share_prefix = state.range(0) != 0;
  Measure(state, model, prompts, params);
}

BENCHMARK(BM_GroupPrefill)
    ->ArgNames({"share", "prompt", "new"})
    ->Args({1, 256, 16})
    ->Args({0, 256, 16})
    ->Args({1, 32, 16})
    ->Args({0, 32, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace echelon::model

BENCHMARK_MAIN();
