// Learner update time and memory on a Qwen3-shaped model big enough to matter on a CPU
// (8 layers, hidden 512, ~27M parameters): fp32 against bf16, one forward/backward against
// micro-batches, one rank against data-parallel ranks (run as processes with torchrun's
// variables by bench/learner_update.sh). Prints one JSON line per rank:
//   {"rank", "ranks", "precision", "micro_batch_tokens", "shard", "activation_checkpointing", "threads",
//    "pack_sequences", "update_s" (median), "updates", "peak_rss_mb", "optimizer_mb", "state_mb"
//    (the peak of weights, gradients and AdamW state the learner held, Learner::PeakTrainingStateBytes)}
// Usage: learner_update_bench [--precision fp32|bf16] [--micro N] [--shard none|optimizer|params] [--checkpoint] [--no-pack] [--updates N]
//        [--device D]
//        (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT for ranks)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/common/process.h"
#include "echelon/learn/learner_ranks.h"

namespace {

using namespace echelon;

model::ModelConfig BenchModel() {
  model::ModelConfig c;
  c.vocab_size = 1024;
  c.hidden_size = 512;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 1536;
  c.tie_word_embeddings = true;
  c.rope_theta = 10000;
  c.max_position_embeddings = 512;
  return c;
}

// 8 groups x 8 samples; prompts of 32 tokens, completions of 16..96 tokens (RL-like spread).
std::vector<learn::LearnerGroup> Batch(uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> tok(3, 1023), len(16, 96);
  std::vector<learn::LearnerGroup> out(8);
  for (auto& g : out) {
    std::vector<int64_t> prompt = {1};
    for (int k = 0; k < 31; ++k) prompt.push_back(tok(rng));
    for (int i = 0; i < 8; ++i) {
      data::Episode e;
      data::Turn t;
      t.prompt_ids = prompt;
      for (int64_t k = len(rng); k > 0; --k) t.tokens.push_back(tok(rng));
      t.logprobs.assign(t.tokens.size(), -6.9f);
      e.turns.push_back(t);
      e.reward = i % 2;
      g.episodes.push_back(e);
    }
  }
  return out;
}

int Fail(const Status& st) {
  std::cerr << st.message() << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  learn::LearnerOptions o;
  int updates = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--precision" && i + 1 < argc) o.precision = learn::ParsePrecision(argv[++i]).value();
    if (a == "--micro" && i + 1 < argc) o.micro_batch_tokens = std::atoll(argv[++i]);
    if (a == "--shard" && i + 1 < argc) o.shard = learn::ParseShard(argv[++i]).value();
    if (a == "--checkpoint") o.activation_checkpointing = true;
    if (a == "--no-pack") o.pack_sequences = false;
    if (a == "--updates" && i + 1 < argc) updates = std::atoi(argv[++i]);
    if (a == "--device" && i + 1 < argc) o.device = argv[++i];
  }
  const int threads = at::get_num_threads();
  Result<std::optional<learn::RankGroupOptions>> ranks = learn::RankOptionsFromEnv();
  if (!ranks.ok()) return Fail(ranks.status());
  std::unique_ptr<learn::RankGroup> group;
  if (ranks.value()) {
    Result<std::unique_ptr<learn::RankGroup>> g = learn::RankGroup::Connect(*ranks.value());
    if (!g.ok()) return Fail(g.status());
    group = std::move(g).value();
  }
  model::Qwen3Model m(BenchModel());
  m->InitWeights(1);
  learn::Learner learner(m, o, group.get());
  const auto batch = Batch(3);
  std::vector<double> seconds;
  for (int i = 0; i < updates + 1; ++i) {  // the first update warms up (allocations)
    const auto t0 = std::chrono::steady_clock::now();
    Result<learn::StepStats> s = learner.Step(batch);
    if (!s.ok()) return Fail(s.status());
    if (i > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  nlohmann::json line = {{"rank", group ? group->rank() : 0},
                         {"ranks", group ? group->world() : 1},
                         {"precision", o.precision == learn::Precision::kBf16 ? "bf16" : "fp32"},
                         {"micro_batch_tokens", o.micro_batch_tokens},
                         {"shard", static_cast<int>(o.shard)},
                         {"activation_checkpointing", o.activation_checkpointing},
                         {"pack_sequences", o.pack_sequences},
                         {"threads", threads},
                         {"parameters", m->config().NumParameters()},
                         {"update_s", seconds[seconds.size() / 2]},
                         {"updates", updates},
                         {"peak_rss_mb", PeakResidentSetMb()},
                         {"optimizer_mb", learner.OptimizerStateBytes() / 1048576.0},
                         {"state_mb", learner.PeakTrainingStateBytes() / 1048576.0}};
  std::cout << line.dump() << std::endl;
  return 0;
}
