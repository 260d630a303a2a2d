// `echelon train CONFIG`: warm-start, then asynchronous GRPO with in-process actors.
#include <csignal>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/cli/runtime.h"
#include "echelon/cli/train_config.h"

namespace echelon::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void OnSignal(int) { g_interrupted = true; }

std::string DefaultRunDir(const std::string& config_path) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream ss;
  ss << "runs/" << std::filesystem::path(config_path).stem().string() << "-" << std::put_time(&tm, "%Y%m%d-%H%M%S");
  return ss.str();
}

struct TrainArgs {
  std::string config;
  std::string out;
  std::vector<std::string> overrides;
};

int RunTrain(const TrainArgs& args) {
  Result<Config> cfg = Config::Load(TrainSchema(), args.config, args.overrides);
  if (!cfg.ok()) {
    spdlog::error("{}", cfg.status().message());
    return 2;
  }
  Result<RunOptions> options = RunOptionsFromConfig(cfg.value());
  if (!options.ok()) {
    spdlog::error("{}", options.status().message());
    return 2;
  }
  const std::string run_dir = args.out.empty() ? DefaultRunDir(args.config) : args.out;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  Result<RunSummary> s = RunTraining(options.value(), run_dir, cfg->ToYaml(), &g_interrupted, std::cout);
  if (!s.ok()) {
    spdlog::error("{}", s.status().message());
    return 1;
  }
  std::cout << "held-out accuracy: warm-start " << std::fixed << std::setprecision(3) << s->warmstart_accuracy
            << " -> " << (s->interrupted ? "interrupted " : "final ") << s->final_accuracy << " (n=" << s->heldout_n
            << ", " << s->steps_done << " steps, " << std::setprecision(0) << s->wall_seconds << " s)\n";
  std::cout << "run directory: " << s->run_dir << " (config.yaml, metrics.jsonl, checkpoints/)\n";
  nlohmann::json j = {{"run_dir", s->run_dir},
                      {"steps", s->steps_done},
                      {"warmstart_accuracy", s->warmstart_accuracy},
                      {"final_accuracy", s->final_accuracy},
                      {"heldout_n", s->heldout_n},
                      {"wall_s", s->wall_seconds},
                      {"interrupted", s->interrupted}};
  std::cout << j.dump() << std::endl;
  return s->interrupted ? 130 : 0;
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "warm-start then asynchronous GRPO on one machine (learner + actors)");
  cmd->add_option("config", args->config, "YAML config, e.g. configs/math-tiny.yaml")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out, "run directory (default runs/<config>-<date>-<time>); must not exist or be empty");
  cmd->add_option("--set", args->overrides, "override a config key, e.g. --set rl.steps=50 (repeatable)")
      ->allow_extra_args(false);
  cmd->footer("Config keys:\n" + TrainSchema().Describe());
  cmd->callback([args, exit_code] { *exit_code = RunTrain(*args); });
}

}  // namespace echelon::cli
