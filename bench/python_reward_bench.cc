// Python rewards in a pool of worker processes (task.reward_workers) against one worker: the
// same 256 samples through PythonRewardPool with 1 and with N workers, side by side in one run,
// for a reward that takes 5 ms waiting (time.sleep: a sandbox, a remote checker) and one that
// takes 5 ms of CPU (a busy loop). Prints one JSON line per kind:
//   {"reward", "samples", "workers", "serial_per_s", "pool_per_s", "ratio"}
// Usage: python_reward_bench [--workers N] [--samples N] [--repeats N]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/data/python_reward.h"

namespace {

using namespace echelon;

constexpr char kReward[] = R"PY(
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "sleep":
        time.sleep(0.005)
    else:
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
    return 1.0 if solution_str == ground_truth else 0.0
)PY";

// Samples per second through `pool` (best of `repeats`).
double Throughput(data::PythonRewardPool& pool, const std::vector<data::RewardSample>& samples, int repeats) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Result<data::ExternalScore>& s : pool.ScoreAll(samples))
      if (!s.ok()) {
        std::cerr << s.status().message() << std::endl;
        std::exit(1);
      }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(samples.size()) / seconds);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 4, samples = 256, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--workers") workers = std::atoi(argv[i + 1]);
    else if (a == "--samples") samples = std::atoi(argv[i + 1]);
    else if (a == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  const std::string file = "/tmp/echelon_python_reward_bench_" + std::to_string(::getpid()) + ".py";
  std::ofstream(file) << kReward;
  Result<std::unique_ptr<data::PythonRewardPool>> one = data::PythonRewardPool::Start({file}, 1);
  Result<std::unique_ptr<data::PythonRewardPool>> pool = data::PythonRewardPool::Start({file}, workers);
  if (!one.ok() || !pool.ok()) {
    std::cerr << (one.ok() ? pool.status() : one.status()).message() << std::endl;
    return 1;
  }
  for (const std::string kind : {"sleep", "cpu"}) {
    std::vector<data::RewardSample> batch(static_cast<size_t>(samples), {kind, "42", "42", "null"});
    // Alternating, so both see the same machine.
    const double serial = Throughput(*one.value(), batch, repeats);
    const double parallel = Throughput(*pool.value(), batch, repeats);
    std::cout << nlohmann::json{{"reward", kind},          {"samples", samples},         {"workers", workers},
                                {"serial_per_s", serial}, {"pool_per_s", parallel}, {"ratio", parallel / serial}}
                     .dump()
              << std::endl;
  }
  std::remove(file.c_str());
  return 0;
}
