#include "echelon/plan/layer_split.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace echelon::plan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// (primary, secondary) of a prefix of the pipeline, compared lexicographically, equal within
// summation noise (moving a layer between stages of equal speed changes a sum by ulps).
using Value = std::pair<double, double>;
bool Same(double a, double b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::abs(a - b) <= 1e-12 * std::max(1.0, std::max(std::abs(a), std::abs(b)));
}
bool Better(const Value& a, const Value& b) {
  return Same(a.first, b.first) ? a.second < b.second && !Same(a.second, b.second) : a.first < b.first;
}

// Over (stages used, layers placed): kMinMax minimises the slowest stage; kMinSum minimises the
// summed time (then the slowest stage) over stages no slower than `cap`. Returns the layers
// per stage of the best whole split, or an empty vector when none exists.
enum class Program { kMinMax, kMinSum };

std::vector<int64_t> Solve(const LayerSplitInput& in, Program program, double cap) {
  const size_t k = in.stages.size();
  const int64_t total = in.layers;
  std::vector<std::vector<Value>> best(k + 1, std::vector<Value>(static_cast<size_t>(total) + 1, {kInf, kInf}));
  std::vector<std::vector<int64_t>> choice(k + 1, std::vector<int64_t>(static_cast<size_t>(total) + 1, 0));
  best[0][0] = {0, 0};
  for (size_t i = 1; i <= k; ++i) {
    // Stage i - 1 takes n layers after the first l - n; each later stage needs at least one.
    const int64_t later = static_cast<int64_t>(k - i);
    for (int64_t l = static_cast<int64_t>(i); l <= total - later; ++l) {
      for (int64_t n = 1; n <= l - static_cast<int64_t>(i - 1); ++n) {
        const Value& prev = best[i - 1][static_cast<size_t>(l - n)];
        if (prev.first == kInf || StageBytes(in, i - 1, n) > in.stages[i - 1].memory_bytes) continue;
        const double t = StageSeconds(in, i - 1, n);
        Value v;
        if (program == Program::kMinMax) {
          v = {std::max(prev.first, t), 0};
        } else {
          if (t > cap) continue;
          v = {prev.first + t, std::max(prev.second, t)};
        }
        if (Better(v, best[i][static_cast<size_t>(l)])) {
          best[i][static_cast<size_t>(l)] = v;
          choice[i][static_cast<size_t>(l)] = n;
        }
      }
    }
  }
  if (best[k][static_cast<size_t>(total)].first == kInf) return {};
  std::vector<int64_t> layers(k);
  for (size_t i = k, l = static_cast<size_t>(total); i > 0; --i) {
    layers[i - 1] = choice[i][l];
    l -= static_cast<size_t>(choice[i][l]);
  }
  return layers;
}

bool NonNegative(double v) { return std::isfinite(v) && v >= 0; }

std::string Gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", bytes / 1e9);
  return text;
}

}  // namespace

double StageSeconds(const LayerSplitInput& in, size_t i, int64_t n) {
  const bool first = i == 0, last = i + 1 == in.stages.size();
  return static_cast<double>(n) * in.stages[i].seconds_per_layer + (first ? in.first_seconds : 0) +
         (last ? in.last_seconds : in.link_seconds);
}

double StageBytes(const LayerSplitInput& in, size_t i, int64_t n) {
  const bool first = i == 0, last = i + 1 == in.stages.size();
  return static_cast<double>(n) * in.layer_bytes + (first ? in.first_bytes : 0) + (last ? in.last_bytes : 0);
}

Result<LayerSplit> SplitLayers(const LayerSplitInput& in, SplitObjective objective) {
  if (in.stages.empty()) return InvalidArgument("layer split: no stages");
  if (in.layers < static_cast<int64_t>(in.stages.size()))
    return InvalidArgument("layer split: " + std::to_string(in.layers) + " layers cannot give each of " +
                           std::to_string(in.stages.size()) + " stages one");
  for (double v : {in.layer_bytes, in.first_bytes, in.last_bytes, in.first_seconds, in.last_seconds, in.link_seconds}) {
    if (!NonNegative(v)) return InvalidArgument("layer split: sizes and times must be finite and >= 0");
  }
  for (const PipelineStage& s : in.stages) {
    if (!NonNegative(s.memory_bytes) || !NonNegative(s.seconds_per_layer))
      return InvalidArgument("layer split: stage '" + s.name + "' needs a finite memory and seconds per layer >= 0");
  }
  std::vector<int64_t> layers;
  if (objective == SplitObjective::kLatency) {
    layers = Solve(in, Program::kMinSum, kInf);
  } else if (std::vector<int64_t> fastest = Solve(in, Program::kMinMax, kInf); !fastest.empty()) {
    double bottleneck = 0;
    for (size_t i = 0; i < fastest.size(); ++i) bottleneck = std::max(bottleneck, StageSeconds(in, i, fastest[i]));
    // Among the splits as fast as the best, the smallest latency (a hair of slack for the sums).
    layers = Solve(in, Program::kMinSum, bottleneck * (1 + 1e-12));
    if (layers.empty()) layers = fastest;
  }
  if (layers.empty()) {
    double memory = 0;
    for (const PipelineStage& s : in.stages) memory += s.memory_bytes;
    const double need = static_cast<double>(in.layers) * in.layer_bytes + in.first_bytes + in.last_bytes;
    return FailedPrecondition("layer split: no split of " + std::to_string(in.layers) + " layers fits the " +
                              std::to_string(in.stages.size()) + " stages' memory (" + Gb(need) +
                              " GB needed, " + Gb(memory) +
                              " GB in all, and every stage must hold whole layers)");
  }
  LayerSplit split;
  split.layers = layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const double t = StageSeconds(in, i, layers[i]);
    split.bottleneck_seconds = std::max(split.bottleneck_seconds, t);
    split.latency_seconds += t;
  }
  return split;
}

}  // namespace echelon::plan
