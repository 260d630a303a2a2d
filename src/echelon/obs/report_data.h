// RunData: what `echelon report` reads from one run directory: metrics.jsonl (one JSON
// object per line) and config.yaml (the resolved config).
//
//   Result<RunData> run = LoadRun("runs/math-tiny-20261130");
//   if (!run.ok()) { std::cerr << run.status().message(); ... }  // "<dir>/metrics.jsonl:17: ..."
//
// metrics.jsonl lines:
//   - {"event": "warmstart" | "final" | "interrupted", ...}: events; the held-out accuracy of
//     the warm-start and of the final policy, wall time, totals.
//   - {"event": "eval", "set", "version", "eval/SET": {mean_at_k, pass_at_k, k, ...}}: one
//     evaluation set's figures of one round (learn/eval_rounds.h). Other events are ignored.
//   - any other object is a training step, read by obs::StepRecord::FromJson
//     (obs/step_record.h: an integer "step", a number "wall_s", every other field optional
//     and type-checked).
//   - blank lines are skipped.
// Every error names the file and the 1-based line (or the directory when a file is missing).
//
// Thread contract: plain values and free functions; no shared state.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/obs/step_record.h"

namespace echelon::obs {

struct RunEvent {
  bool present = false;
  double wall_s = kMissing;
  double heldout_accuracy = kMissing;
  double version = kMissing;
  double learner_busy_frac = kMissing;
  double groups_consumed = kMissing, groups_dropped_stale = kMissing, groups_reissued = kMissing;
  std::string kind;             // "warmstart", "final" or "interrupted"
};

// One evaluation set's figures of one round (eval.sets).
struct EvalPoint {
  std::string set;
  double version = kMissing;
  double k = kMissing;
  double mean_at_k = kMissing;
  double pass_at_k = kMissing;
};

struct RunData {
  std::string dir;
  std::string label;  // short name for legends (the directory's base name)
  std::vector<StepRecord> steps;
  RunEvent warmstart;
  RunEvent end;  // "final" or "interrupted"
  std::vector<EvalPoint> evals;  // in file order
  // Flattened config.yaml ("rl.staleness" -> "2"), in file order; empty with
  // config_note set when the run directory has no config.yaml.
  std::vector<std::pair<std::string, std::string>> config;
  std::string config_note;
};

// Parses metrics.jsonl text; `path` names the file in errors.
Result<RunData> ParseMetrics(std::istream& in, const std::string& path);

// Flattens config.yaml text into dotted keys; `path` names the file in errors (with the line
// of a YAML syntax error).
Result<std::vector<std::pair<std::string, std::string>>> ParseConfigYaml(const std::string& text,
                                                                          const std::string& path);

// Reads dir/metrics.jsonl (required, at least one training step) and dir/config.yaml
// (optional: its absence is noted, not an error).
Result<RunData> LoadRun(const std::string& dir);

// Gives runs with the same base name distinct labels (the shortest distinguishing path suffix).
void AssignLabels(std::vector<RunData>* runs);

}  // namespace echelon::obs
