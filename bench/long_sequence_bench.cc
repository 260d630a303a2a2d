// Memory and time of one learner update and one greedy generation at reasoning lengths, on a
// tiny Qwen3 with the real Qwen3 vocabulary (151,936 entries; 2 layers, hidden 64, tied: 9.8M
// parameters, nearly all of them the embedding), so what grows with the length is what the
// sequence costs, not the weights. One measurement per process (bench/long_sequence.sh runs
// them): the peak resident set (VmHWM) is reset before the measured phase and read after it.
//
//   long_sequence_bench --mode train|generate --tokens T [--untiled]
//
// train: Learner::Step on one group of 2 samples, each a 16-token prompt and T completion
//   tokens (rewards 0 and 1), fp32, one forward/backward.
// generate: Generate, greedy, one 16-token prompt, T new tokens (EOS ignored).
// --untiled: the untiled definitions (model::SetUntiledReference: T x S attention scores, T x
//   vocab logits), what the code did before tiling.
// Prints one JSON line: {"mode", "path", "tokens", "baseline_mb", "peak_mb", "delta_mb",
//   "seconds", "ms_per_token", "parameters"}, and for a tiled update "estimate_mb": what the
//   learner memory model (learn/learner_memory.h) says the update adds to the weights (gradients,
//   AdamW moments, activations of the one micro-batch).
#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/common/process.h"
#include "echelon/learn/learner.h"
#include "echelon/learn/learner_memory.h"
#include "echelon/model/attention.h"
#include "echelon/model/generate.h"

namespace {

using namespace echelon;

constexpr int64_t kPrompt = 16;

model::ModelConfig BenchModel(int64_t tokens) {
  model::ModelConfig c;
  c.vocab_size = 151936;
  c.hidden_size = 64;
  c.intermediate_size = 192;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = std::max<int64_t>(40960, tokens + kPrompt);
  return c;
}

std::vector<learn::LearnerGroup> Group(int64_t tokens) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> tok(3, 151935);
  learn::LearnerGroup g;
  std::vector<int64_t> prompt = {1};
  while (static_cast<int64_t>(prompt.size()) < kPrompt) prompt.push_back(tok(rng));
  for (int i = 0; i < 2; ++i) {
    data::Turn t;
    t.prompt_ids = prompt;
    for (int64_t k = 0; k < tokens; ++k) t.tokens.push_back(tok(rng));
    t.logprobs.assign(t.tokens.size(), -11.9f);  // about log(1 / vocab)
    data::Episode e;
    e.turns.push_back(t);
    e.reward = i;
    g.episodes.push_back(e);
  }
  return {g};
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "train";
  int64_t tokens = 1024;
  bool untiled = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) mode = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (a == "--untiled") untiled = true;
    else {
      std::cerr << "usage: long_sequence_bench --mode train|generate --tokens T [--untiled]" << std::endl;
      return 2;
    }
  }
  if ((mode != "train" && mode != "generate") || tokens < 1) {
    std::cerr << "--mode train|generate and --tokens >= 1" << std::endl;
    return 2;
  }
  model::SetUntiledReference(untiled);
  model::Qwen3Model m(BenchModel(tokens));
  m->InitWeights(1);
  double seconds = 0, baseline = 0;
  const auto timed = [&](const auto& phase) {
    baseline = ResidentSetMb();
    if (!ResetPeakResidentSet()) std::cerr << "cannot reset VmHWM: the peak includes set-up" << std::endl;
    const auto t0 = std::chrono::steady_clock::now();
    phase();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (mode == "train") {
    learn::Learner learner(m, learn::LearnerOptions{});
    const std::vector<learn::LearnerGroup> group = Group(tokens);
    timed([&] {
      Result<learn::StepStats> s = learner.Step(group);
      if (!s.ok()) {
        std::cerr << s.status().message() << std::endl;
        std::exit(1);
      }
    });
  } else {
    model::SamplingParams sp;
    sp.temperature = 0;
    sp.max_new_tokens = tokens;
    sp.ignore_eos = true;
    sp.eos_token_id = -1;
    const std::vector<int64_t> prompt(Group(1)[0].episodes[0].turns[0].prompt_ids);
    timed([&] {
      const std::vector<model::Completion> out = model::Generate(m, {prompt}, sp);
      if (static_cast<int64_t>(out[0].tokens.size()) != tokens) std::exit(1);
    });
  }
  const double peak = PeakResidentSetMb();
  const int64_t counted = mode == "train" ? 2 * tokens : tokens;
  nlohmann::json line = nlohmann::json{{"mode", mode},
                              {"path", untiled ? "untiled" : "tiled"},
                              {"tokens", tokens},
                              {"baseline_mb", baseline},
                              {"peak_mb", peak},
                              {"delta_mb", peak - baseline},
                              {"seconds", seconds},
                              {"ms_per_token", 1000.0 * seconds / static_cast<double>(counted)},
                              {"parameters", m->config().NumParameters()}};
  if (mode == "train" && !untiled) {
    learn::LearnerSetup s;
    s.precision = learn::Precision::kFp32;
    s.micro_batch_tokens = 2 * (kPrompt + tokens - 1);  // the two rows, padded to the longer
    const learn::LearnerMemory e = learn::EstimateLearnerMemory(m->config(), s);
    line["estimate_mb"] = (e.gradients + e.optimizer + e.activations) / 1048576.0;
  }
  std::cout << line.dump() << std::endl;
  return 0;
}
