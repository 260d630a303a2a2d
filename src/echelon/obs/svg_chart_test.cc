#include "echelon/obs/svg_chart.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>

namespace echelon::obs {
namespace {

const double kNaN = std::nan("");

size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// The "points" attributes of every polyline, in order.
std::vector<std::string> Polylines(const std::string& svg) {
  std::vector<std::string> out;
  std::regex re("<polyline[^>]*points=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

size_t PointCount(const std::string& points) { return Count(points, ","); }

ChartOptions NoMarkers() {
  ChartOptions o;
  o.title = "t";
  o.max_points_for_markers = 0;
  return o;
}

TEST(DataRangeTest, SkipsNonFiniteValues) {
  Range r = DataRange({1, kNaN, 3, INFINITY, -INFINITY}, false);
  EXPECT_EQ(r.lo, 1);
  EXPECT_EQ(r.hi, 3);
}

TEST(DataRangeTest, IncludeZeroWidensToZero) {
  Range r = DataRange({2, 3}, true);
  EXPECT_EQ(r.lo, 0);
  EXPECT_EQ(r.hi, 3);
  r = DataRange({-2, -1}, true);
  EXPECT_EQ(r.lo, -2);
  EXPECT_EQ(r.hi, 0);
}

TEST(DataRangeTest, DegenerateAndEmptyRanges) {
  Range r = DataRange({5, 5}, false);
  EXPECT_EQ(r.lo, 4.5);
  EXPECT_EQ(r.hi, 5.5);
  r = DataRange({0, 0}, true);
  EXPECT_EQ(r.lo, 0);
  EXPECT_EQ(r.hi, 1);
  r = DataRange({kNaN}, false);
  EXPECT_EQ(r.lo, 0);
  EXPECT_EQ(r.hi, 1);
}

void ExpectTicks(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "tick " << i;
}

TEST(NiceTicksTest, RoundSteps) {
  ExpectTicks(NiceTicks({0, 1}, 5), {0, 0.2, 0.4, 0.6, 0.8, 1});
  ExpectTicks(NiceTicks({0, 300}, 6), {0, 50, 100, 150, 200, 250, 300});
  ExpectTicks(NiceTicks({0.13, 0.52}, 5), {0.2, 0.3, 0.4, 0.5});
  ExpectTicks(NiceTicks({-3, 7}, 5), {-2, 0, 2, 4, 6});
  EXPECT_TRUE(NiceTicks({1, 1}, 5).empty());
}

TEST(FormatTickTest, IntegersAndDecimals) {
  EXPECT_EQ(FormatTick(300), "300");
  EXPECT_EQ(FormatTick(0.25), "0.25");
  EXPECT_EQ(FormatTick(0.6000000000000001), "0.6");
}

TEST(XmlEscapeTest, EscapesMarkup) { EXPECT_EQ(XmlEscape("<a&\"b'>"), "&lt;a&amp;&quot;b&#39;&gt;"); }

TEST(LineChartTest, MapsDataCornersToPlotCorners) {
  LineChart c(NoMarkers());
  c.AddSeries({"a", {0, 1, 2, 3, 4}, {1, 2, 3, 4, 5}});
  EXPECT_EQ(c.XRange().lo, 0);
  EXPECT_EQ(c.XRange().hi, 4);
  EXPECT_EQ(c.YRange().lo, 1);
  EXPECT_EQ(c.YRange().hi, 5);
  EXPECT_EQ(c.FinitePoints(), 5u);
  std::vector<std::string> lines = Polylines(c.Render());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(PointCount(lines[0]), 5u);
  // Plot area: x 64..544, y 28..256 (560x300 with margins 64/16/28/44).
  EXPECT_EQ(lines[0].substr(0, 12), "64.00,256.00");
  EXPECT_EQ(lines[0].substr(lines[0].size() - 12), "544.00,28.00");
}

TEST(LineChartTest, NaNSplitsTheLineAndNeverReachesTheSvg) {
  LineChart c(NoMarkers());
  c.AddSeries({"a", {0, 1, 2, 3, 4, 5}, {1, 2, kNaN, 4, 5, 6}});
  c.AddSeries({"b", {0, 1, 2}, {kNaN, 7, kNaN}});  // a lone point: a circle
  const std::string svg = c.Render();
  std::vector<std::string> lines = Polylines(svg);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(PointCount(lines[0]), 2u);
  EXPECT_EQ(PointCount(lines[1]), 3u);
  EXPECT_EQ(Count(svg, "<circle class=\"data marker\" data-series=\"b\""), 1u);
  EXPECT_EQ(c.FinitePoints(), 6u);
  EXPECT_EQ(c.YRange().hi, 7);
  EXPECT_EQ(Count(svg, "nan"), 0u);
  EXPECT_EQ(Count(svg, "inf"), 0u);
}

TEST(LineChartTest, MarkersOnSparseSeries) {
  ChartOptions o;
  o.max_points_for_markers = 3;
  LineChart c(o);
  c.AddSeries({"sparse", {0, 1, 2}, {1, 2, 3}});
  c.AddSeries({"dense", {0, 1, 2, 3}, {1, 2, 3, 4}});
  const std::string svg = c.Render();
  EXPECT_EQ(Count(svg, "<circle class=\"data marker\" data-series=\"sparse\""), 3u);
  EXPECT_EQ(Count(svg, "<circle class=\"data marker\" data-series=\"dense\""), 0u);
  EXPECT_EQ(Polylines(svg).size(), 2u);
}

TEST(LineChartTest, LegendHasOneEntryPerSeries) {
  LineChart c(NoMarkers());
  c.AddSeries({"S=0", {0, 1}, {0, 1}});
  c.AddSeries({"S=<16>", {0, 1}, {1, 0}});
  c.AddSeries({"empty", {}, {}});
  const std::string svg = c.Render();
  EXPECT_EQ(Count(svg, "class=\"legend-entry\""), 3u);
  EXPECT_EQ(Count(svg, ">S=0</text>"), 1u);
  EXPECT_EQ(Count(svg, ">S=&lt;16&gt;</text>"), 1u);
  EXPECT_EQ(Count(svg, SeriesColor(1)), 2u);  // the line and its legend swatch
}

TEST(LineChartTest, NoFinitePointDrawsNoDataMark) {
  LineChart c(NoMarkers());
  c.AddSeries({"a", {0, 1}, {kNaN, kNaN}});
  const std::string svg = c.Render();
  EXPECT_EQ(c.FinitePoints(), 0u);
  EXPECT_EQ(Count(svg, "class=\"data"), 0u);
  EXPECT_EQ(Count(svg, ">no data<"), 1u);
}

TEST(LineChartTest, MismatchedLengthsUseTheShorter) {
  LineChart c(NoMarkers());
  c.AddSeries({"a", {0, 1, 2}, {1, 2}});
  EXPECT_EQ(c.FinitePoints(), 2u);
  EXPECT_EQ(PointCount(Polylines(c.Render())[0]), 2u);
}

TEST(BarChartTest, OneBarPerFiniteValue) {
  BarChart b(NoMarkers(), {"0", "1", "2"});
  b.AddSeries("r1", {0.5, 0.25, 0.25});
  b.AddSeries("r2", {1.0, kNaN});
  EXPECT_EQ(b.DataBars(), 4u);
  EXPECT_EQ(b.YRange().lo, 0);
  EXPECT_EQ(b.YRange().hi, 1);
  const std::string svg = b.Render();
  EXPECT_EQ(Count(svg, "<rect class=\"data\""), 4u);
  EXPECT_EQ(Count(svg, "class=\"legend-entry\""), 2u);
  EXPECT_EQ(Count(svg, "nan"), 0u);
  // Bands of 160 px; two bars of 64 px after a 16 px gap. r2's 1.0 spans the plot height (28..256).
  EXPECT_NE(svg.find("data-series=\"r1\" x=\"80.00\" y=\"142.00\" width=\"64.00\" height=\"114.00\""), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"r2\" x=\"144.00\" y=\"28.00\" width=\"64.00\" height=\"228.00\""), std::string::npos);
}

TEST(BarChartTest, AllMissingDrawsNoDataMark) {
  BarChart b(NoMarkers(), {"0"});
  b.AddSeries("r", {kNaN});
  EXPECT_EQ(b.DataBars(), 0u);
  EXPECT_EQ(Count(b.Render(), "class=\"data"), 0u);
}

TEST(SvgChartTest, BandPolygonFollowsHiThenLoBack) {
  LineChart chart(ChartOptions{"t", "x", "y"});
  chart.AddSeries({"a", {0, 1, 2}, {1, 2, 3}, {0, 1, 2}, {2, 3, 4}});
  const std::string svg = chart.Render();
  EXPECT_EQ(Count(svg, "<polygon class=\"data band\""), 1u);
  EXPECT_EQ(chart.YRange().lo, 0);
  EXPECT_EQ(chart.YRange().hi, 4);
  // A band point that is not finite splits the polygon; a lone banded point draws none.
  LineChart split(ChartOptions{"t", "x", "y"});
  split.AddSeries({"a", {0, 1, 2, 3}, {1, 2, 3, 4}, {0, kNaN, 2, 3}, {2, 3, 4, 5}});
  EXPECT_EQ(Count(split.Render(), "<polygon class=\"data band\""), 1u);
}

}  // namespace
}  // namespace echelon::obs
