// ProcessGroup: starts child processes (the actors of a local cluster), restarts one that dies
// unexpectedly (killed by a signal or a non-zero exit status; with a cap), and stops them all
// with a bounded timeout: SIGTERM, then SIGKILL. Exit status 0 is an actor told by the learner
// that the run is over: it is not restarted.
//
//   ProcessGroup group;
//   group.Start("actor-0", {"/path/echelon", "actor", "--learner", "127.0.0.1:7700"}, "run/actors/actor-0.log");
//   ...
//   group.StopAll(5.0);
//
// Thread contract: all methods are safe for concurrent use; a supervisor thread owned by the
// group reaps and restarts children.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::cli {

// This executable's path (to start its own subcommands), or "echelon" where /proc says nothing.
std::string SelfExe();

class ProcessGroup;
// Starts `echelon learner-rank` for ranks 1..world-1 of a group whose rank 0 listens on this
// host's `port` (cuda:R for rank R), named "rank-R", logging to LOG_DIR/rank-R.log.
Status StartLocalRanks(ProcessGroup* group, int world, int port, double timeout_seconds, const std::string& log_dir);

class ProcessGroup {
 public:
  explicit ProcessGroup(int max_restarts = 5) : max_restarts_(max_restarts) {}
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts a named child with stdout and stderr appended to `log_path`.
  Status Start(const std::string& name, const std::vector<std::string>& argv, const std::string& log_path);
  // Stops every child: SIGTERM, wait up to `timeout_seconds`, then SIGKILL. No restarts after.
  void StopAll(double timeout_seconds);
  // Waits up to `timeout_seconds` for every child to exit by itself (true); then stops the
  // rest as StopAll (false).
  bool WaitAll(double timeout_seconds);
  int restarts() const { return restarts_.load(); }

 private:
  struct Child {
    std::vector<std::string> argv;
    std::string log_path;
    pid_t pid = -1;
    int restarts = 0;
  };
  Result<pid_t> Spawn(const Child& c);
  void Supervise();

  const int max_restarts_;
  std::mutex mu_;  // guards children_
  std::map<std::string, Child> children_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> restarts_{0};
  std::thread supervisor_;
};

}  // namespace echelon::cli
