// RunFit: the capacity model fitted to a real run directory (`echelon plan [CONFIG]
// --from-run RUN_DIR`), and its prediction of that run's learner utilisation.
//
// The run's shape (B = rl.groups_per_step, G = rl.group_size, S = rl.staleness, kappa =
// rl.publish_period resolved) comes from the caller, who reads RUN_DIR/config.yaml (the
// resolved training config) with the training schema (cli/plan.cc); FitRun reads
// RUN_DIR/metrics.jsonl (one line per learner update, written by `echelon train` /
// `echelon learner`; event lines mark warm-start, resumes and the end). Derived, per update
// line k (docs/CAPACITY.md, "Fitting a real run"):
//   rl_k      RL wall time: wall_s_k - (wall_s - step_s of the first line of its process
//             start), continued across resumes
//   busy_k    learner_busy_frac_k * rl_k (seconds in Learner::Step); train_k = busy_k - busy_k-1
//   cycle_k   wall_s_k - wall_s_k-1 (the first line of a process start: its step_s)
//   T_train   busy at the last line / updates
//   T_over    mean of cycle_k - step_s_k: learner time between updates (metrics, evaluation,
//             checkpoints)
//   actors    groups/s of each actor: its accepted groups (actor_groups deltas) over the time
//             it could generate: every cycle for S >= 1; cycle - train for S = 0 (lock-step: no
//             work is admitted while the learner trains). Updates after the first of each
//             process start only: actors boot during the first.
//   L         generated tokens per rollout: tokens_per_s * rl / (accepted groups * G)
// Prediction: PredictCapacity with one class per actor (one group at a time, T_gen = 1 /
// its groups/s), B, T_train, T_over, S, kappa and T_bcast = 0 (an actor's snapshot fetches
// are inside its measured rate). The first update of each process start is taken as
// measured (start-up = its cycle - T_step), the others predicted:
//     U_run = n T_train / (start-up + n T_step)
// compared with the learner_busy_frac of the last update line.
//
// When the admission window was full at the end of most updates (groups_in_flight >= S*B)
// the actors outpaced the learner, and their measured rates are the learner's consumption
// rate: a lower bound of what they can generate (`learner_bound`).
//
//   ECHELON_ASSIGN_OR_RETURN(std::string config_yaml, RunConfigPath("runs/r1"));
//   RunShape shape = ...;   // from config_yaml, read with the training schema
//   ECHELON_ASSIGN_OR_RETURN(RunFit fit, FitRun("runs/r1", shape));
//   fit.predicted_utilization, fit.measured_utilization, fit.actors[0].groups_per_s ...
//
// Errors name the directory, or the file and line, and what is wrong.
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/plan/capacity_model.h"
#include "echelon/plan/plan_config.h"

namespace echelon::plan {

// How the run was configured: B, G, S, kappa.
struct RunShape {
  int64_t groups_per_step = 0;  // B
  int64_t group_size = 0;       // G
  int64_t staleness = 0;        // S (rl.staleness: auto: the starting S)
  // rl.staleness: auto: the run moved S, and is fitted at the staleness_bound of its last
  // update line.
  bool staleness_auto = false;
  int64_t publish_period = 1;   // kappa, resolved (rl.publish_period 0 already replaced)
  std::string dispatch = "fifo";  // rollout.dispatch
  bool resume = true;             // rollout.resume
};

struct ActorFit {
  std::string name;
  int64_t groups = 0;          // accepted groups in the measured updates
  double seconds = 0;          // time it could generate in them
  double groups_per_s = 0;
  double tokens_per_s = 0;     // groups_per_s * G * L
  double group_seconds = 0;    // 1 / groups_per_s
  // Mean seconds from hand-out to submission of its groups (metrics' actor_group_seconds at the
  // last update line; 0: not logged): its time per group without the waits between groups.
  double held_seconds = 0;
};

struct RunFit {
  std::string dir;
  int64_t updates = 0;          // learner update lines
  int64_t process_starts = 0;   // 1 + resumes
  int64_t groups_per_step = 0;  // B
  int64_t group_size = 0;       // G
  int64_t max_staleness = 0;    // S
  int64_t publish_period = 1;   // kappa
  double completion_tokens = 0;  // L: generated tokens per rollout
  double rl_seconds = 0;        // RL wall time at the last update line
  double busy_seconds = 0;
  double train_seconds = 0;     // T_train
  double overhead_seconds = 0;  // T_over
  double startup_seconds = 0;   // first updates' cycles beyond T_step, all process starts
  double window_full_fraction = 0;  // measured updates ending with the admission window full
  bool learner_bound = false;       // window_full_fraction > 0.5
  std::vector<ActorFit> actors;

  // The model, as the run ran.
  CapacityInputs inputs;
  std::vector<WorkerClass> classes;
  CapacityPrediction steady;
  double predicted_utilization = 0;  // whole run, start-up included
  double measured_utilization = 0;   // learner_busy_frac of the last update line
  double measured_utilization_end = -1;  // of the final/interrupted event (closing evaluation included); -1: none
  std::string end_event;                 // "final", "interrupted" or "" (the run did not finish)
  // Completion tokens by fate at the last update line (metrics' tokens_by_fate; empty for runs
  // that do not log it): consumed, stale, filtered, preempted, refused.
  std::map<std::string, int64_t> tokens_by_fate;
  int64_t groups_dropped_stale = 0;  // at the last update line
  // stale + preempted + refused over every token with a fate; -1 without tokens_by_fate.
  double wasted_fraction() const;

  double relative_error() const { return predicted_utilization / measured_utilization - 1; }
};

// The simulator on the fitted run (`echelon plan --from-run RUN --simulate`): one worker per
// actor at its measured rate (a group every 1 / groups_per_s seconds), spread lognormally by
// `throughput_cv`, the run's
// B, G, S, kappa, T_train, T_over and updates, its dispatch rule and resumable groups, snapshots
// delivered at once (the fit's T_bcast = 0), no failures: what the simulator predicts the run
// wasted (tokens by fate) and how busy its learner was, beside what it measured.
struct RunSimOptions {
  std::string dispatch = "fifo";
  bool resume = true;
  uint64_t seed = 1;
  double throughput_cv = 0.1;
};
Result<nlohmann::json> SimulateRun(const RunFit& fit, const RunSimOptions& options);

// RUN_DIR/config.yaml; an error names a missing directory or file.
Result<std::string> RunConfigPath(const std::string& dir);
Result<RunFit> FitRun(const std::string& dir, const RunShape& shape);
nlohmann::json RunFitJson(const RunFit& fit);
std::string RunFitTable(const RunFit& fit);

// For `echelon plan CONFIG --from-run`: the config's learner step time and overhead, rollout
// shape (B, G, L) and the throughput of the worker classes that take the run's actors
// (workers[].run_actors, or every actor when the config has a single class) become the
// fit's (tokens/s = the mean over those actors, one group at a time). Each change is noted.
Status ApplyRunFit(const RunFit& fit, PlanConfig* config, std::vector<std::string>* notes);

}  // namespace echelon::plan
