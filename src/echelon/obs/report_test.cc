#include "echelon/obs/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>

namespace echelon::obs {
namespace {

const double kNaN = std::nan("");

size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// A run of n steps, 1 s apart after a warm-start ending at 10 s; held-out at the middle step.
RunData MakeRun(const std::string& label, int n, bool with_actors, bool with_hist) {
  RunData r;
  r.dir = "/runs/" + label;
  r.label = label;
  r.warmstart.present = true;
  r.warmstart.wall_s = 10;
  r.warmstart.heldout_accuracy = 0.1;
  r.end.present = true;
  r.end.kind = "final";
  r.end.version = n;
  r.end.heldout_accuracy = 0.4;
  for (int i = 0; i < n; ++i) {
    StepRecord s;
    s.step = i;
    s.version = i + 1;
    s.wall_s = 11 + i;
    s.reward_mean = 0.1 * i;
    s.learner_busy_frac = 0.5;
    s.staleness_mean = i % 2;
    s.staleness_max = i % 2;
    s.groups_dropped_stale = i;
    s.groups_reissued = 0;
    if (i == n / 2) s.heldout_accuracy = 0.25;
    if (with_actors) s.actor_groups = {{"actor-0", 2 * (i + 1)}, {"actor-1", i + 1}};
    if (with_actors) s.tokens_by_fate = {{"consumed", 100 * (i + 1)}, {"stale", 5 * i}, {"preempted", 0}};
    if (with_hist) s.staleness_hist = {{0, 3}, {2, 1}};
    r.steps.push_back(s);
  }
  r.config = {{"rl.staleness", label}, {"seed", "1"}};
  return r;
}

const NamedLineChart& Chart(const std::vector<NamedLineChart>& charts, const std::string& id) {
  for (const NamedLineChart& c : charts)
    if (c.id == id) return c;
  throw std::runtime_error("no chart " + id);
}

TEST(TrailingMeanTest, SkipsNaNInsideTheWindow) {
  std::vector<double> m = TrailingMean({1, 2, 3, kNaN, 5}, 2);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], 1);
  EXPECT_EQ(m[1], 1.5);
  EXPECT_EQ(m[2], 2.5);
  EXPECT_EQ(m[3], 3);
  EXPECT_EQ(m[4], 5);
  m = TrailingMean({kNaN, kNaN}, 3);
  EXPECT_TRUE(std::isnan(m[0]) && std::isnan(m[1]));
}

TEST(RewardWindowTest, AboutFiftyPointsAcrossTheLongestRun) {
  EXPECT_EQ(RewardWindow({MakeRun("a", 10, false, false)}), 1u);
  EXPECT_EQ(RewardWindow({MakeRun("a", 10, false, false), MakeRun("b", 300, false, false)}), 6u);
}

TEST(StalenessHistogramTest, ExactFromPerStepHistograms) {
  StalenessHistogram h = BuildStalenessHistogram({MakeRun("a", 4, false, true)});
  EXPECT_TRUE(h.exact);
  EXPECT_EQ(h.categories, (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_EQ(h.fractions.size(), 1u);
  EXPECT_EQ(h.fractions[0], (std::vector<double>{0.75, 0, 0.25}));
}

TEST(StalenessHistogramTest, DerivedFromRoundedMeansWhenAnyRunLacksHistograms) {
  RunData a = MakeRun("a", 3, false, false);
  a.steps[0].staleness_mean = 0.4;  // -> 0
  a.steps[1].staleness_mean = 1.5;  // -> 2
  a.steps[2].staleness_mean = kNaN;  // skipped
  RunData b = MakeRun("b", 2, false, true);
  StalenessHistogram h = BuildStalenessHistogram({a, b});
  EXPECT_FALSE(h.exact);
  EXPECT_EQ(h.categories, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(h.fractions[0], (std::vector<double>{0.5, 0, 0.5}));
  EXPECT_EQ(h.fractions[1], (std::vector<double>{0.5, 0.5, 0}));  // b's means 0, 1
}

TEST(BuildLineChartsTest, PointCountsAndRanges) {
  std::vector<RunData> runs = {MakeRun("S0", 6, true, false), MakeRun("S4", 4, false, false)};
  runs[0].evals = {{"aime", 0, 4, 0.25, 0.5}, {"math", 0, 2, 0.5, 0.75}, {"aime", 3, 4, 0.375, 1.0}};
  std::vector<NamedLineChart> charts = BuildLineCharts(runs);
  ASSERT_EQ(charts.size(), 12u);  // no setting with several seeds: no seed-band charts

  // Evaluation sets: mean@k and pass@k of each set against the round's version.
  const LineChart& evals = Chart(charts, "eval-sets").chart;
  ASSERT_EQ(evals.series().size(), 4u);
  EXPECT_EQ(evals.series()[0].label, "S0 aime mean@4");
  EXPECT_EQ(evals.series()[0].x, (std::vector<double>{0, 3}));
  EXPECT_EQ(evals.series()[0].y, (std::vector<double>{0.25, 0.375}));
  EXPECT_EQ(evals.series()[1].label, "S0 aime pass@4");
  EXPECT_EQ(evals.series()[1].y, (std::vector<double>{0.5, 1.0}));
  EXPECT_EQ(evals.series()[3].label, "S0 math pass@2");

  const LineChart& reward = Chart(charts, "reward-step").chart;
  ASSERT_EQ(reward.series().size(), 2u);
  EXPECT_EQ(reward.series()[0].label, "S0");
  EXPECT_EQ(reward.FinitePoints(), 10u);
  EXPECT_EQ(reward.XRange().lo, 1);  // versions 1..6
  EXPECT_EQ(reward.XRange().hi, 6);

  const LineChart& wall = Chart(charts, "reward-wall").chart;
  EXPECT_EQ(wall.XRange().lo, 1);  // seconds since the warm-start ended
  EXPECT_EQ(wall.XRange().hi, 6);

  // Held-out: warm-start at 0, the middle evaluation, final at the last version.
  const LineChart& held = Chart(charts, "heldout-step").chart;
  EXPECT_EQ(held.series()[0].x, (std::vector<double>{0, 4, 6}));
  EXPECT_EQ(held.series()[0].y, (std::vector<double>{0.1, 0.25, 0.4}));
  EXPECT_EQ(held.YRange().lo, 0);
  EXPECT_EQ(held.YRange().hi, 0.4);
  const LineChart& held_wall = Chart(charts, "heldout-wall").chart;
  EXPECT_EQ(held_wall.series()[0].x, (std::vector<double>{0, 4, 6}));  // final at the last step's time

  // Per-actor rate: only S0 logs actors; one series per actor, n - window points each.
  const LineChart& rate = Chart(charts, "actor-rate").chart;
  ASSERT_EQ(rate.series().size(), 2u);
  EXPECT_EQ(rate.series()[0].label, "S0: actor-0");
  EXPECT_EQ(rate.series()[0].y, (std::vector<double>{2, 2, 2, 2, 2}));
  EXPECT_EQ(rate.series()[1].y, (std::vector<double>{1, 1, 1, 1, 1}));

  EXPECT_EQ(Chart(charts, "broadcast").chart.FinitePoints(), 0u);
  EXPECT_EQ(Chart(charts, "dropped").chart.YRange().hi, 5);
}

TEST(RenderReportTest, EveryChartHasFiniteDataAndALegend) {
  std::vector<RunData> runs = {MakeRun("S0", 6, true, true), MakeRun("S<4>", 4, true, true)};
  const std::string html = RenderReport(runs);
  // 9 line charts with data (broadcast has none) + staleness histogram + per-actor mean bars.
  EXPECT_EQ(Count(html, "<svg class=\"chart\""), 11u);
  std::regex svg_re("<svg class=\"chart\"[\\s\\S]*?</svg>");
  size_t charts = 0;
  for (std::sregex_iterator it(html.begin(), html.end(), svg_re), end; it != end; ++it) {
    const std::string svg = it->str();
    EXPECT_GE(Count(svg, "class=\"data"), 1u) << svg.substr(0, 200);
    EXPECT_GE(Count(svg, "class=\"legend-entry\""), 2u);
    ++charts;
  }
  EXPECT_EQ(charts, 11u);
  EXPECT_EQ(Count(html, "nan"), 0u);
  EXPECT_EQ(Count(html, "inf\""), 0u);
  EXPECT_EQ(Count(html, ">S&lt;4&gt;</text>"), 10u);  // escaped in every legend
  // Self-contained: no scripts, no external resources.
  EXPECT_EQ(Count(html, "<script"), 0u);
  EXPECT_EQ(Count(html, "src="), 0u);
  EXPECT_EQ(Count(html, "href="), 0u);
  EXPECT_EQ(Count(html, "http"), Count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
}

TEST(RenderReportTest, AbsentDataBecomesANote) {
  std::vector<RunData> runs = {MakeRun("a", 5, false, false)};
  const std::string html = RenderReport(runs);
  EXPECT_EQ(Count(html, "<div class=\"chart-box missing\" id=\"broadcast\">"), 1u);
  EXPECT_EQ(Count(html, "<div class=\"chart-box missing\" id=\"actor-rate\">"), 1u);
  EXPECT_EQ(Count(html, "<div class=\"chart-box missing\" id=\"wasted\">"), 1u);
  EXPECT_EQ(Count(html, "id=\"actor-mean\""), 0u);
  EXPECT_EQ(Count(html, "each step counts once, at its mean staleness rounded"), 1u);
  // reward x2, held-out x2, busy, dropped, re-issued, staleness histogram.
  EXPECT_EQ(Count(html, "<svg class=\"chart\""), 8u);
}

TEST(RenderReportTest, ConfigTableMarksDifferingKeys) {
  std::vector<RunData> runs = {MakeRun("S0", 3, false, false), MakeRun("S4", 3, false, false)};
  const std::string html = RenderReport(runs);
  EXPECT_EQ(Count(html, "<tr class=\"diff\"><td>rl.staleness</td><td>S0</td><td>S4</td></tr>"), 1u);
  EXPECT_EQ(Count(html, "<tr><td>seed</td><td>1</td><td>1</td></tr>"), 1u);
}

// The per-worker statistics the learner logs (actor_stats) are a table beside each worker's
// accepted and forged counts, taken from the last line that carries them, flagged statistics
// marked; a run without them has no table.
TEST(RenderReportTest, WorkerStatisticsTableShowsOutliers) {
  std::vector<RunData> runs = {MakeRun("a", 4, true, false), MakeRun("b", 4, false, false)};
  runs[0].steps[1].actor_stats = nlohmann::json::parse(R"({"actor-0": {"groups": 1, "reward_mean": 0.1}})");
  runs[0].steps[2].actor_stats = nlohmann::json::parse(
      R"({"actor-0": {"groups": 20, "reward_mean": 0.25, "zero_spread_frac": 0.5, "length_mean": 31.5, "gap_mean": 0.0012},
          "actor-1": {"groups": 18, "reward_mean": 0.95, "zero_spread_frac": 0.1, "length_mean": 30, "gap_mean": 0.001,
                      "outlier": ["reward_mean"]}})");
  runs[0].steps.back().actor_forged = {{"actor-1", 2}};
  const std::string html = RenderReport(runs);
  EXPECT_EQ(Count(html, "<table id=\"workers\">"), 1u);
  EXPECT_EQ(Count(html, "<tr><td>a</td><td>actor-0</td><td class=\"num\">20</td><td class=\"num\">8</td>"
                        "<td class=\"num\">&ndash;</td><td class=\"num\">0.250</td>"),
            1u)
      << html;
  EXPECT_EQ(Count(html, "<td class=\"num outlier\">0.950 (outlier)</td>"), 1u);
  EXPECT_EQ(Count(html, "<td class=\"num\">2</td><td class=\"num outlier\">"), 1u);  // actor-1's forged count
  EXPECT_EQ(Count(html, "<td>b</td><td>actor-"), 0u);
  EXPECT_EQ(Count(RenderReport({MakeRun("b", 4, false, false)}), "id=\"workers\""), 0u);
}

// Three seeds of S = 64 and one of S = 0: the seeds of a setting become one series, the mean
// with a min .. max band, at the updates every seed evaluated, drawn at the mean RL seconds.
TEST(SeedBandsTest, SettingsRunWithSeveralSeedsAreDrawnAsMeanAndBand) {
  std::vector<RunData> runs;
  for (int seed = 1; seed <= 3; ++seed) {
    RunData r = MakeRun("64-none-seed" + std::to_string(seed), 6, false, false);
    r.config = {{"rl.staleness", "64"}, {"seed", std::to_string(seed)}};
    r.end.heldout_accuracy = 0.3 + 0.1 * seed;  // 0.4, 0.5, 0.6
    for (StepRecord& s : r.steps) {
      s.wall_s += seed;  // seed k's steps k seconds later
      s.is_ess_frac = 1.0 - 0.1 * seed;
    }
    if (seed == 3) r.steps[3].heldout_accuracy = kNaN;  // seed 3 missed the middle evaluation
    runs.push_back(r);
  }
  runs.push_back(MakeRun("0-none-seed1", 6, false, false));
  runs.back().config = {{"rl.staleness", "0"}, {"seed", "1"}};

  const std::vector<SeedGroup> groups = GroupBySeed(runs);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].label, "staleness=64 (3 seeds)");
  EXPECT_EQ(groups[0].runs.size(), 3u);
  EXPECT_EQ(groups[1].label, "staleness=0 (1 run)");

  std::vector<NamedLineChart> charts = BuildLineCharts(runs);
  ASSERT_EQ(charts.size(), 14u);  // the 12 of one seed (eval-sets among them) and two seed bands
  const LineChart& held = Chart(charts, "heldout-wall-seeds").chart;
  ASSERT_EQ(held.series().size(), 2u);
  const Series& s64 = held.series()[0];
  EXPECT_EQ(s64.label, "staleness=64 (3 seeds)");
  // Warm-start (update 0) and final (update 6); the middle evaluation is not in every seed.
  ASSERT_EQ(s64.x.size(), 2u);
  EXPECT_EQ(s64.x[0], 0);
  EXPECT_DOUBLE_EQ(s64.x[1], 6 + 2);  // the last step: RL second 6 plus the seeds' mean offset
  EXPECT_DOUBLE_EQ(s64.y[1], 0.5);
  EXPECT_DOUBLE_EQ(s64.lo[1], 0.4);
  EXPECT_DOUBLE_EQ(s64.hi[1], 0.6);
  EXPECT_DOUBLE_EQ(held.YRange().hi, 0.6);  // the band counts in the range
  EXPECT_EQ(held.series()[1].x.size(), 3u);  // S = 0's one run: its points, no band
  EXPECT_TRUE(held.series()[1].lo.empty());

  const LineChart& ess = Chart(charts, "ess-seeds").chart;
  const Series& e64 = ess.series()[0];
  ASSERT_EQ(e64.x.size(), 6u);
  EXPECT_NEAR(e64.y[0], 0.8, 1e-12);
  EXPECT_NEAR(e64.lo[0], 0.7, 1e-12);
  EXPECT_NEAR(e64.hi[0], 0.9, 1e-12);
  EXPECT_EQ(ess.series()[1].x.size(), 0u);  // S = 0's run logs no ESS

  const std::string html = RenderReport(runs);
  EXPECT_EQ(Count(html, "<polygon class=\"data band\" data-series=\"staleness=64 (3 seeds)\""), 2u);
  EXPECT_EQ(Count(html, "nan"), 0u);
}

}  // namespace
}  // namespace echelon::obs
