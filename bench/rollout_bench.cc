// Rollout throughput of the builtin engine on an RL-like workload (bench/rollout_vs_pytorch.sh
// writes the workload and runs the PyTorch-eager side): G samples of each prompt, every row
// ending after its own length (as if it drew EOS there), sampled at temperature 1.
//
//   rollout_bench --model DIR --workload FILE [--slots 64] [--repeats 3] [--seed 0] [--mode NAME]
//
// WORKLOAD is JSON: {"group": G, "prompts": [[ids...], ...], "lengths": [one per row]}, rows
// being the prompts' G copies in order (prompt 0 x G, prompt 1 x G, ...). For each engine
// configuration one JSON line: the median wall time of `repeats` runs and the generated tokens
// per second over it, plus what the engine computed (GenerateStats).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "echelon/common/fs.h"
#include "echelon/model/generate.h"
#include "echelon/model/hf_model.h"

namespace echelon::model {
namespace {

struct Mode {
  const char* name;
  bool continuous;
  bool share_prefix;
};

// From static batches that prefill every row (a padded-batch engine's work) to the default,
// one technique at a time.
constexpr Mode kModes[] = {
    {"static", false, false},
    {"continuous", true, false},
    {"continuous+shared_prefix", true, true},
};

int Run(int argc, char** argv) {
  std::string model_dir, workload_path, only_mode;
  int64_t slots = 64, repeats = 3;
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model_dir = value;
    else if (flag == "--workload") workload_path = value;
    else if (flag == "--slots") slots = std::stoll(value);
    else if (flag == "--repeats") repeats = std::stoll(value);
    else if (flag == "--seed") seed = std::stoull(value);
    else if (flag == "--mode") only_mode = value;
    else {
      std::cerr << "rollout_bench: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (model_dir.empty() || workload_path.empty()) {
    std::cerr << "usage: rollout_bench --model DIR --workload FILE [--slots N] [--repeats N] [--seed N] [--mode NAME]\n";
    return 2;
  }
  Result<TextModel> loaded = LoadModelDir(model_dir);
  if (!loaded.ok()) {
    std::cerr << "rollout_bench: " << loaded.status().message() << "\n";
    return 1;
  }
  Qwen3Model model = loaded.value().model;
  model->eval();
  Result<std::string> text = ReadFile(workload_path);
  if (!text.ok()) {
    std::cerr << "rollout_bench: " << text.status().message() << "\n";
    return 1;
  }
  const nlohmann::json workload = nlohmann::json::parse(text.value());
  const int64_t group = workload.at("group").get<int64_t>();
  std::vector<std::vector<int64_t>> rows;
  for (const auto& prompt : workload.at("prompts"))
    for (int64_t g = 0; g < group; ++g) rows.push_back(prompt.get<std::vector<int64_t>>());
  SamplingParams params;
  params.temperature = 1.0;
  params.ignore_eos = true;  // rows end at their lengths only, as on the PyTorch side
  params.max_new_tokens_per_row = workload.at("lengths").get<std::vector<int64_t>>();
  params.max_new_tokens = *std::max_element(params.max_new_tokens_per_row.begin(), params.max_new_tokens_per_row.end());
  params.slots = slots;
  int64_t tokens = 0;
  for (int64_t n : params.max_new_tokens_per_row) tokens += n;

  SamplingParams warm_up;
  warm_up.max_new_tokens = 4;
  Generate(model, {rows.front()}, warm_up);
  for (const Mode& mode : kModes) {
    if (!only_mode.empty() && only_mode != mode.name) continue;
    SamplingParams p = params;
    p.continuous = mode.continuous;
    p.share_prefix = mode.share_prefix;
    std::vector<double> seconds;
    GenerateStats stats;
    for (int64_t r = 0; r < repeats; ++r) {
      p.seed = seed + static_cast<uint64_t>(r);
      const auto start = std::chrono::steady_clock::now();
      const std::vector<Completion> out = Generate(model, rows, p, {}, &stats);
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      int64_t got = 0;
      for (const Completion& c : out) got += static_cast<int64_t>(c.tokens.size());
      if (got != tokens) {
        std::cerr << "rollout_bench: " << mode.name << " generated " << got << " tokens, the workload holds " << tokens
                  << "\n";
        return 1;
      }
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    nlohmann::json line = {{"mode", mode.name},
                           {"rows", rows.size()},
                           {"slots", slots},
                           {"threads", at::get_num_threads()},
                           {"tokens", tokens},
                           {"seconds", median},
                           {"tokens_per_s", static_cast<double>(tokens) / median},
                           {"steps", stats.steps},
                           {"decode_rows", stats.decode_rows},
                           {"prefill_tokens", stats.prefill_tokens}};
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace echelon::model

int main(int argc, char** argv) {
  // One intra-op thread unless OMP_NUM_THREADS says otherwise (as the echelon binary does).
  const char* env = std::getenv("OMP_NUM_THREADS");
  at::set_num_threads(env != nullptr ? std::max(1, std::atoi(env)) : 1);
  try {
    return echelon::model::Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "rollout_bench: " << e.what() << "\n";
    return 1;
  }
}
