// Where a training run starts from: a fresh run directory (the initial model, a new character
// model or model.init's directory, then the supervised warm-start and its held-out
// evaluation), or the newest whole resumable checkpoint of an interrupted run (with its
// metrics.jsonl cut back to that moment).
//
//   ECHELON_ASSIGN_OR_RETURN(RunStart s, resume ? StartFromCheckpoint(...) : StartFresh(...));
//
// Thread contract: free functions, called by the learner thread before the loop starts.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/common/run_secret.h"
#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/learn/model_evaluator.h"
#include "echelon/learn/run_checkpoint.h"
#include "echelon/learn/run_options.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"
#include "echelon/obs/metrics_log.h"

namespace echelon::learn {

struct RunStart {
  model::Qwen3Model model{nullptr};
  model::Vocabulary vocab;
  RunState state;
  std::string resumed_from;  // checkpoint directory; empty for a fresh run
  std::map<std::string, at::Tensor> optimizer;
  int64_t discarded_lines = 0;        // metrics lines moved to metrics.discarded.jsonl
  std::vector<std::string> skipped;   // checkpoints passed over, with the reason
};

// Fresh run: creates `run_dir` (which must not exist or be empty) with config.yaml, the
// held-out set and metrics.jsonl (opened into `metrics`), warm-starts and evaluates with
// `evaluate`. `t_start` is when the run started on `clock`.
// Whether a fresh run may start in `run_dir`: it does not exist, or holds nothing but
// learner.log (which the CLI opens before the run starts, and a failed start leaves behind).
bool IsFreshRunDir(const std::string& run_dir);

Result<RunStart> StartFresh(const RunOptions& options, const data::TaskAdapter& task, const std::string& run_dir,
                            const std::string& resolved_yaml, const ModelEvaluator& evaluate,
                            obs::MetricsLog& metrics, std::ostream& progress, const Clock& clock, double t_start);

// Resumed run: the newest step-N whose checksums verify; metrics.jsonl is rolled back to the
// checkpoint and opened into `metrics`. `mapped`: its weights and AdamW state mapped, not read
// (run_checkpoint.h LoadNewestRunCheckpoint), for rank 0 of sharded parameters.
Result<RunStart> StartFromCheckpoint(const RunOptions& options, const data::TaskAdapter& task,
                                     const std::string& run_dir, obs::MetricsLog& metrics, std::ostream& progress,
                                     bool mapped = false);

// The run's secret (common/run_secret.h): derived from the seed under `secret: seed`; otherwise
// a fresh run draws one from the OS and a resumed run reads RUN_DIR/secret (when that file is
// gone, a new one is drawn and said so: the run goes on with groups seeded anew).
Result<RunSecret> RunSecretFor(const RunOptions& options, const std::string& run_dir, bool resume,
                               std::ostream& progress);
// Keeps a drawn secret as RUN_DIR/secret, readable by its owner alone (nothing under `secret:
// seed`).
Status KeepRunSecret(const RunOptions& options, const std::string& run_dir, const RunSecret& secret);

// A lease id base above every lease an earlier process of this run can have handed out.
uint64_t FreshLeaseBase(uint64_t saved_next_lease);

}  // namespace echelon::learn
