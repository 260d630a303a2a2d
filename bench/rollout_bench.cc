// Rollout throughput of the builtin engine on an RL-like workload (bench/rollout_vs_pytorch.sh
// writes the workload and runs the PyTorch-eager side): G samples of each prompt, every row
// ending after its own length (as if it drew EOS there), sampled at temperature 1.
//
//   rollout_bench --model DIR --workload FILE [--slots 64] [--repeats 3] [--seed 0] [--mode NAME]
//                 [--threads N] [--interop-threads N] [--greedy-check N]
//
// WORKLOAD is JSON: {"group": G, "prompts": [[ids...], ...], "lengths": [one per row]}, rows
// being the prompts' G copies in order (prompt 0 x G, prompt 1 x G, ...). For each engine
// configuration one JSON line: the median wall time of `repeats` runs, the tokens the engine
// returned (counted from its rows; every row must hold exactly its length, else exit 1) and
// their rate over that time, the thread counts it ran with, and what the engine computed
// (GenerateStats).
//
// --greedy-check N instead decodes greedily (temperature 0), row i for min(N, length_i)
// tokens, once per configuration, and prints each configuration's token ids and their
// log-probabilities (temperature 1), for the script to compare with the PyTorch reference's.
//
// Threads: --threads sets the intra-op pool and OpenBLAS (default OMP_NUM_THREADS, else 1, as
// the echelon binary does); --interop-threads the inter-op pool (default LibTorch's). Each line
// reports the counts read back, so the script can check them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

struct Options {
  std::string model_dir, workload_path, only_mode;
  int64_t slots = 64, repeats = 3;
  uint64_t seed = 0;
  int threads = 0;          // 0: OMP_NUM_THREADS, else 1
  int interop_threads = 0;  // 0: LibTorch's default
  int64_t greedy_check = 0;  // > 0: greedy token dump of this many tokens per row at most
};

constexpr char kUsage[] =
    "usage: rollout_bench --model DIR --workload FILE [--slots N] [--repeats N] [--seed N] [--mode NAME] "
    "[--threads N] [--interop-threads N] [--greedy-check N]\n";

bool ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "rollout_bench: " << flag << " needs a value\n" << kUsage;
      return false;
    }
    const std::string value = argv[i + 1];
    if (flag == "--model") o->model_dir = value;
    else if (flag == "--workload") o->workload_path = value;
    else if (flag == "--slots") o->slots = std::stoll(value);
    else if (flag == "--repeats") o->repeats = std::max<int64_t>(1, std::stoll(value));
    else if (flag == "--seed") o->seed = std::stoull(value);
    else if (flag == "--mode") o->only_mode = value;
    else if (flag == "--threads") o->threads = std::stoi(value);
    else if (flag == "--interop-threads") o->interop_threads = std::stoi(value);
    else if (flag == "--greedy-check") o->greedy_check = std::stoll(value);
    else {
      std::cerr << "rollout_bench: unknown flag " << flag << "\n" << kUsage;
      return false;
    }
  }
  if (o->model_dir.empty() || o->workload_path.empty()) {
    std::cerr << kUsage;
    return false;
  }
  return true;
}

// OpenBLAS keeps its own pool (LibTorch calls it for GEMMs); reached through dlsym because
// LibTorch may be linked to another BLAS, which then reports -1.
void SetBlasThreads(int threads) {
  using SetFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

int BlasThreads() {
  using GetFn = int (*)();
  auto fn = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn != nullptr ? fn() : -1;
}

// Must run before any LibTorch work: the inter-op pool can be sized only before it starts.
void SetThreads(const Options& o) {
  int threads = o.threads;
  if (threads <= 0) {
    const char* env = std::getenv("OMP_NUM_THREADS");
    threads = env != nullptr ? std::max(1, std::atoi(env)) : 1;
  }
  if (o.interop_threads > 0) at::set_num_interop_threads(o.interop_threads);
  at::set_num_threads(threads);
  SetBlasThreads(threads);
}

nlohmann::json ThreadsJson() {
  return {{"threads", at::get_num_threads()},
          {"interop_threads", at::get_num_interop_threads()},
          {"blas_threads", BlasThreads()}};
}

struct Workload {
  std::vector<std::vector<int64_t>> rows;  // the prompts' G copies, in group order
  std::vector<int64_t> lengths;            // one per row
};

bool LoadWorkload(const std::string& path, Workload* w) {
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) {
    std::cerr << "rollout_bench: " << text.status().message() << "\n";
    return false;
  }
  const nlohmann::json j = nlohmann::json::parse(text.value());
  const int64_t group = j.at("group").get<int64_t>();
  for (const auto& prompt : j.at("prompts"))
    for (int64_t g = 0; g < group; ++g) w->rows.push_back(prompt.get<std::vector<int64_t>>());
  w->lengths = j.at("lengths").get<std::vector<int64_t>>();
  if (w->lengths.size() != w->rows.size()) {
    std::cerr << "rollout_bench: " << path << ": " << w->lengths.size() << " lengths for " << w->rows.size()
              << " rows (prompts x group)\n";
    return false;
  }
  return true;
}

// The tokens the engine returned, summed over rows; -1 (after one line on stderr) when a row
// did not get exactly its limit.
int64_t CountTokens(const char* mode, const std::vector<Completion>& out, const std::vector<int64_t>& limits) {
  if (out.size() != limits.size()) {
    std::cerr << "rollout_bench: " << mode << " returned " << out.size() << " rows for " << limits.size() << "\n";
    return -1;
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t got = static_cast<int64_t>(out[i].tokens.size());
    if (got != limits[i]) {
      std::cerr << "rollout_bench: " << mode << " row " << i << " got " << got << " tokens, its length is "
                << limits[i] << "\n";
      return -1;
    }
    tokens += got;
  }
  return tokens;
}

SamplingParams ModeParams(const Mode& mode, const Options& o, const std::vector<int64_t>& limits) {
  SamplingParams p;
  p.temperature = 1.0;
  p.ignore_eos = true;  // rows end at their lengths only, as on the PyTorch side
  p.max_new_tokens_per_row = limits;
  p.max_new_tokens = *std::max_element(limits.begin(), limits.end());
  p.slots = o.slots;
  p.continuous = mode.continuous;
  p.share_prefix = mode.share_prefix;
  return p;
}

// One line per configuration: its median wall time over `repeats` runs and the tokens counted.
int Timed(Qwen3Model& model, const Options& o, const Workload& w) {
  for (const Mode& mode : kModes) {
    if (!o.only_mode.empty() && o.only_mode != mode.name) continue;
    SamplingParams p = ModeParams(mode, o, w.lengths);
    std::vector<double> seconds;
    GenerateStats stats;
    int64_t tokens = 0;
    for (int64_t r = 0; r < o.repeats; ++r) {
      p.seed = o.seed + static_cast<uint64_t>(r);
      const auto start = std::chrono::steady_clock::now();
      const std::vector<Completion> out = Generate(model, w.rows, p, {}, &stats);
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      tokens = CountTokens(mode.name, out, w.lengths);
      if (tokens < 0) return 1;
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    nlohmann::json line = {{"mode", mode.name},
                           {"rows", w.rows.size()},
                           {"slots", o.slots},
                           {"tokens", tokens},
                           {"seconds", median},
                           {"tokens_per_s", static_cast<double>(tokens) / median},
                           {"steps", stats.steps},
                           {"decode_rows", stats.decode_rows},
                           {"prefill_tokens", stats.prefill_tokens}};
    line.update(ThreadsJson());
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

// Greedy token ids per configuration, row i capped at min(greedy_check, length_i).
int GreedyCheck(Qwen3Model& model, const Options& o, const Workload& w) {
  std::vector<int64_t> limits;
  for (int64_t n : w.lengths) limits.push_back(std::min(n, o.greedy_check));
  for (const Mode& mode : kModes) {
    if (!o.only_mode.empty() && o.only_mode != mode.name) continue;
    SamplingParams p = ModeParams(mode, o, limits);
    p.temperature = 0.0;
    const std::vector<Completion> out = Generate(model, w.rows, p);
    if (CountTokens(mode.name, out, limits) < 0) return 1;
    nlohmann::json tokens = nlohmann::json::array(), logprobs = nlohmann::json::array();
    for (const Completion& c : out) {
      tokens.push_back(c.tokens);
      logprobs.push_back(c.logprobs);
    }
    nlohmann::json line = {{"mode", mode.name}, {"tokens", tokens}, {"logprobs", logprobs}};
    line.update(ThreadsJson());
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

int Run(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, &o)) return 2;
  SetThreads(o);
  Result<TextModel> loaded = LoadModelDir(o.model_dir);
  if (!loaded.ok()) {
    std::cerr << "rollout_bench: " << loaded.status().message() << "\n";
    return 1;
  }
  Qwen3Model model = loaded.value().model;
  model->eval();
  Workload w;
  if (!LoadWorkload(o.workload_path, &w)) return 1;
  if (o.greedy_check > 0) return GreedyCheck(model, o, w);

  SamplingParams warm_up;
  warm_up.max_new_tokens = 4;
  Generate(model, {w.rows.front()}, warm_up);
  return Timed(model, o, w);
}

}  // namespace
}  // namespace echelon::model

int main(int argc, char** argv) {
  try {
    return echelon::model::Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "rollout_bench: " << e.what() << "\n";
    return 1;
  }
}
