// Simulator scale benchmark: 1,000 rollout workers for 1,000 learner steps (configs/
// simulate-large.yaml: 1,024 groups per step, failures and rejoins on) must finish in under
// 60 s on the 2-core build machine. Also times a 100-step run and plan-only activation.
// Run from the repository root (or set ECHELON_SIM_CONFIG to the config's path):
//   ./build/simulate_bench [--benchmark_filter=Simulate]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "echelon/plan/simulator.h"

namespace {

std::string ConfigPath() {
  const char* env = std::getenv("ECHELON_SIM_CONFIG");
  return env != nullptr ? env : "configs/simulate-large.yaml";
}

echelon::plan::Plan LoadPlan() {
  const std::string path = ConfigPath();
  auto config = echelon::plan::LoadPlanConfig(path);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    std::abort();
  }
  auto plan = echelon::plan::MakePlan(config.value());
  if (!plan.ok()) std::abort();
  return plan.value();
}

void BM_Simulate(benchmark::State& state) {
  const echelon::plan::Plan plan = LoadPlan();
  echelon::plan::SimOptions opt;
  opt.workers = state.range(0);
  opt.steps = state.range(1);
  echelon::plan::SimResult last;
  for (auto _ : state) {
    auto r = echelon::plan::Simulate(plan, opt);
    if (!r.ok()) std::abort();
    last = r.value();
  }
  state.counters["events"] = static_cast<double>(last.events);
  state.counters["sim_hours"] = last.sim_seconds / 3600;
  state.counters["utilization"] = last.utilization;
  state.counters["failures"] = static_cast<double>(last.failures);
}
BENCHMARK(BM_Simulate)->Args({1000, 100})->Args({1000, 1000})->Unit(benchmark::kSecond)->Iterations(1);

void BM_Plan(benchmark::State& state) {
  auto config = echelon::plan::LoadPlanConfig(ConfigPath());
  if (!config.ok()) std::abort();
  for (auto _ : state) benchmark::DoNotOptimize(echelon::plan::MakePlan(config.value()));
}
BENCHMARK(BM_Plan)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
