// The in-process runtime of `echelon train`: the learner loop on the calling thread and
// `rollout.actors` actor threads, meeting only through the rollout/transport.h interfaces
// (implemented here by LocalHub), so that a network transport can replace LocalHub.
//
//   ECHELON_ASSIGN_OR_RETURN(RunSummary s, RunTraining(options, run_dir, resolved_yaml, &interrupted, std::cout));
//
// Thread contract: RunTraining owns every thread it starts and joins them before returning.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <ostream>
#include <string>

#include "echelon/cli/train_config.h"
#include "echelon/rollout/transport.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::cli {

// The learner's side of the transport, in process: hands out work from the dispatcher,
// validates and queues submitted groups, and serves the newest snapshot.
// Thread contract: every method is safe for concurrent use.
class LocalHub : public rollout::WorkSource, public rollout::TrajectorySink, public rollout::SnapshotSource {
 public:
  LocalHub(sched::Dispatcher* dispatcher, const data::TaskAdapter* task, int group_size, int64_t vocab_size);

  std::optional<rollout::Assignment> Acquire(const std::string& actor) override;
  sched::SubmitResult Submit(rollout::GroupRollout rollout) override;
  rollout::Snapshot Latest() override;

  void Publish(rollout::Snapshot snapshot);
  // Submitted groups, oldest first; waits up to `timeout_seconds` for at least one.
  std::vector<rollout::GroupRollout> Drain(double timeout_seconds);
  // Submissions refused before reaching the dispatcher, by reason.
  std::map<std::string, int64_t> refusals() const;

 private:
  // Empty when well-formed, else the reason it is refused.
  std::string Validate(const rollout::GroupRollout& g) const;

  sched::Dispatcher* dispatcher_;
  const data::TaskAdapter* task_;
  const int group_size_;
  const int64_t vocab_size_;
  mutable std::mutex mu_;  // guards queue_, snapshot_, refusals_
  std::condition_variable arrived_;
  std::deque<rollout::GroupRollout> queue_;
  rollout::Snapshot snapshot_;
  std::map<std::string, int64_t> refusals_;
};

struct RunSummary {
  std::string run_dir;
  int64_t steps_done = 0;
  double warmstart_accuracy = 0;
  double final_accuracy = 0;
  int64_t heldout_n = 0;
  double wall_seconds = 0;
  bool interrupted = false;
};

// Runs warm-start then asynchronous GRPO into `run_dir` (created; must not exist or be
// empty). Progress lines go to `progress`. `interrupt` (set by a signal handler) stops the
// run early and cleanly: threads joined, a checkpoint of the last version saved.
Result<RunSummary> RunTraining(const RunOptions& options, const std::string& run_dir, const std::string& resolved_yaml,
                               const std::atomic<bool>* interrupt, std::ostream& progress);

}  // namespace echelon::cli
