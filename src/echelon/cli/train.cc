// `echelon train CONFIG`: a whole run on one machine: warm-start, then asynchronous GRPO with
// the learner here and `rollout.actors` actors as local processes (or threads).
#include "echelon/cli/commands.h"
#include "echelon/cli/launch.h"
#include "echelon/cli/train_config.h"

namespace echelon::cli {

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("train", "warm-start then asynchronous GRPO on one machine (learner + actors)");
  cmd->add_option("config", args->config, "YAML config, e.g. configs/math-tiny.yaml")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out, "run directory (default runs/<config>-<date>-<time>); must not exist or be empty");
  cmd->add_option("--metrics-port", args->metrics_port,
                  "serve Prometheus metrics at http://0.0.0.0:PORT/metrics (0 picks a port; default off)");
  cmd->add_option("--set", args->overrides, "override a config key, e.g. --set rl.steps=50 (repeatable)")
      ->allow_extra_args(false);
  cmd->footer("Config keys:\n" + TrainSchema().Describe());
  cmd->callback([args, exit_code] { *exit_code = Launch(*args, LaunchMode::kLocalCluster); });
}

}  // namespace echelon::cli
