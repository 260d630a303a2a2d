// `echelon plan CONFIG [--json]`: cost-aware activation and the capacity model's prediction
// for a run (docs/CAPACITY.md). Prints a table; with --json the last line is one JSON object
// (predicted_utilization, cost_per_step, baseline_cost_per_step, workers, ...).
#include <iostream>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/plan/planner.h"

namespace echelon::cli {
namespace {

struct PlanArgs {
  std::string config;
  bool json = false;
};

int RunPlan(const PlanArgs& args) {
  Result<plan::Plan> p = plan::MakePlanFromFile(args.config);
  if (!p.ok()) {
    spdlog::error("{}", p.status().message());
    return 2;
  }
  std::cout << plan::PlanTable(p.value());
  if (args.json) std::cout << plan::PlanJson(p.value()).dump() << std::endl;
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "choose the cheapest rollout workers for a run and predict its utilisation and cost");
  cmd->add_option("config", args->config, "plan config (configs/plan*.yaml)")->required();
  cmd->add_flag("--json", args->json, "also print the plan as one JSON object on the last line");
  cmd->callback([args, exit_code] { *exit_code = RunPlan(*args); });
}

}  // namespace echelon::cli
