// SVG charts drawn in C++ for the self-contained run report (no JavaScript, no fonts or
// images fetched): line charts with several overlaid series and a legend, and grouped bar
// charts (one bar per series per category).
//
//   LineChart chart({"reward against step", "learner updates", "reward"});
//   chart.AddSeries({"S=2", {0, 1, 2}, {0.1, 0.2, NAN}});
//   chart.AddSeries({"S=2 (3 seeds)", {0, 1}, {0.1, 0.2}, {0.05, 0.1}, {0.15, 0.3}});  // band lo, hi
//   std::string svg = chart.Render();   // <svg class="chart" ...>...</svg>
//
// Every mark that shows data carries class="data" (a <polyline>, <circle> or <rect>), so a
// checker can verify that a chart drew something. Non-finite points (NaN, +-inf) are skipped
// and split a line: a series {1, NaN, 3} draws two one-point runs (as circles), never a
// coordinate "nan". Ranges cover the finite points only; an empty range (one value) is
// widened by 0.5 either side, or to [0, 1] when it is 0 and the axis includes zero.
//
// Thread contract: plain values; a chart is used by one thread at a time.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace echelon::obs {

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  int width = 560;         // pixels; the plot area leaves margins for ticks and the legend
  int height = 300;
  bool y_from_zero = false;  // widen the y range to include 0 (counts, fractions)
  // Markers on every point for sparse series (held-out evaluations), lines otherwise.
  int max_points_for_markers = 40;
};

struct Series {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;  // same length as x; the shorter length wins if they differ
  // Optional band around the line (e.g. min .. max over seeds): empty, or as long as y. Drawn
  // translucent under the line (a <polygon class="data band"> per run of points whose x, y, lo
  // and hi are all finite) and counted in the y range.
  std::vector<double> lo, hi;
  bool Banded(size_t i) const {
    return i < lo.size() && i < hi.size() && std::isfinite(lo[i]) && std::isfinite(hi[i]);
  }
};

struct Range {
  double lo = 0;
  double hi = 1;
};

// Finite-data range of values (see the header comment for the widening rule); lo=0, hi=1
// when there is no finite value.
Range DataRange(const std::vector<double>& values, bool include_zero);

// About `target` round tick positions (1, 2, 2.5 or 5 x 10^k steps) inside [r.lo, r.hi].
std::vector<double> NiceTicks(Range r, int target);

// A tick label: integers without decimals, others with up to 3 significant decimals.
std::string FormatTick(double v);

// Escapes &, <, >, " and ' for text and attribute values.
std::string XmlEscape(const std::string& s);

// The colour of series i: a fixed 10-colour palette, repeating.
const char* SeriesColor(size_t i);

class LineChart {
 public:
  explicit LineChart(ChartOptions options) : options_(std::move(options)) {}

  void AddSeries(Series s) { series_.push_back(std::move(s)); }
  const std::vector<Series>& series() const { return series_; }
  const ChartOptions& options() const { return options_; }

  Range XRange() const;
  Range YRange() const;
  // Number of finite points over all series (what Render draws).
  size_t FinitePoints() const;

  // The <svg> element. With no finite point at all it draws the axes and the text
  // "no data" and no data mark.
  std::string Render() const;

 private:
  ChartOptions options_;
  std::vector<Series> series_;
};

// Grouped bars: categories along x, one bar per series in each category.
class BarChart {
 public:
  BarChart(ChartOptions options, std::vector<std::string> categories)
      : options_(std::move(options)), categories_(std::move(categories)) {}

  // values[i] is the bar for categories[i]; missing or non-finite values draw no bar.
  void AddSeries(std::string label, std::vector<double> values) {
    labels_.push_back(std::move(label));
    values_.push_back(std::move(values));
  }

  Range YRange() const;
  // Number of bars Render draws (finite values with a category).
  size_t DataBars() const;
  const ChartOptions& options() const { return options_; }
  std::string Render() const;

 private:
  ChartOptions options_;
  std::vector<std::string> categories_;
  std::vector<std::string> labels_;
  std::vector<std::vector<double>> values_;
};

}  // namespace echelon::obs
