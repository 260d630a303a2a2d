// RunData: what `echelon report` reads from one run directory: metrics.jsonl (one JSON
// object per line) and config.yaml (the resolved config).
//
//   Result<RunData> run = LoadRun("runs/math-tiny-20261130");
//   if (!run.ok()) { std::cerr << run.status().message(); ... }  // "<dir>/metrics.jsonl:17: ..."
//
// metrics.jsonl lines:
//   - {"event": "warmstart" | "final" | "interrupted", ...}: events; the held-out accuracy of
//     the warm-start and of the final policy, wall time, totals. Other events are ignored.
//   - any other object is a training step and must carry numbers "step" and "wall_s". The
//     optional fields below, when present, must be numbers (null reads as missing); a missing
//     one reads as NaN (charts skip it): version, step_s, reward_mean, accuracy,
//     heldout_accuracy, staleness_mean, staleness_max, staleness_bound, groups_consumed,
//     groups_dropped_stale, groups_reissued, learner_busy_frac, tokens_per_s, and the snapshot
//     broadcast time "broadcast_s" (also read as "snapshot_broadcast_s").
//     "actor_groups" ({"actor": accepted groups so far}) and "staleness_hist"
//     ({"0": groups, "1": groups, ...}, consumed groups of this step by staleness) must be
//     objects of non-negative integers.
//   - blank lines are skipped.
// Every error names the file and the 1-based line (or the directory when a file is missing).
//
// Thread contract: plain values and free functions; no shared state.
#pragma once

#include <cstdint>
#include <istream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::obs {

// A field the metrics did not carry.
inline constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

struct StepRecord {
  int64_t step = 0;
  double wall_s = 0;
  double version = kMissing;  // every double below: kMissing when absent
  double step_s = kMissing;
  double reward_mean = kMissing;
  double accuracy = kMissing;
  double heldout_accuracy = kMissing;
  double staleness_mean = kMissing;
  double staleness_max = kMissing;
  double staleness_bound = kMissing;
  double groups_consumed = kMissing;
  double groups_dropped_stale = kMissing;
  double groups_reissued = kMissing;
  double learner_busy_frac = kMissing;
  double tokens_per_s = kMissing;
  double broadcast_s = kMissing;
  std::map<std::string, int64_t> actor_groups;    // empty when absent
  std::map<int64_t, int64_t> staleness_hist;      // empty when absent
};

struct RunEvent {
  bool present = false;
  double wall_s = kMissing;
  double heldout_accuracy = kMissing;
  double version = kMissing;
  double learner_busy_frac = kMissing;
  double groups_consumed = kMissing, groups_dropped_stale = kMissing, groups_reissued = kMissing;
  std::string kind;             // "warmstart", "final" or "interrupted"
};

struct RunData {
  std::string dir;
  std::string label;  // short name for legends (the directory's base name)
  std::vector<StepRecord> steps;
  RunEvent warmstart;
  RunEvent end;  // "final" or "interrupted"
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
