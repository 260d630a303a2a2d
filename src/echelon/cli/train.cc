// `echelon train CONFIG`: a whole run on one machine: warm-start, then asynchronous GRPO with
// the learner here and `rollout.actors` actors as local processes (or threads).
#include "echelon/cli/commands.h"
#include "echelon/cli/launch.h"
#include "echelon/cli/train_config.h"

namespace echelon::cli {

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("train", "warm-start then asynchronous GRPO on one machine (learner + actors)");
  AddRunOptions(cmd, args.get());
  cmd->footer("Config keys:\n" + TrainSchema().Describe());
  cmd->callback([args, exit_code] { *exit_code = Launch(*args, LaunchMode::kLocalCluster); });
}

}  // namespace echelon::cli
