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
#include <functional>
#include <map>
#include <mutex>
#include <ostream>
#include <string>

#include "echelon/cli/train_config.h"
#include "echelon/model/vocabulary.h"
#include "echelon/rollout/transport.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::cli {

// The learner's side of the transport, in process: hands out work from the dispatcher,
// validates and queues submitted groups, and serves the newest snapshot.
// Thread contract: every method is safe for concurrent use.
class LocalHub : public rollout::WorkSource, public rollout::TrajectorySink, public rollout::SnapshotSource {
 public:
  // Token ids must be below `model_vocab_size` (the model's rows, which may exceed the
  // tokenizer's ids).
  LocalHub(sched::Dispatcher* dispatcher, const data::TaskAdapter* task, const model::Vocabulary* vocab,
           int64_t model_vocab_size, int group_size);

  std::optional<rollout::Assignment> Acquire(const std::string& actor) override;
  rollout::SubmitOutcome Submit(rollout::GroupRollout rollout) override;
  rollout::Snapshot Latest() override;

  void Publish(rollout::Snapshot snapshot);
  // Submitted groups, oldest first; waits up to `timeout_seconds` for at least one.
  std::vector<rollout::GroupRollout> Drain(double timeout_seconds);
  // Submissions refused, by reason, and rewards the learner corrected ("reward_corrected").
  std::map<std::string, int64_t> refusals() const;
  // Completion tokens in accepted groups, and accepted groups per actor name.
  int64_t accepted_tokens() const;
  std::map<std::string, int64_t> actor_groups() const;
  // Continues the counters above from a checkpoint.
  void RestoreCounters(std::map<std::string, int64_t> refusals, int64_t accepted_tokens,
                       std::map<std::string, int64_t> actor_groups);

 private:
  // Empty when well-formed, else the reason it is refused.
  std::string Validate(const rollout::GroupRollout& g) const;
  // Recomputes what the learner can verify itself: the reward of every single-turn episode,
  // from the tokens (not the actor's text). Returns how many rewards changed.
  int64_t RecheckRewards(rollout::GroupRollout* g) const;

  sched::Dispatcher* dispatcher_;
  const data::TaskAdapter* task_;
  const model::Vocabulary* vocab_;
  const int group_size_;
  const int64_t vocab_size_;
  mutable std::mutex mu_;  // guards queue_, snapshot_, refusals_, accepted_tokens_, actor_groups_
  std::condition_variable arrived_;
  std::deque<rollout::GroupRollout> queue_;
  rollout::Snapshot snapshot_;
  std::map<std::string, int64_t> refusals_;
  int64_t accepted_tokens_ = 0;
  std::map<std::string, int64_t> actor_groups_;
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

// Serving the learner over gRPC instead of running actors as threads.
struct NetworkOptions {
  std::string listen = "127.0.0.1:0";
  std::string token;  // bearer token every actor must present
  std::string tls_cert_file;
  std::string tls_key_file;
  double heartbeat_seconds = 1.0;
  double evict_after_seconds = 3.0;
  int metrics_port = -1;  // >= 0: serve Prometheus text at http://0.0.0.0:PORT/metrics (0 picks one)
  // Where the snapshot broadcast origin listens (with rollout.snapshot_transport: broadcast);
  // empty: the host of `listen`, a port the system picks.
  std::string broadcast_listen;
  // Called once the server listens, with its port (e.g. to start actor processes).
  std::function<void(int port)> on_listening;
};

// Runs warm-start then asynchronous GRPO into `run_dir` (created; must not exist or be
// empty). Progress lines go to `progress`. `interrupt` (set by a signal handler) stops the
// run early and cleanly: threads joined, a resumable checkpoint of the last version saved.
// Resumable checkpoints (cli/run_checkpoint.h) are also written after warm-start and every
// `checkpoint_every` updates. With `resume` the run continues in `run_dir` from its newest
// whole checkpoint instead (same version numbering, dispatcher state restored, groups that
// were in flight re-issued, metrics.jsonl cut back to the checkpoint and continued).
// Without `network` the `rollout.actors` actors are threads of this process; with it the
// learner serves remote actors (any number, joining and leaving at any time).
Result<RunSummary> RunTraining(const RunOptions& options, const std::string& run_dir, const std::string& resolved_yaml,
                               const std::atomic<bool>* interrupt, std::ostream& progress,
                               const NetworkOptions* network = nullptr, bool resume = false);

}  // namespace echelon::cli
