// `echelon simulate CONFIG [--workers N] [--steps N] [--out timeline.jsonl]`: discrete-event
// simulation of a run with the plan's workers (or exactly N), the real dispatcher and
// staleness gate, failures, price changes and re-activation. Prints a summary (a line per
// price change with the activation it caused); the last line is one JSON object; --out
// writes one JSON line per learner step.
#include <cstdio>
#include <iostream>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/common/fs.h"
#include "echelon/plan/plan_config.h"
#include "echelon/plan/simulator.h"

namespace echelon::cli {
namespace {

struct SimulateArgs {
  std::string config;
  int64_t workers = -1;
  int64_t steps = 0;
  std::string out;
  std::string dispatch;  // overrides simulate.dispatch
  int64_t seed = -1;     // overrides simulate.seed
  std::string resume;    // "on" / "off" overrides simulate.resume
};

int RunSimulate(const SimulateArgs& args) {
  Result<plan::Plan> p = plan::MakePlanFromFile(args.config);
  if (!p.ok()) {
    spdlog::error("{}", p.status().message());
    return 2;
  }
  if (!args.dispatch.empty()) p->config.sim.dispatch = args.dispatch;
  if (args.seed >= 0) p->config.sim.seed = static_cast<uint64_t>(args.seed);
  if (!args.resume.empty()) p->config.sim.resume = args.resume == "on";
  std::string timeline;
  plan::SimOptions opt;
  opt.steps = args.steps;
  opt.workers = args.workers;
  if (!args.out.empty()) opt.on_step = [&](const nlohmann::json& j) { timeline += j.dump() + "\n"; };
  Result<plan::SimResult> r = plan::Simulate(p.value(), opt);
  if (!r.ok()) {
    spdlog::error("{}", r.status().message());
    return 2;
  }
  if (!args.out.empty()) {
    Status st = WriteFileAtomic(args.out, timeline);
    if (!st.ok()) {
      spdlog::error("{}", st.message());
      return 2;
    }
  }
  const plan::SimResult& s = r.value();
  const plan::CapacityPrediction& pred = p->prediction;
  std::printf("simulated %lld steps (%.1f h simulated, %.2f s wall, %llu events); S = %lld, kappa = %lld, %lld workers at start\n",
              static_cast<long long>(s.steps), s.sim_seconds / 3600, s.wall_seconds,
              static_cast<unsigned long long>(s.events), static_cast<long long>(p->inputs.max_staleness),
              static_cast<long long>(p->inputs.publish_period), static_cast<long long>(s.initial_workers));
  std::printf("%-26s %12s %12s\n", "", "simulated", "planned");
  std::printf("%-26s %12.3f %12.3f\n", "learner utilisation", s.steady_utilization, pred.utilization);
  std::printf("%-26s %12.2f %12.2f\n", "step seconds", s.steady_step_seconds, pred.step_seconds);
  std::printf("%-26s %12.4f %12.4f\n", "$/step", s.steady_cost_per_step, pred.cost_per_step);
  std::printf("whole run: utilisation %.3f, $%.2f, %.1f rollouts/s; dropped stale %llu, re-issued %llu, failures %llu, "
              "activations %llu\n",
              s.utilization, s.cost_total, s.rollouts_per_second, static_cast<unsigned long long>(s.counts.dropped_stale),
              static_cast<unsigned long long>(s.counts.reissued), static_cast<unsigned long long>(s.failures),
              static_cast<unsigned long long>(s.activations));
  for (const plan::PriceChangeRecord& c : s.price_changes) {
    std::printf("price change after step %lld (%.0f s): %s -> $%.2f/h (classes:", static_cast<long long>(c.at_step),
                c.time, c.gpu.c_str(), c.price_per_hour);
    for (const std::string& k : c.classes) std::printf(" %s", k.c_str());
    std::printf(");");
    if (!c.reactivated) {
      std::printf(" fixed pool, no re-activation\n");
      continue;
    }
    std::printf(" activation (%s%s), workers $%.2f/h:", c.method.c_str(), c.feasible ? "" : ", target not reachable",
                c.target_cost_per_hour);
    for (const auto& [name, n] : c.target)
      std::printf(" %s %lld -> %lld", name.c_str(), static_cast<long long>(c.billed_before.at(name)),
                  static_cast<long long>(n));
    std::printf("\n");
  }
  std::printf("dispatch %s, resume %s: tokens generated %.4g, consumed %.4g; wasted %.2f%% (stale %.4g, preempted "
              "%.4g, refused %.4g); %llu hand-outs declined as predicted late; %llu groups resumed; $%.4f per million "
              "consumed tokens\n",
              p->config.sim.dispatch.c_str(), p->config.sim.resume ? "on" : "off", s.tokens_generated, s.tokens_consumed,
              100 * s.wasted_fraction(), s.tokens_stale, s.tokens_preempted, s.tokens_refused,
              static_cast<unsigned long long>(s.counts.predicted_late), static_cast<unsigned long long>(s.counts.resumed),
              s.tokens_consumed > 0 ? s.cost_total / s.tokens_consumed * 1e6 : 0.0);
  std::printf("staleness of consumed groups:");
  for (size_t k = 0; k < s.staleness_hist.size(); ++k) std::printf(" %zu:%lld", k, static_cast<long long>(s.staleness_hist[k]));
  std::printf("\n");
  nlohmann::json j = plan::SimResultJson(s);
  j["predicted_utilization"] = pred.utilization;
  j["predicted_cost_per_step"] = pred.cost_per_step;
  j["max_staleness"] = p->inputs.max_staleness;
  j["publish_period"] = p->inputs.publish_period;
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

void AddSimulateCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand("simulate", "discrete-event simulation of a run: workers, failures, staleness, cost");
  cmd->add_option("config", args->config, "plan/simulate config (configs/simulate*.yaml)")->required();
  cmd->add_option("--workers", args->workers, "run exactly N workers (spread over the classes by availability) instead of the plan's activation")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps", args->steps, "learner steps (default: rl.steps)")->check(CLI::PositiveNumber);
  cmd->add_option("--out", args->out, "write the per-step timeline here (JSONL)");
  cmd->add_option("--dispatch", args->dispatch, "which group goes to which worker (overrides simulate.dispatch)")
      ->check(CLI::IsMember({"fifo", "deadline"}));
  cmd->add_option("--resume", args->resume, "resumable groups on or off (overrides simulate.resume)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--seed", args->seed, "the simulation's seed (overrides simulate.seed)")->check(CLI::NonNegativeNumber);
  cmd->footer("Config keys:\n" + plan::PlanConfigKeys().Describe());
  cmd->callback([args, exit_code] { *exit_code = RunSimulate(*args); });
}

}  // namespace echelon::cli
