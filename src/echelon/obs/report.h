// The run report: one self-contained HTML file (inline CSS and SVG, no scripts, nothing
// fetched) comparing one or more run directories on the same axes.
//
//   std::vector<RunData> runs;  // from LoadRun(dir) for each dir, then AssignLabels(&runs)
//   Status s = WriteReport(runs, "report.html");
//
// Charts (each run is one series, legend by run label):
//   reward against learner updates and against wall time (trailing mean, window shown);
//   held-out accuracy (warm-start, periodic evaluations, final) against updates and wall time;
//   learner busy fraction; the importance weights' ESS fraction (is_ess_frac); where a setting
//   was run with several seeds (GroupBySeed), held-out accuracy against wall time and the ESS
//   fraction as the mean over seeds with a min .. max band; consumed-staleness histogram (from "staleness_hist" when the
//   metrics carry it, else from each step's mean staleness rounded, and the chart says so);
//   dropped-stale and re-issued groups; the share of completion tokens wasted (stale,
//   preempted, refused: "tokens_by_fate"); per-actor throughput over time and on average (from
//   "actor_groups"); snapshot broadcast times. Wall time is seconds since RL started (the
//   warm-start event's wall_s), so runs with different warm-starts line up.
// A chart whose data no run carries is replaced by a note saying what is missing, so every
// <svg class="chart"> in the file has at least one class="data" mark with finite coordinates.
// Tables: a per-run summary (final numbers); each worker's statistics (from the last line
// carrying "actor_stats", beside its accepted and forged counts, outlier flags marked); and the
// config of every run side by side, with the keys whose values differ between runs marked.
//
// Thread contract: free functions over values; no shared state.
#pragma once

#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/obs/report_data.h"
#include "echelon/obs/svg_chart.h"

namespace echelon::obs {

// Mean of the finite values among v[i-window+1 .. i]; NaN where there are none.
std::vector<double> TrailingMean(const std::vector<double>& v, size_t window);

// Window for the reward curves: about 50 points of smoothing across the longest run.
size_t RewardWindow(const std::vector<RunData>& runs);

// Consumed staleness: categories "0".."max" and, per run, the fraction of consumed groups
// (exact = every run had staleness_hist) or of steps by rounded mean staleness (exact = false).
struct StalenessHistogram {
  std::vector<std::string> categories;
  std::vector<std::vector<double>> fractions;  // [run][category]
  bool exact = true;
};
StalenessHistogram BuildStalenessHistogram(const std::vector<RunData>& runs);

// Seconds since RL start for a wall_s of this run.
double RlSeconds(const RunData& run, double wall_s);

// Runs whose configs differ only in `seed`, in order of first appearance; a run without a
// config is a group of its own. label: the config keys whose values differ between groups
// ("staleness=64, correction=tis") and the number of seeds.
struct SeedGroup {
  std::string label;
  std::vector<const RunData*> runs;
};
std::vector<SeedGroup> GroupBySeed(const std::vector<RunData>& runs);

// The charts of the report, in order (for tests and the HTML); a chart with no finite point
// is still returned, and RenderReport replaces it by a note.
struct NamedLineChart {
  std::string id;
  LineChart chart;
  std::string missing_note;  // shown instead of the chart when it has no finite point
};
std::vector<NamedLineChart> BuildLineCharts(const std::vector<RunData>& runs);

std::string RenderReport(const std::vector<RunData>& runs);

// RenderReport, written atomically to out_path.
Status WriteReport(const std::vector<RunData>& runs, const std::string& out_path);

}  // namespace echelon::obs
