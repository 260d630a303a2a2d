// What `echelon train` and `echelon learner` share: load and check the config, prepare the
// run directory, install signal handlers, run, and print the summary.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "echelon/learn/rank_group.h"

namespace echelon::cli {

struct LaunchArgs {
  std::string config;  // may be empty with `resume`: the run's own config.yaml is used
  std::string out;
  std::vector<std::string> overrides;  // --set KEY=VALUE, then bare KEY=VALUE arguments, in order
  bool resume = false;     // continue the run in resume_dir (or `out`) from its newest checkpoint
  std::string resume_dir;
  // Learner service (echelon learner; echelon train with rollout.transport=processes).
  std::string listen = "127.0.0.1:7700";  // loopback unless told otherwise
  std::string broadcast_listen;  // snapshot broadcast origin; empty: listen's host, any port
  std::vector<std::string> broadcast_peer_hosts;  // IPs any actor may advertise for its chunks
  std::string token_file;
  bool insecure = false;  // serve without a token (echelon learner refuses to otherwise)
  std::string tls_cert;
  std::string tls_key;
  int metrics_port = -1;
  std::string config_keys;  // text or markdown: print the config's keys and exit
};

enum class LaunchMode {
  kLocalCluster,  // echelon train: learner here, actors as local processes or threads
  kLearnerOnly,   // echelon learner: serve remote actors
};

// Returns the process exit code (0 done, 1 run failed, 2 bad input, 130 interrupted).
int Launch(const LaunchArgs& args, LaunchMode mode);

// A data-parallel worker rank until rank 0 stops it (cli/learner_rank.cc); the exit code.
int RunWorkerRank(const learn::RankGroupOptions& options);

// Registers the options `echelon train` and `echelon learner` share: CONFIG, --out, --resume,
// --metrics-port, --set, and bare KEY=VALUE overrides (Hydra style, as verl users type them)
// after CONFIG. The callback checks that CONFIG is given unless --resume is.
void AddRunOptions(CLI::App* cmd, LaunchArgs* args);

}  // namespace echelon::cli
