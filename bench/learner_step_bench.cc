// Learner step time on the default model (configs/math-tiny.yaml): one GRPO update over
// B x G = 32 x 8 sequences shaped like the math task (prompt 7 tokens, answer 3 + EOS).
//   make bench   (or: cmake --build build --target learner_step_bench && build/learner_step_bench)
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <random>

#include "echelon/learn/learner.h"

namespace {

echelon::model::ModelConfig DefaultModel() {
  echelon::model::ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 128;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 384;
  c.tie_word_embeddings = true;
  c.rope_theta = 10000;
  c.max_position_embeddings = 128;
  return c;
}

std::vector<echelon::learn::LearnerGroup> Batch(int groups, int group_size, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> tok(3, 15);
  std::vector<echelon::learn::LearnerGroup> out(groups);
  for (auto& g : out) {
    for (int i = 0; i < group_size; ++i) {
      echelon::data::Episode e;
      echelon::data::Turn t;
      t.prompt_ids = {1};
      for (int k = 0; k < 6; ++k) t.prompt_ids.push_back(tok(rng));
      for (int k = 0; k < 3; ++k) t.tokens.push_back(tok(rng));
      t.tokens.push_back(2);
      t.logprobs.assign(t.tokens.size(), -2.7f);
      e.turns.push_back(t);
      e.reward = i % 2;
      g.episodes.push_back(e);
    }
  }
  return out;
}

// Arg: 1 packs the rows without padding (the default), 0 pads them to the longest.
void BM_LearnerStep(benchmark::State& state) {
  at::set_num_threads(1);
  echelon::model::Qwen3Model m(DefaultModel());
  m->InitWeights(1);
  echelon::learn::LearnerOptions options;
  options.pack_sequences = state.range(0) != 0;
  echelon::learn::Learner learner(m, options);
  const auto batch = Batch(32, 8, 3);
  for (auto _ : state) {
    auto s = learner.Step(batch);
    if (!s.ok()) state.SkipWithError(s.status().message().c_str());
  }
  state.counters["sequences/s"] = benchmark::Counter(32.0 * 8, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LearnerStep)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->MinTime(3.0);

}  // namespace

BENCHMARK_MAIN();
