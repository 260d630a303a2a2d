// `echelon learner-rank`: a data-parallel worker rank of a learner (learn/learner_ranks.h).
// `echelon train` / `echelon learner` start these themselves for learner.ranks > 1; on other
// hosts run it with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// LOCAL_RANK), or the flags below. It needs no config: rank 0 sends the model, the options and
// the state, then every update.
#include <iostream>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/cli/launch.h"
#include "echelon/learn/learner_ranks.h"

namespace echelon::cli {

int RunWorkerRank(const learn::RankGroupOptions& options) {
  Result<std::unique_ptr<learn::RankGroup>> group = learn::RankGroup::Connect(options);
  if (!group.ok()) {
    spdlog::error("{}", group.status().message());
    return 1;
  }
  Status st = learn::RunRankWorker(*group.value(), std::cout);
  if (!st.ok()) {
    spdlog::error("{}", st.message());
    return 1;
  }
  std::cout << "learner rank " << options.rank << " done" << std::endl;
  return 0;
}

void AddLearnerRankCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<learn::RankGroupOptions>();
  auto master = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("learner-rank", "a data-parallel worker rank of a learner (no config needed)");
  cmd->add_option("--rank", o->rank, "this rank (default: $RANK)");
  cmd->add_option("--world", o->world, "number of ranks (default: $WORLD_SIZE)");
  cmd->add_option("--local-rank", o->local_rank, "GPU index on this host, cuda:N (default: $LOCAL_RANK or 0)");
  cmd->add_option("--master", *master, "rank 0's rendezvous HOST:PORT (default: $MASTER_ADDR:$MASTER_PORT)");
  cmd->add_option("--timeout", o->timeout_seconds, "seconds one collective operation may take")->capture_default_str();
  cmd->callback([o, master, exit_code, cmd] {
    learn::RankGroupOptions r = *o;
    if (cmd->count("--rank") == 0 || cmd->count("--world") == 0 || master->empty()) {
      Result<std::optional<learn::RankGroupOptions>> env = learn::RankOptionsFromEnv();
      if (!env.ok() || !env.value()) {
        spdlog::error("learner-rank: {}", env.ok() ? "give --rank, --world and --master, or set torchrun's RANK, "
                                                     "WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
                                                   : env.status().message());
        *exit_code = 2;
        return;
      }
      const double timeout = r.timeout_seconds;
      r = *env.value();
      r.timeout_seconds = timeout;
    } else {
      const size_t colon = master->rfind(':');
      if (colon == std::string::npos || r.rank < 1 || r.rank >= r.world) {
        spdlog::error("learner-rank: --master must be HOST:PORT and 1 <= --rank < --world");
        *exit_code = 2;
        return;
      }
      r.master_addr = master->substr(0, colon);
      r.master_port = std::atoi(master->c_str() + colon + 1);
    }
    *exit_code = RunWorkerRank(r);
  });
}

}  // namespace echelon::cli
