#include "echelon/obs/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace echelon::obs {
namespace {

// Plot-area margins (pixels): room for y tick labels on the left, x tick labels and the
// axis label below, the title above.
constexpr int kLeft = 64;
constexpr int kRight = 16;
constexpr int kTop = 28;
constexpr int kBottom = 44;
constexpr int kLegendRow = 16;
constexpr int kLegendColumn = 250;  // wide enough for "run-name: actor-3" labels

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

struct Frame {
  int width, height;  // whole svg
  double x0, x1, y0, y1;  // plot area in pixels (y0 top)
};

int LegendColumns(int width) { return std::max(1, (width - kLeft) / kLegendColumn); }

int LegendHeight(int width, size_t entries) {
  if (entries == 0) return 0;
  const int cols = LegendColumns(width);
  return 8 + kLegendRow * static_cast<int>((entries + cols - 1) / cols);
}

Frame MakeFrame(const ChartOptions& o, size_t legend_entries) {
  const int plot_h = o.height - kTop - kBottom;
  Frame f;
  f.width = o.width;
  f.height = o.height + LegendHeight(o.width, legend_entries);
  f.x0 = kLeft;
  f.x1 = o.width - kRight;
  f.y0 = kTop;
  f.y1 = kTop + plot_h;
  return f;
}

void OpenSvg(std::ostringstream& out, const Frame& f, const ChartOptions& o, const std::string& kind) {
  out << "<svg class=\"chart\" data-kind=\"" << kind << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << f.width
      << "\" height=\"" << f.height << "\" viewBox=\"0 0 " << f.width << " " << f.height << "\" role=\"img\">"
      << "<title>" << XmlEscape(o.title) << "</title>"
      << "<rect x=\"0\" y=\"0\" width=\"" << f.width << "\" height=\"" << f.height << "\" fill=\"#ffffff\"/>"
      << "<text class=\"title\" x=\"" << f.x0 << "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">"
      << XmlEscape(o.title) << "</text>";
}

void AxisLabels(std::ostringstream& out, const Frame& f, const ChartOptions& o) {
  out << "<text class=\"x-label\" x=\"" << Num((f.x0 + f.x1) / 2) << "\" y=\"" << Num(f.y1 + 36)
      << "\" font-size=\"12\" text-anchor=\"middle\">" << XmlEscape(o.x_label) << "</text>"
      << "<text class=\"y-label\" x=\"14\" y=\"" << Num((f.y0 + f.y1) / 2) << "\" font-size=\"12\" "
      << "text-anchor=\"middle\" transform=\"rotate(-90 14 " << Num((f.y0 + f.y1) / 2) << ")\">"
      << XmlEscape(o.y_label) << "</text>"
      << "<rect x=\"" << Num(f.x0) << "\" y=\"" << Num(f.y0) << "\" width=\"" << Num(f.x1 - f.x0) << "\" height=\""
      << Num(f.y1 - f.y0) << "\" fill=\"none\" stroke=\"#888888\"/>";
}

void YTicks(std::ostringstream& out, const Frame& f, Range y) {
  for (double t : NiceTicks(y, 5)) {
    const double py = f.y1 - (t - y.lo) / (y.hi - y.lo) * (f.y1 - f.y0);
    out << "<line x1=\"" << Num(f.x0) << "\" y1=\"" << Num(py) << "\" x2=\"" << Num(f.x1) << "\" y2=\"" << Num(py)
        << "\" stroke=\"#e4e4e4\"/>"
        << "<text class=\"tick\" x=\"" << Num(f.x0 - 4) << "\" y=\"" << Num(py + 4)
        << "\" font-size=\"11\" text-anchor=\"end\">" << FormatTick(t) << "</text>";
  }
}

void Legend(std::ostringstream& out, const Frame& f, const ChartOptions& o, const std::vector<std::string>& labels) {
  if (labels.empty()) return;
  const int cols = LegendColumns(f.width);
  out << "<g class=\"legend\">";
  for (size_t i = 0; i < labels.size(); ++i) {
    const double x = kLeft + kLegendColumn * static_cast<double>(i % cols);
    const double y = o.height + kLegendRow * static_cast<double>(i / cols);
    out << "<g class=\"legend-entry\"><rect x=\"" << Num(x) << "\" y=\"" << Num(y) << "\" width=\"12\" height=\"10\" fill=\""
        << SeriesColor(i) << "\"/><text x=\"" << Num(x + 16) << "\" y=\"" << Num(y + 9) << "\" font-size=\"11\">"
        << XmlEscape(labels[i]) << "</text></g>";
  }
  out << "</g>";
}

void NoData(std::ostringstream& out, const Frame& f) {
  out << "<text class=\"no-data\" x=\"" << Num((f.x0 + f.x1) / 2) << "\" y=\"" << Num((f.y0 + f.y1) / 2)
      << "\" font-size=\"13\" text-anchor=\"middle\" fill=\"#a00000\">no data</text>";
}

}  // namespace

Range DataRange(const std::vector<double>& values, bool include_zero) {
  bool any = false;
  double lo = 0, hi = 0;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (!any) {
      lo = hi = v;
      any = true;
    } else {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (!any) return {0, 1};
  if (include_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (lo == hi) {
    if (include_zero && lo == 0) return {0, 1};
    return {lo - 0.5, hi + 0.5};
  }
  return {lo, hi};
}

std::vector<double> NiceTicks(Range r, int target) {
  std::vector<double> ticks;
  const double span = r.hi - r.lo;
  if (!(span > 0) || !std::isfinite(span) || target < 1) return ticks;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const double first = std::ceil(r.lo / step - 1e-9) * step;
  for (int i = 0; i < 100; ++i) {
    const double t = first + i * step;
    if (t > r.hi + step * 1e-9) break;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string FormatTick(double v) {
  char buf[32];
  if (std::abs(v - std::round(v)) < 1e-9 && std::abs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3f", v);
    std::string s = buf;
    while (!s.empty() && s.back() == '0') s.pop_back();
    return s;
  }
  return buf;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* SeriesColor(size_t i) {
  // Tableau 10: distinguishable, and readable on white.
  static const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kPalette[i % 10];
}

Range LineChart::XRange() const {
  std::vector<double> xs;
  for (const Series& s : series_)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) xs.push_back(s.x[i]);
  return DataRange(xs, false);
}

Range LineChart::YRange() const {
  std::vector<double> ys;
  for (const Series& s : series_)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        ys.push_back(s.y[i]);
        if (s.Banded(i)) ys.insert(ys.end(), {s.lo[i], s.hi[i]});
      }
  return DataRange(ys, options_.y_from_zero);
}

size_t LineChart::FinitePoints() const {
  size_t n = 0;
  for (const Series& s : series_)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) ++n;
  return n;
}

std::string LineChart::Render() const {
  std::vector<std::string> labels;
  for (const Series& s : series_) labels.push_back(s.label);
  const Frame f = MakeFrame(options_, labels.size());
  const Range xr = XRange(), yr = YRange();
  std::ostringstream out;
  OpenSvg(out, f, options_, "line");
  YTicks(out, f, yr);
  for (double t : NiceTicks(xr, 6)) {
    const double px = f.x0 + (t - xr.lo) / (xr.hi - xr.lo) * (f.x1 - f.x0);
    out << "<text class=\"tick\" x=\"" << Num(px) << "\" y=\"" << Num(f.y1 + 15) << "\" font-size=\"11\" "
        << "text-anchor=\"middle\">" << FormatTick(t) << "</text>";
  }
  AxisLabels(out, f, options_);
  auto px = [&](double x) { return f.x0 + (x - xr.lo) / (xr.hi - xr.lo) * (f.x1 - f.x0); };
  auto py = [&](double y) { return f.y1 - (y - yr.lo) / (yr.hi - yr.lo) * (f.y1 - f.y0); };
  for (size_t si = 0; si < series_.size(); ++si) {
    const Series& s = series_[si];
    const size_t n = std::min(s.x.size(), s.y.size());
    size_t finite = 0;
    for (size_t i = 0; i < n; ++i) finite += std::isfinite(s.x[i]) && std::isfinite(s.y[i]);
    const bool markers = finite <= static_cast<size_t>(options_.max_points_for_markers);
    const std::string color = SeriesColor(si);
    const std::string label = XmlEscape(s.label);
    // The band under the line: a polygon along hi and back along lo per run of banded points.
    auto banded = [&](size_t k) { return std::isfinite(s.x[k]) && std::isfinite(s.y[k]) && s.Banded(k); };
    for (size_t i = 0; i < n;) {
      while (i < n && !banded(i)) ++i;
      size_t j = i;
      while (j < n && banded(j)) ++j;
      if (j - i >= 2) {
        out << "<polygon class=\"data band\" data-series=\"" << label << "\" fill=\"" << color
            << "\" fill-opacity=\"0.18\" stroke=\"none\" points=\"";
        for (size_t k = i; k < j; ++k) out << (k > i ? " " : "") << Num(px(s.x[k])) << "," << Num(py(s.hi[k]));
        for (size_t k = j; k-- > i;) out << " " << Num(px(s.x[k])) << "," << Num(py(s.lo[k]));
        out << "\"/>";
      }
      i = j;
    }
    // Runs of consecutive finite points: a polyline each, or a circle for a lone point.
    size_t i = 0;
    while (i < n) {
      while (i < n && !(std::isfinite(s.x[i]) && std::isfinite(s.y[i]))) ++i;
      size_t j = i;
      while (j < n && std::isfinite(s.x[j]) && std::isfinite(s.y[j])) ++j;
      if (j - i >= 2) {
        out << "<polyline class=\"data\" data-series=\"" << label << "\" fill=\"none\" stroke=\"" << color
            << "\" stroke-width=\"1.5\" points=\"";
        for (size_t k = i; k < j; ++k) out << (k > i ? " " : "") << Num(px(s.x[k])) << "," << Num(py(s.y[k]));
        out << "\"/>";
      }
      if (j - i == 1 || markers)
        for (size_t k = i; k < j; ++k)
          out << "<circle class=\"data marker\" data-series=\"" << label << "\" cx=\"" << Num(px(s.x[k])) << "\" cy=\""
              << Num(py(s.y[k])) << "\" r=\"3\" fill=\"" << color << "\"/>";
      i = j;
    }
  }
  if (FinitePoints() == 0) NoData(out, f);
  Legend(out, f, options_, labels);
  out << "</svg>";
  return out.str();
}

Range BarChart::YRange() const {
  std::vector<double> ys;
  for (const auto& v : values_) ys.insert(ys.end(), v.begin(), v.end());
  return DataRange(ys, true);
}

size_t BarChart::DataBars() const {
  size_t n = 0;
  for (const auto& v : values_)
    for (size_t c = 0; c < std::min(v.size(), categories_.size()); ++c) n += std::isfinite(v[c]);
  return n;
}

std::string BarChart::Render() const {
  const Frame f = MakeFrame(options_, labels_.size());
  const Range yr = YRange();
  std::ostringstream out;
  OpenSvg(out, f, options_, "bar");
  YTicks(out, f, yr);
  const size_t ncat = std::max<size_t>(1, categories_.size());
  const double band = (f.x1 - f.x0) / ncat;
  const double bar = band * 0.8 / std::max<size_t>(1, labels_.size());
  // Label every category when they fit, else about 12 of them.
  const size_t label_every = std::max<size_t>(1, (categories_.size() + 11) / 12);
  for (size_t c = 0; c < categories_.size(); ++c) {
    if (c % label_every != 0) continue;
    out << "<text class=\"tick\" x=\"" << Num(f.x0 + band * (c + 0.5)) << "\" y=\"" << Num(f.y1 + 15)
        << "\" font-size=\"11\" text-anchor=\"middle\">" << XmlEscape(categories_[c]) << "</text>";
  }
  AxisLabels(out, f, options_);
  auto py = [&](double y) { return f.y1 - (y - yr.lo) / (yr.hi - yr.lo) * (f.y1 - f.y0); };
  size_t drawn = 0;
  for (size_t si = 0; si < values_.size(); ++si) {
    for (size_t c = 0; c < std::min(values_[si].size(), categories_.size()); ++c) {
      const double v = values_[si][c];
      if (!std::isfinite(v)) continue;
      const double top = py(std::max(v, 0.0)), bottom = py(std::min(v, 0.0));
      out << "<rect class=\"data\" data-series=\"" << XmlEscape(labels_[si]) << "\" x=\""
          << Num(f.x0 + band * c + band * 0.1 + bar * si) << "\" y=\"" << Num(top) << "\" width=\"" << Num(bar)
          << "\" height=\"" << Num(bottom - top) << "\" fill=\"" << SeriesColor(si) << "\"/>";
      ++drawn;
    }
  }
  if (drawn == 0) NoData(out, f);
  Legend(out, f, options_, labels_);
  out << "</svg>";
  return out.str();
}

}  // namespace echelon::obs
