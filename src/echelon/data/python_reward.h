// A user's reward function in Python, called as verl calls it:
//   def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict
// (keyword arguments; a dict carries "score" and other numbers, which become metrics).
//
// The function runs in a Python worker process (python3, the standard library only) that
// this object starts and talks to over pipes, one JSON line per call, not in an interpreter
// embedded in the learner: a call that hangs (even inside C code or time.sleep) is killed at
// its time limit and the worker restarted, and a crash in user code (a segfaulting extension)
// cannot take the learner down. What the function prints goes to the learner's stderr.
//
//   ECHELON_ASSIGN_OR_RETURN(auto py, PythonReward::Start({"reward.py", "compute_score", 10.0}));
//   ECHELON_ASSIGN_OR_RETURN(ExternalScore s, py->Score("gsm8k", "... #### 72", "72", "{}"));
//
// Errors name the file and line of the user's code and the sample: an exception, a result
// that is not a finite number (or a dict without a numeric "score"), the time limit, a worker
// that died; a file that does not load or has no such function fails Start.
//
// PythonRewardPool runs several such workers side by side (task.reward_workers): a group's
// samples go to whichever worker is free, each call with its own time limit, and come back in
// order, each what one worker's Score gives for it (calls are independent).
//
//   ECHELON_ASSIGN_OR_RETURN(auto pool, PythonRewardPool::Start({"reward.py"}, /*workers=*/4));
//   std::vector<Result<ExternalScore>> scores = pool->ScoreAll(samples);
//
// Thread contract: Score may be called from any thread; calls are serialised. The pool's
// ScoreAll may be called from any thread; concurrent calls share the workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/reward_spec.h"

namespace echelon::data {

struct PythonRewardOptions {
  std::string file;                        // path to the .py file
  std::string function = "compute_score";  // verl's default name
  double timeout_seconds = 30;             // per call
  // For starting the interpreter and importing the file (at start, and again after a worker was
  // killed or died): imports such as sympy take seconds, and a loaded machine takes longer; the
  // per-call limit is about one score and must not cut them.
  double load_timeout_seconds = 120;
  std::string python = "python3";          // the interpreter (PATH is searched)
};

class PythonReward {
 public:
  static Result<std::unique_ptr<PythonReward>> Start(const PythonRewardOptions& options);
  ~PythonReward();
  PythonReward(const PythonReward&) = delete;
  PythonReward& operator=(const PythonReward&) = delete;

  // `extra_info_json`: the row's extra_info as JSON text ("null" when none). `timeout_seconds`
  // > 0 cuts the call's time limit below the options' (a group's budget running out).
  Result<ExternalScore> Score(const std::string& data_source, const std::string& solution_str,
                            const std::string& ground_truth, const std::string& extra_info_json,
                            double timeout_seconds = 0);

  const PythonRewardOptions& options() const { return options_; }

 private:
  explicit PythonReward(PythonRewardOptions options) : options_(std::move(options)) {}
  // Starts the worker and waits for it to load the file.
  Status Spawn();
  void Kill();
  // One line from the worker within the time limit.
  Result<std::string> ReadLine(double timeout_seconds);

  const PythonRewardOptions options_;
  std::mutex mu_;  // guards the worker process and its pipe
  pid_t pid_ = -1;
  int to_worker_ = -1;
  int from_worker_ = -1;
  std::string buffer_;  // bytes read past the last line
};

class PythonRewardPool {
 public:
  // Starts `workers` (at least 1) workers, one after another; the first that fails to load
  // fails the pool.
  static Result<std::unique_ptr<PythonRewardPool>> Start(const PythonRewardOptions& options, int workers);
  // One result per sample, in order. `budget_seconds` > 0 bounds the whole call: a sample
  // still waiting for a worker when it is spent is not scored, and a call still running then is
  // cut (its worker killed and started again), both ResourceExhausted. So one group's texts,
  // however slow they make the function, hold the workers for at most that long.
  std::vector<Result<ExternalScore>> ScoreAll(const std::vector<RewardSample>& samples, double budget_seconds = 0);
  size_t workers() const { return workers_.size(); }
  const PythonRewardOptions& options() const { return workers_.front()->options(); }

 private:
  PythonRewardPool() = default;
  // On the first free worker (waiting for one), by `deadline` when there is one.
  Result<ExternalScore> ScoreOne(const RewardSample& sample,
                                 std::optional<std::chrono::steady_clock::time_point> deadline);

  std::vector<std::unique_ptr<PythonReward>> workers_;
  std::mutex mu_;  // guards free_
  std::condition_variable freed_;
  std::vector<size_t> free_;  // indices of idle workers
};

}  // namespace echelon::data
