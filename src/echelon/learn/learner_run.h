// RunLearner: a whole training run of the learning plane, from set-up to the final
// checkpoint. The actors reach it through an ActorTransport (threads of this process, or
// remote processes over gRPC: learn/actor_transport.h) and the TrajectoryIntake, and the
// held-out evaluations go through a ModelEvaluator (learn/model_evaluator.h); cli/ only
// parses flags, picks both and calls this.
//
// Set-up: a fresh run (run directory, warm-start) or a resumed one (newest whole checkpoint:
// weights, optimizer, version, dispatcher with its in-flight groups queued for re-issue,
// counters, RNG, metrics cut back); then the transport starts and the current snapshot is
// published. Then the learner loop, one update t -> t+1 at a time, in named steps:
//   1. assemble  BatchCollector: arrivals, the consume rule (sched/batch_assembler.h),
//                leases, evictions, stall timeout
//   2. update    learn::Learner::Step on the batch; its groups are then consumed
//   3. publish   a snapshot every rl.publish_period versions and at the last one
//   4. record    one obs::StepRecord to metrics.jsonl (and Prometheus), the progress line,
//                a held-out evaluation every eval.every versions
//   5. checkpoint a resumable checkpoints/step-N every checkpoint.every versions
// Shutdown: no more work is handed out, a checkpoint of where the loop stopped (also on a
// failure or an interrupt, so the run can continue), the final checkpoint and evaluation.
//
//   cli::ThreadActors actors(options.actors, options.actor_slowdowns);
//   ECHELON_ASSIGN_OR_RETURN(RunSummary s, RunLearner(options, {run_dir, yaml}, actors, rollout::EvaluateModel,
//                                                     &stop, std::cout));
//
// Time and waiting go through `clock` (RealClock when null). `interrupt` (set by a signal
// handler) ends the run early and cleanly, with a resumable checkpoint of the last version.
// Thread contract: runs on the calling thread, which becomes the learner thread; every thread
// it starts is joined before it returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "echelon/common/clock.h"
#include "echelon/common/status.h"
#include "echelon/learn/actor_transport.h"
#include "echelon/learn/model_evaluator.h"
#include "echelon/learn/rank_group.h"
#include "echelon/learn/run_options.h"

namespace echelon::learn {

struct LearnerRunArgs {
  std::string run_dir;        // created for a fresh run (must not exist or be empty)
  std::string resolved_yaml;  // written to RUN_DIR/config.yaml by a fresh run
  bool resume = false;        // continue the run in run_dir from its newest whole checkpoint
  int metrics_port = -1;      // >= 0: Prometheus text at http://0.0.0.0:PORT/metrics (0 picks one)
  // Data-parallel ranks (learn/learner_ranks.h): this process is rank 0 of `ranks->world`;
  // nullopt or a world of 1: one rank.
  std::optional<RankGroupOptions> ranks;
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

Result<RunSummary> RunLearner(const RunOptions& options, const LearnerRunArgs& args, ActorTransport& transport,
                              const ModelEvaluator& evaluate, const std::atomic<bool>* interrupt,
                              std::ostream& progress, const Clock* clock = nullptr);

}  // namespace echelon::learn
