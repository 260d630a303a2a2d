// echelon: one binary, one subcommand per role.
#include <dlfcn.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <iostream>

#include "echelon/cli/commands.h"
#include "echelon/common/log.h"

namespace {

// Intra-op threads: ECHELON_THREADS, else OMP_NUM_THREADS (what users of PyTorch set), else 1,
// because a local cluster's learner and actors share the machine's cores. OpenBLAS (which reads
// OPENBLAS_NUM_THREADS only at load time) is set to match.
void SetThreads() {
  int threads = 1;
  if (const char* env = std::getenv("OMP_NUM_THREADS")) threads = std::max(1, std::atoi(env));
  if (const char* env = std::getenv("ECHELON_THREADS")) threads = std::max(1, std::atoi(env));
  at::set_num_threads(threads);
  using SetFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"echelon: asynchronous RL post-training of language models with cheap, unreliable rollout workers"};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 done; 1 the run failed; 2 a usage or input error (unknown flag, bad config, file or "
      "checkpoint: one line names what and where); 130 stopped by SIGINT/SIGTERM (a run stays resumable).");
  app.set_version_flag("--version", [] { return echelon::cli::VersionLine(); }, "print the version, git describe and LibTorch version");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warn or error")->capture_default_str();
  int exit_code = 0;
  echelon::cli::AddTrainCommand(app, &exit_code);
  echelon::cli::AddEvalCommand(app, &exit_code);
  echelon::cli::AddPlanCommand(app, &exit_code);
  echelon::cli::AddSimulateCommand(app, &exit_code);
  echelon::cli::AddLearnerCommand(app, &exit_code);
  echelon::cli::AddLearnerRankCommand(app, &exit_code);
  echelon::cli::AddActorCommand(app, &exit_code);
  echelon::cli::AddBroadcastCommand(app, &exit_code);
  echelon::cli::AddReportCommand(app, &exit_code);
  echelon::cli::AddTokenizeCommand(app, &exit_code);
  echelon::cli::AddTokensCommand(app, &exit_code);
  echelon::cli::AddServeCommand(app, &exit_code);
  echelon::cli::AddStageCommand(app, &exit_code);
  echelon::cli::AddGenerateCommand(app, &exit_code);
  echelon::cli::AddInitModelCommand(app, &exit_code);
  app.parse_complete_callback([&] {
    echelon::InitLogging(log_level);
    SetThreads();
  });
  // Usage errors exit 2 (CLI11 would use 100-127), as getopt-style tools and Python's argparse do;
  // --help and --version exit 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return exit_code;
}
