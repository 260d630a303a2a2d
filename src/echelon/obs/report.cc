#include "echelon/obs/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "echelon/common/fs.h"

namespace echelon::obs {
namespace {

// Learner-update index of a step line: its version when logged, else step + 1 (the version
// the update produced).
double UpdateIndex(const StepRecord& r) { return r.version ? static_cast<double>(*r.version) : r.step + 1.0; }

// A count as a chart value: kMissing when the line did not carry it.
double Value(const std::optional<int64_t>& count) { return count ? static_cast<double>(*count) : kMissing; }

std::string Fixed(double v, int digits) {
  if (!std::isfinite(v)) return "&ndash;";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

template <typename F>
Series StepSeries(const RunData& run, F value, bool wall_x) {
  Series s{run.label, {}, {}};
  for (const StepRecord& r : run.steps) {
    s.x.push_back(wall_x ? RlSeconds(run, r.wall_s) : UpdateIndex(r));
    s.y.push_back(value(r));
  }
  return s;
}

// A step field's trailing mean over `window` updates.
template <typename F>
Series SmoothedSeries(const RunData& run, F value, size_t window, bool wall_x) {
  Series s = StepSeries(run, value, wall_x);
  s.y = TrailingMean(s.y, window);
  return s;
}

Series RewardSeries(const RunData& run, size_t window, bool wall_x) {
  return SmoothedSeries(run, [](const StepRecord& r) { return r.reward_mean; }, window, wall_x);
}

Series EssSeries(const RunData& run, size_t window) {
  return SmoothedSeries(run, [](const StepRecord& r) { return r.is_ess_frac; }, window, false);
}

// Held-out accuracy: warm-start (update 0, RL second 0), periodic evaluations, final policy
// (at the last step: the evaluation itself is measurement, not training time).
Series HeldoutSeries(const RunData& run, bool wall_x) {
  Series s{run.label, {}, {}};
  if (run.warmstart.present && std::isfinite(run.warmstart.heldout_accuracy)) {
    s.x.push_back(0);
    s.y.push_back(run.warmstart.heldout_accuracy);
  }
  for (const StepRecord& r : run.steps) {
    if (!std::isfinite(r.heldout_accuracy)) continue;
    s.x.push_back(wall_x ? RlSeconds(run, r.wall_s) : UpdateIndex(r));
    s.y.push_back(r.heldout_accuracy);
  }
  if (run.end.present && std::isfinite(run.end.heldout_accuracy)) {
    const StepRecord& last = run.steps.back();
    const double updates = std::isfinite(run.end.version) ? run.end.version : UpdateIndex(last);
    s.x.push_back(wall_x ? RlSeconds(run, last.wall_s) : updates);
    s.y.push_back(run.end.heldout_accuracy);
  }
  return s;
}

// Each evaluation set's mean@k and pass@k against the round's version, one series each.
std::vector<Series> EvalSeries(const RunData& run) {
  std::map<std::string, std::pair<Series, Series>> by_set;
  for (const EvalPoint& p : run.evals) {
    auto [it, fresh] = by_set.try_emplace(p.set);
    if (fresh) {
      const std::string k = std::isfinite(p.k) ? Fixed(p.k, 0) : "k";
      it->second.first.label = run.label + " " + p.set + " mean@" + k;
      it->second.second.label = run.label + " " + p.set + " pass@" + k;
    }
    for (Series* s : {&it->second.first, &it->second.second}) s->x.push_back(p.version);
    it->second.first.y.push_back(p.mean_at_k);
    it->second.second.y.push_back(p.pass_at_k);
  }
  std::vector<Series> out;
  for (auto& [set, pair] : by_set) {
    out.push_back(std::move(pair.first));
    out.push_back(std::move(pair.second));
  }
  return out;
}

// Mean, min and max over runs of the points at the same update, for the updates every run has.
// by_update[r]: run r's points with x = update; drawn[r]: the same points in the same order with
// the x to draw them at (RL seconds, or the update again), averaged over the runs.
Series SeedBand(std::string label, const std::vector<Series>& by_update, const std::vector<Series>& drawn) {
  std::map<double, std::vector<std::pair<double, double>>> at;  // update -> (drawn x, y) per run
  for (size_t r = 0; r < by_update.size(); ++r) {
    const Series& u = by_update[r];
    for (size_t i = 0; i < std::min({u.x.size(), u.y.size(), drawn[r].x.size()}); ++i)
      if (std::isfinite(u.y[i]) && std::isfinite(drawn[r].x[i])) at[u.x[i]].emplace_back(drawn[r].x[i], u.y[i]);
  }
  Series s{std::move(label), {}, {}};
  for (const auto& [update, points] : at) {
    if (points.size() != by_update.size()) continue;  // a run lacks this point (or has it twice)
    double x = 0, y = 0, lo = points[0].second, hi = lo;
    for (const auto& [px, py] : points) {
      x += px;
      y += py;
      lo = std::min(lo, py);
      hi = std::max(hi, py);
    }
    s.x.push_back(x / points.size());
    s.y.push_back(y / points.size());
    if (points.size() < 2) continue;  // one run: a line, no band
    s.lo.push_back(lo);
    s.hi.push_back(hi);
  }
  return s;
}

std::vector<std::string> ActorNames(const RunData& run) {
  std::set<std::string> names;
  for (const StepRecord& r : run.steps)
    for (const auto& [name, n] : r.actor_groups) names.insert(name);
  return {names.begin(), names.end()};
}

// Accepted groups per second of one actor over a trailing window of steps.
Series ActorRateSeries(const RunData& run, const std::string& actor, size_t window) {
  Series s{run.label + ": " + actor, {}, {}};
  auto count = [&](const StepRecord& r) {
    if (r.actor_groups.empty()) return kMissing;
    auto it = r.actor_groups.find(actor);
    return it == r.actor_groups.end() ? 0.0 : static_cast<double>(it->second);
  };
  for (size_t k = window; k < run.steps.size(); ++k) {
    const StepRecord &a = run.steps[k - window], &b = run.steps[k];
    const double dt = b.wall_s - a.wall_s;
    s.x.push_back(RlSeconds(run, b.wall_s));
    s.y.push_back(dt > 0 ? (count(b) - count(a)) / dt : kMissing);
  }
  return s;
}

ChartOptions Opts(std::string title, std::string x, std::string y, bool from_zero) {
  ChartOptions o;
  o.title = std::move(title);
  o.x_label = std::move(x);
  o.y_label = std::move(y);
  o.y_from_zero = from_zero;
  return o;
}

const char* kUpdates = "learner updates (policy version)";
const char* kRlSeconds = "seconds since RL start";

std::string Css() {
  return "body{font-family:sans-serif;margin:24px;color:#222;background:#fafafa}"
         "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}"
         ".charts{display:flex;flex-wrap:wrap;gap:16px}"
         ".chart-box{background:#fff;border:1px solid #ddd;padding:6px}"
         ".note{color:#555;font-size:13px;max-width:560px}"
         "table{border-collapse:collapse;font-size:13px;background:#fff}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
         "tr.diff td{background:#fff3c4}td.num{text-align:right}td.outlier{background:#ffd6d6}";
}

void ChartBox(std::ostringstream& out, const std::string& id, const std::string& svg, const std::string& note) {
  out << "<div class=\"chart-box\" id=\"" << id << "\">" << svg;
  if (!note.empty()) out << "<p class=\"note\">" << XmlEscape(note) << "</p>";
  out << "</div>";
}

void MissingBox(std::ostringstream& out, const std::string& id, const std::string& title, const std::string& note) {
  out << "<div class=\"chart-box missing\" id=\"" << id << "\"><p><b>" << XmlEscape(title) << "</b></p><p class=\"note\">"
      << XmlEscape(note) << "</p></div>";
}

std::string ConfigValue(const RunData& run, const std::string& key) {
  for (const auto& [k, v] : run.config)
    if (k == key) return v;
  return "";
}

void SummaryTable(std::ostringstream& out, const std::vector<RunData>& runs) {
  out << "<table id=\"summary\"><tr><th>run</th><th>directory</th><th>S</th><th>correction</th><th>actors</th>"
         "<th>updates</th><th>warm-start held-out</th><th>final held-out</th><th>RL seconds</th>"
         "<th>learner busy</th><th>staleness mean / max</th><th>consumed</th><th>dropped stale</th>"
         "<th>re-issued</th></tr>";
  for (const RunData& run : runs) {
    const StepRecord& last = run.steps.back();
    double smean = 0, smax = kMissing;
    size_t n = 0;
    for (const StepRecord& r : run.steps) {
      if (std::isfinite(r.staleness_mean)) smean += r.staleness_mean, ++n;
      const double m = Value(r.staleness_max);
      if (std::isfinite(m)) smax = std::isfinite(smax) ? std::max(smax, m) : m;
    }
    const double busy = std::isfinite(run.end.learner_busy_frac) ? run.end.learner_busy_frac : last.learner_busy_frac;
    out << "<tr><td>" << XmlEscape(run.label) << "</td><td>" << XmlEscape(run.dir) << "</td><td>"
        << XmlEscape(ConfigValue(run, "rl.staleness")) << "</td><td>" << XmlEscape(ConfigValue(run, "rl.correction"))
        << "</td><td>" << XmlEscape(ConfigValue(run, "rollout.actors")) << "</td><td class=\"num\">"
        << Fixed(UpdateIndex(last), 0) << "</td><td class=\"num\">" << Fixed(run.warmstart.heldout_accuracy, 3)
        << "</td><td class=\"num\">" << Fixed(run.end.heldout_accuracy, 3) << (run.end.kind == "interrupted" ? " (interrupted)" : "")
        << "</td><td class=\"num\">" << Fixed(RlSeconds(run, last.wall_s), 1) << "</td><td class=\"num\">"
        << Fixed(busy, 3) << "</td><td class=\"num\">" << Fixed(n ? smean / n : kMissing, 2) << " / " << Fixed(smax, 0)
        << "</td><td class=\"num\">" << Fixed(Value(last.groups_consumed), 0) << "</td><td class=\"num\">"
        << Fixed(Value(last.groups_dropped_stale), 0) << "</td><td class=\"num\">" << Fixed(Value(last.groups_reissued), 0)
        << "</td></tr>";
  }
  out << "</table>";
}

// Per run, each worker's statistics from the last step line that carries actor_stats
// (learn/worker_stats.h) beside its accepted and forged submissions; a statistic flagged as an
// outlier is marked. Nothing when no run carries actor_stats.
void WorkerTable(std::ostringstream& out, const std::vector<RunData>& runs) {
  static const char* const kStats[] = {"reward_mean", "zero_spread_frac", "length_mean", "gap_mean"};
  bool header = false;
  for (const RunData& run : runs) {
    const StepRecord* carrier = nullptr;
    for (const StepRecord& r : run.steps)
      if (r.actor_stats.is_object() && !r.actor_stats.empty()) carrier = &r;
    if (carrier == nullptr) continue;
    if (!header) {
      out << "<table id=\"workers\"><tr><th>run</th><th>worker</th><th>groups</th><th>accepted</th><th>forged</th>"
             "<th>reward mean</th><th>zero-spread share</th><th>length mean</th><th>log-prob gap mean</th></tr>";
      header = true;
    }
    const StepRecord& last = run.steps.back();
    for (const auto& [worker, row] : carrier->actor_stats.items()) {
      if (!row.is_object()) continue;
      auto number = [&](const char* key) {
        auto it = row.find(key);
        return it != row.end() && it->is_number() ? it->get<double>() : kMissing;
      };
      auto count = [&](const std::map<std::string, int64_t>& m) {
        auto it = m.find(worker);
        return it == m.end() ? kMissing : static_cast<double>(it->second);
      };
      std::set<std::string> flagged;
      if (auto it = row.find("outlier"); it != row.end() && it->is_array())
        for (const auto& f : *it)
          if (f.is_string()) flagged.insert(f.get<std::string>());
      out << "<tr><td>" << XmlEscape(run.label) << "</td><td>" << XmlEscape(worker) << "</td><td class=\"num\">"
          << Fixed(number("groups"), 0) << "</td><td class=\"num\">" << Fixed(count(last.actor_groups), 0)
          << "</td><td class=\"num\">" << Fixed(count(last.actor_forged), 0) << "</td>";
      for (const char* stat : kStats)
        out << "<td class=\"num" << (flagged.count(stat) ? " outlier" : "") << "\">"
            << Fixed(number(stat), stat == std::string("gap_mean") ? 4 : 3) << (flagged.count(stat) ? " (outlier)" : "")
            << "</td>";
      out << "</tr>";
    }
  }
  if (header)
    out << "</table><p class=\"note\">Per worker over the learner process's life, from the last step line that "
           "carries actor_stats; a statistic the learner found far from the fleet's median (in robust "
           "deviations) is marked as an outlier: a reason to look at the worker, not a verdict.</p>";
}

void ConfigTable(std::ostringstream& out, const std::vector<RunData>& runs) {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const RunData& run : runs)
    for (const auto& [k, v] : run.config)
      if (seen.insert(k).second) keys.push_back(k);
  for (const RunData& run : runs)
    if (!run.config_note.empty()) out << "<p class=\"note\">" << XmlEscape(run.label + ": " + run.config_note) << "</p>";
  if (keys.empty()) return;
  out << "<table id=\"config\"><tr><th>key</th>";
  for (const RunData& run : runs) out << "<th>" << XmlEscape(run.label) << "</th>";
  out << "</tr>";
  for (const std::string& key : keys) {
    std::set<std::string> values;
    for (const RunData& run : runs) values.insert(ConfigValue(run, key));
    out << "<tr" << (values.size() > 1 ? " class=\"diff\"" : "") << "><td>" << XmlEscape(key) << "</td>";
    for (const RunData& run : runs) out << "<td>" << XmlEscape(ConfigValue(run, key)) << "</td>";
    out << "</tr>";
  }
  out << "</table>";
  if (runs.size() > 1) out << "<p class=\"note\">Highlighted rows differ between runs.</p>";
}

}  // namespace

std::vector<double> TrailingMean(const std::vector<double>& v, size_t window) {
  window = std::max<size_t>(1, window);
  std::vector<double> out(v.size(), kMissing);
  double sum = 0;
  size_t finite = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) sum += v[i], ++finite;
    if (i >= window && std::isfinite(v[i - window])) sum -= v[i - window], --finite;
    if (finite > 0) out[i] = sum / finite;
  }
  return out;
}

size_t RewardWindow(const std::vector<RunData>& runs) {
  size_t longest = 0;
  for (const RunData& run : runs) longest = std::max(longest, run.steps.size());
  return std::max<size_t>(1, longest / 50);
}

double RlSeconds(const RunData& run, double wall_s) {
  const double start = run.warmstart.present && std::isfinite(run.warmstart.wall_s) ? run.warmstart.wall_s : 0.0;
  return wall_s - start;
}

StalenessHistogram BuildStalenessHistogram(const std::vector<RunData>& runs) {
  StalenessHistogram h;
  for (const RunData& run : runs)
    for (const StepRecord& r : run.steps)
      if (r.staleness_hist.empty()) h.exact = false;
  std::vector<std::map<int64_t, double>> counts(runs.size());
  int64_t max_s = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    for (const StepRecord& r : runs[i].steps) {
      if (h.exact) {
        for (const auto& [s, n] : r.staleness_hist) counts[i][s] += n;
      } else if (std::isfinite(r.staleness_mean)) {
        counts[i][std::llround(r.staleness_mean)] += 1;
      }
    }
    if (!counts[i].empty()) max_s = std::max(max_s, counts[i].rbegin()->first);
  }
  for (int64_t s = 0; s <= max_s; ++s) h.categories.push_back(std::to_string(s));
  for (const auto& c : counts) {
    double total = 0;
    for (const auto& [s, n] : c) total += n;
    std::vector<double> f(h.categories.size(), total > 0 ? 0.0 : kMissing);
    for (const auto& [s, n] : c)
      if (s >= 0) f[s] = n / total;
    h.fractions.push_back(std::move(f));
  }
  return h;
}

std::vector<SeedGroup> GroupBySeed(const std::vector<RunData>& runs) {
  std::vector<SeedGroup> groups;
  std::vector<std::map<std::string, std::string>> keys;  // each group's config without "seed"
  for (const RunData& run : runs) {
    std::map<std::string, std::string> key;
    for (const auto& [k, v] : run.config)
      if (k != "seed") key[k] = v;
    if (run.config.empty()) key["(run directory)"] = run.dir;  // no config: a group of its own
    size_t g = 0;
    while (g < keys.size() && keys[g] != key) ++g;
    if (g == keys.size()) {
      keys.push_back(key);
      groups.push_back({});
    }
    groups[g].runs.push_back(&run);
  }
  // Label: the keys whose values differ between groups (last path component), else "all runs".
  for (size_t g = 0; g < groups.size(); ++g) {
    std::string label;
    for (const auto& [k, v] : keys[g]) {
      bool differs = false;
      for (const auto& other : keys) {
        auto it = other.find(k);
        differs |= it == other.end() || it->second != v;
      }
      if (differs && k != "(run directory)") label += (label.empty() ? "" : ", ") + k.substr(k.rfind('.') + 1) + "=" + v;
    }
    if (label.empty()) label = keys[g].count("(run directory)") ? groups[g].runs[0]->label : "all runs";
    const size_t n = groups[g].runs.size();
    groups[g].label = label + " (" + std::to_string(n) + (n == 1 ? " run)" : " seeds)");
  }
  return groups;
}

std::vector<NamedLineChart> BuildLineCharts(const std::vector<RunData>& runs) {
  const size_t w = RewardWindow(runs);
  const std::string smooth = w > 1 ? " (trailing mean of " + std::to_string(w) + " steps)" : "";
  std::vector<NamedLineChart> charts;
  charts.reserve(16);  // add() hands out pointers into the vector
  auto add = [&](std::string id, ChartOptions o, std::string missing) {
    charts.push_back({std::move(id), LineChart(std::move(o)), std::move(missing)});
    return &charts.back().chart;
  };
  LineChart* c = add("reward-step", Opts("Reward against learner updates" + smooth, kUpdates, "reward", false),
                     "No step line carries reward_mean.");
  for (const RunData& r : runs) c->AddSeries(RewardSeries(r, w, false));
  c = add("reward-wall", Opts("Reward against wall time" + smooth, kRlSeconds, "reward", false),
          "No step line carries reward_mean.");
  for (const RunData& r : runs) c->AddSeries(RewardSeries(r, w, true));
  c = add("heldout-step", Opts("Held-out accuracy against learner updates", kUpdates, "held-out greedy accuracy", true),
          "No held-out evaluation in these metrics (warm-start, eval.every or final).");
  for (const RunData& r : runs) c->AddSeries(HeldoutSeries(r, false));
  c = add("heldout-wall", Opts("Held-out accuracy against wall time", kRlSeconds, "held-out greedy accuracy", true),
          "No held-out evaluation in these metrics (warm-start, eval.every or final).");
  for (const RunData& r : runs) c->AddSeries(HeldoutSeries(r, true));
  c = add("eval-sets", Opts("Evaluation sets on the actors (eval.sets): mean@k and pass@k", kUpdates,
                            "share of prompts", true),
          "No evaluation set in these metrics (eval.sets).");
  for (const RunData& r : runs)
    for (Series& s : EvalSeries(r)) c->AddSeries(std::move(s));
  const std::string smooth_ess = w > 1 ? " (trailing mean of " + std::to_string(w) + " updates)" : "";
  c = add("ess-step", Opts("Importance-weight ESS fraction against learner updates" + smooth_ess, kUpdates,
                           "ESS / batch tokens", true),
          "No step line carries is_ess_frac (the staleness health of the importance weights).");
  for (const RunData& r : runs) c->AddSeries(EssSeries(r, w));
  // Seeds as bands: only when some setting was run with several seeds.
  const std::vector<SeedGroup> groups = GroupBySeed(runs);
  if (std::any_of(groups.begin(), groups.end(), [](const SeedGroup& g) { return g.runs.size() > 1; })) {
    c = add("heldout-wall-seeds",
            Opts("Held-out accuracy against wall time: mean over seeds, band min .. max", kRlSeconds,
                 "held-out greedy accuracy", true),
            "No held-out evaluation at the same updates in every run of a setting.");
    LineChart* e = add("ess-seeds", Opts("ESS fraction against updates: mean over seeds, band min .. max" + smooth_ess,
                                         kUpdates, "ESS / batch tokens", true),
                       "No step line carries is_ess_frac.");
    for (const SeedGroup& g : groups) {
      std::vector<Series> held, held_wall, ess_runs;
      for (const RunData* r : g.runs) {
        held.push_back(HeldoutSeries(*r, false));
        held_wall.push_back(HeldoutSeries(*r, true));
        ess_runs.push_back(EssSeries(*r, w));
      }
      c->AddSeries(SeedBand(g.label, held, held_wall));
      e->AddSeries(SeedBand(g.label, ess_runs, ess_runs));
    }
  }
  c = add("busy", Opts("Learner busy fraction (cumulative since RL start)", kRlSeconds, "busy fraction", true),
          "No step line carries learner_busy_frac.");
  for (const RunData& r : runs)
    c->AddSeries(StepSeries(r, [](const StepRecord& s) { return s.learner_busy_frac; }, true));
  c = add("dropped", Opts("Groups dropped as stale (cumulative)", kRlSeconds, "groups", true),
          "No step line carries groups_dropped_stale.");
  for (const RunData& r : runs)
    c->AddSeries(StepSeries(r, [](const StepRecord& s) { return Value(s.groups_dropped_stale); }, true));
  c = add("reissued", Opts("Groups re-issued after a lease expired (cumulative)", kRlSeconds, "groups", true),
          "No step line carries groups_reissued.");
  for (const RunData& r : runs)
    c->AddSeries(StepSeries(r, [](const StepRecord& s) { return Value(s.groups_reissued); }, true));
  c = add("wasted", Opts("Completion tokens wasted (cumulative share: stale, preempted, refused)", kRlSeconds,
                          "share of generated tokens", true),
          "No step line carries tokens_by_fate.");
  for (const RunData& r : runs)
    c->AddSeries(StepSeries(r, [](const StepRecord& s) { return WastedTokenShare(s.tokens_by_fate); }, true));
  c = add("actor-rate",
          Opts("Per-actor throughput (accepted groups/s over " + std::to_string(w) + (w == 1 ? " step)" : " steps)"),
               kRlSeconds,
               "groups per second", true),
          "No step line carries actor_groups (per-actor accepted groups); older runs do not log it.");
  for (const RunData& r : runs)
    for (const std::string& a : ActorNames(r)) c->AddSeries(ActorRateSeries(r, a, w));
  c = add("broadcast", Opts("Snapshot broadcast time", kUpdates, "seconds", true),
          "No snapshot broadcast times in these metrics (no broadcast_s field): in-process and "
          "single-host runs hand snapshots over without a timed broadcast.");
  for (const RunData& r : runs) c->AddSeries(StepSeries(r, [](const StepRecord& s) { return s.broadcast_s; }, false));
  return charts;
}

std::string RenderReport(const std::vector<RunData>& runs) {
  std::ostringstream out;
  out << "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>echelon report</title><style>" << Css()
      << "</style></head><body><h1>echelon run report</h1><p class=\"note\">" << runs.size() << " run"
      << (runs.size() == 1 ? "" : "s") << ": ";
  for (size_t i = 0; i < runs.size(); ++i) out << (i ? ", " : "") << XmlEscape(runs[i].label);
  out << "</p><h2>Summary</h2>";
  SummaryTable(out, runs);

  std::vector<NamedLineChart> charts = BuildLineCharts(runs);
  auto emit = [&](const std::string& id) {
    for (const NamedLineChart& c : charts) {
      if (c.id != id) continue;
      if (c.chart.FinitePoints() == 0)
        MissingBox(out, c.id, c.chart.options().title, c.missing_note);
      else
        ChartBox(out, c.id, c.chart.Render(), "");
    }
  };
  out << "<h2>Reward and held-out accuracy</h2><div class=\"charts\">";
  for (const char* id : {"reward-step", "reward-wall", "heldout-step", "heldout-wall", "heldout-wall-seeds"}) emit(id);
  if (std::any_of(runs.begin(), runs.end(), [](const RunData& r) { return !r.evals.empty(); })) emit("eval-sets");
  out << "</div><h2>Learner utilisation and staleness</h2><div class=\"charts\">";
  emit("busy");
  emit("ess-step");
  emit("ess-seeds");
  StalenessHistogram h = BuildStalenessHistogram(runs);
  BarChart bars(Opts(h.exact ? "Consumed staleness (share of consumed groups)" : "Staleness per step (share of steps)",
                     "staleness (learner version - behaviour version)", "share", true),
                h.categories);
  for (size_t i = 0; i < runs.size(); ++i) bars.AddSeries(runs[i].label, h.fractions[i]);
  if (bars.DataBars() == 0)
    MissingBox(out, "staleness-hist", bars.options().title, "No step line carries staleness_mean or staleness_hist.");
  else
    ChartBox(out, "staleness-hist", bars.Render(),
             h.exact ? "" : "These metrics carry no per-group staleness_hist; each step counts once, at its mean "
                            "staleness rounded to an integer.");
  emit("dropped");
  emit("reissued");
  emit("wasted");
  out << "</div><h2>Rollout workers</h2><div class=\"charts\">";
  emit("actor-rate");
  // Average throughput per actor over the whole RL phase.
  std::vector<std::string> actors;
  std::set<std::string> seen;
  for (const RunData& r : runs)
    for (const std::string& a : ActorNames(r))
      if (seen.insert(a).second) actors.push_back(a);
  if (!actors.empty()) {
    BarChart mean(Opts("Per-actor throughput, whole run (accepted groups/s)", "actor", "groups per second", true), actors);
    for (const RunData& r : runs) {
      const StepRecord& last = r.steps.back();
      const double secs = RlSeconds(r, last.wall_s);
      std::vector<double> v;
      for (const std::string& a : actors) {
        auto it = last.actor_groups.find(a);
        v.push_back(it != last.actor_groups.end() && secs > 0 ? it->second / secs : kMissing);
      }
      mean.AddSeries(r.label, v);
    }
    if (mean.DataBars() > 0) ChartBox(out, "actor-mean", mean.Render(), "");
  }
  emit("broadcast");
  out << "</div>";
  WorkerTable(out, runs);
  out << "<h2>Configuration</h2>";
  ConfigTable(out, runs);
  out << "</body></html>\n";
  return out.str();
}

Status WriteReport(const std::vector<RunData>& runs, const std::string& out_path) {
  if (runs.empty()) return InvalidArgument("report: no run directories given");
  return WriteFileAtomic(out_path, RenderReport(runs)).WithContext("writing report " + out_path);
}

}  // namespace echelon::obs
