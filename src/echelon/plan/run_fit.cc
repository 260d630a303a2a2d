#include "echelon/plan/run_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "echelon/obs/metrics_log.h"
#include "echelon/obs/step_record.h"
#include "echelon/plan/planner.h"
#include "echelon/plan/simulator.h"

namespace echelon::plan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// One learner update line of metrics.jsonl.
struct UpdateLine {
  int64_t line_no = 0;
  int64_t step = 0;
  double wall_s = 0, step_s = 0, busy_frac = 0, tokens_per_s = 0;
  int64_t in_flight = 0;
  int64_t staleness_bound = -1;  // S in force (-1: the line has none)
  std::map<std::string, int64_t> actor_groups;
  std::map<std::string, int64_t> tokens_by_fate;
  int64_t dropped_stale = 0;
  std::map<std::string, double> group_seconds;  // actor_group_seconds
  int64_t start = 0;  // process start (0, then one more per resume event)
};

struct ParsedMetrics {
  std::vector<UpdateLine> updates;
  int64_t starts = 1;
  double end_busy = -1;
  std::string end_event;
};

// A learner update line: the StepRecord fields the fit needs must be there.
Status ParseUpdate(const json& o, const std::string& where, UpdateLine* u) {
  ECHELON_ASSIGN_OR_RETURN(const obs::StepRecord r, obs::StepRecord::FromJson(o, where));
  const std::pair<const char*, double> numbers[] = {
      {"step_s", r.step_s}, {"learner_busy_frac", r.learner_busy_frac}, {"tokens_per_s", r.tokens_per_s}};
  for (const auto& [key, v] : numbers)
    if (std::isnan(v)) return InvalidArgument(where + ": a learner update line needs a number '" + key + "'");
  if (!r.groups_in_flight)
    return InvalidArgument(where + ": a learner update line needs a non-negative integer 'groups_in_flight'");
  if (!o.contains("actor_groups"))
    return InvalidArgument(where + ": a learner update line needs an object 'actor_groups' (accepted groups per actor)");
  if (r.step < 0) return InvalidArgument(where + ": step " + std::to_string(r.step) + " is negative");
  if (!std::isfinite(r.wall_s) || !std::isfinite(r.step_s)) return InvalidArgument(where + ": wall_s or step_s is not finite");
  if (r.step_s < 0) return InvalidArgument(where + ": step_s = " + Fmt("%g", r.step_s) + " is negative");
  if (!(r.learner_busy_frac >= 0 && r.learner_busy_frac <= 1 + 1e-6))
    return InvalidArgument(where + ": learner_busy_frac = " + Fmt("%g", r.learner_busy_frac) + " is outside [0, 1]");
  if (!(r.tokens_per_s >= 0)) return InvalidArgument(where + ": tokens_per_s is negative");
  u->step = r.step;
  u->wall_s = r.wall_s;
  u->step_s = r.step_s;
  u->busy_frac = r.learner_busy_frac;
  u->tokens_per_s = r.tokens_per_s;
  u->in_flight = *r.groups_in_flight;
  u->staleness_bound = r.staleness_bound.value_or(-1);
  u->actor_groups = r.actor_groups;
  u->tokens_by_fate = r.tokens_by_fate;
  u->dropped_stale = r.groups_dropped_stale.value_or(0);
  u->group_seconds = r.actor_group_seconds;
  return Status::Ok();
}

Result<ParsedMetrics> ParseMetricsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open (a run directory written by `echelon train` has metrics.jsonl)");
  ParsedMetrics m;
  auto visit = [&](const json& o, const std::string& where, int64_t line_no) -> Status {
    auto ev = o.find("event");
    if (ev != o.end()) {
      const std::string kind = ev->get<std::string>();
      if (kind == "resume") ++m.starts;
      if (kind == "final" || kind == "interrupted") {
        auto b = o.find("learner_busy_frac");
        if (b == o.end() || !b->is_number())
          return InvalidArgument(where + ": the " + kind + " event needs a number 'learner_busy_frac'");
        m.end_busy = b->get<double>();
        m.end_event = kind;
      }
      return Status::Ok();
    }
    UpdateLine u;
    u.line_no = line_no;
    u.start = m.starts - 1;
    ECHELON_RETURN_IF_ERROR(ParseUpdate(o, where, &u));
    if (!m.updates.empty()) {
      const UpdateLine& prev = m.updates.back();
      if (u.step != prev.step + 1)
        return InvalidArgument(where + ": update step " + std::to_string(u.step) + " follows step " +
                               std::to_string(prev.step) + " (line " + std::to_string(prev.line_no) +
                               "); lines are missing or out of order");
      if (u.start == prev.start && u.wall_s < prev.wall_s)
        return InvalidArgument(where + ": wall_s " + Fmt("%g", u.wall_s) + " is earlier than line " +
                               std::to_string(prev.line_no) + "'s " + Fmt("%g", prev.wall_s));
    }
    m.updates.push_back(std::move(u));
    return Status::Ok();
  };
  ECHELON_ASSIGN_OR_RETURN(const int64_t line_no, obs::ReadMetricsLines(in, path, visit));
  if (m.updates.empty())
    return InvalidArgument(path + (line_no == 0 ? ": empty" : ": no learner update lines") +
                           "; the run stopped before its first update");
  return m;
}

}  // namespace

Result<std::string> RunConfigPath(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return NotFound(dir + ": no such run directory (expected one written by `echelon train` or `echelon learner`)");
  const std::string config_path = (fs::path(dir) / "config.yaml").string();
  if (!fs::exists(config_path, ec))
    return NotFound(config_path + ": missing (a run directory written by `echelon train` has config.yaml)");
  return config_path;
}

Result<RunFit> FitRun(const std::string& dir, const RunShape& cfg) {
  ECHELON_RETURN_IF_ERROR(RunConfigPath(dir).status());
  if (cfg.groups_per_step < 1 || cfg.group_size < 1 || cfg.staleness < 0 || cfg.publish_period < 1)
    return InvalidArgument(dir + ": a run shape needs B >= 1, G >= 1, S >= 0 and kappa >= 1 (got B = " +
                           std::to_string(cfg.groups_per_step) + ", G = " + std::to_string(cfg.group_size) +
                           ", S = " + std::to_string(cfg.staleness) + ", kappa = " + std::to_string(cfg.publish_period) +
                           ")");
  const std::string metrics_path = (fs::path(dir) / "metrics.jsonl").string();
  ECHELON_ASSIGN_OR_RETURN(ParsedMetrics m, ParseMetricsFile(metrics_path));

  RunFit f;
  f.dir = dir;
  f.groups_per_step = cfg.groups_per_step;
  f.group_size = cfg.group_size;
  f.max_staleness = cfg.staleness;
  // A run that chose S itself is fitted at the S it ended with.
  if (cfg.staleness_auto) {
    if (m.updates.back().staleness_bound < 0)
      return InvalidArgument(metrics_path + ":" + std::to_string(m.updates.back().line_no) +
                             ": rl.staleness is auto, and the last update line has no staleness_bound");
    f.max_staleness = m.updates.back().staleness_bound;
  }
  f.publish_period = cfg.publish_period;
  f.process_starts = m.starts;
  f.end_event = m.end_event;
  f.measured_utilization_end = m.end_busy;
  const std::vector<UpdateLine>& u = m.updates;
  const size_t n = u.size();
  f.updates = static_cast<int64_t>(n);

  // RL wall time, busy seconds and cycle of every update line.
  std::vector<double> rl(n), busy(n), cycle(n), train(n);
  std::vector<bool> first(n);
  double base = 0, origin = 0;
  for (size_t k = 0; k < n; ++k) {
    first[k] = k == 0 || u[k].start != u[k - 1].start;
    if (first[k]) {
      base = k == 0 ? 0.0 : rl[k - 1];
      origin = u[k].wall_s - u[k].step_s;
    }
    rl[k] = base + u[k].wall_s - origin;
    busy[k] = u[k].busy_frac * rl[k];
    train[k] = std::max(0.0, busy[k] - (k > 0 ? busy[k - 1] : 0.0));
    cycle[k] = first[k] ? u[k].step_s : u[k].wall_s - u[k - 1].wall_s;
  }
  f.rl_seconds = rl[n - 1];
  f.busy_seconds = busy[n - 1];
  f.train_seconds = f.busy_seconds / static_cast<double>(n);
  f.measured_utilization = u[n - 1].busy_frac;
  f.tokens_by_fate = u[n - 1].tokens_by_fate;
  f.groups_dropped_stale = u[n - 1].dropped_stale;

  // Measured updates: all but the first of each process start.
  int64_t measured = 0, window_full = 0;
  double overhead = 0;
  std::map<std::string, ActorFit> actors;
  for (size_t k = 0; k < n; ++k) {
    if (first[k]) continue;
    ++measured;
    overhead += std::max(0.0, cycle[k] - u[k].step_s);
    if (f.max_staleness > 0 && u[k].in_flight >= f.max_staleness * f.groups_per_step) ++window_full;
    const double open = f.max_staleness > 0 ? cycle[k] : std::max(0.0, cycle[k] - train[k]);
    for (const auto& [name, groups] : u[k].actor_groups) {
      auto before = u[k - 1].actor_groups.find(name);
      ActorFit& a = actors[name];
      a.name = name;
      a.groups += std::max<int64_t>(0, groups - (before == u[k - 1].actor_groups.end() ? 0 : before->second));
      a.seconds += open;
    }
  }
  if (measured == 0)
    return InvalidArgument(metrics_path + ": " + std::to_string(n) +
                           " learner update(s), each the first of a process start; at least two consecutive updates "
                           "are needed to measure rates");
  f.overhead_seconds = overhead / measured;
  f.window_full_fraction = f.max_staleness > 0 ? static_cast<double>(window_full) / measured : 0.0;
  f.learner_bound = f.window_full_fraction > 0.5;

  int64_t accepted = 0;
  for (const auto& [name, groups] : u[n - 1].actor_groups) accepted += groups;
  if (accepted == 0) return InvalidArgument(metrics_path + ": no actor delivered a group (actor_groups is empty)");
  f.completion_tokens = u[n - 1].tokens_per_s * f.rl_seconds / (static_cast<double>(accepted) * f.group_size);
  if (!(f.completion_tokens > 0))
    return InvalidArgument(metrics_path + ":" + std::to_string(u[n - 1].line_no) +
                           ": tokens_per_s is 0; generated tokens per rollout cannot be measured");

  int64_t delivered = 0;
  for (auto& [name, a] : actors) {
    if (a.seconds > 0) a.groups_per_s = a.groups / a.seconds;
    a.tokens_per_s = a.groups_per_s * f.group_size * f.completion_tokens;
    a.group_seconds = a.groups_per_s > 0 ? 1 / a.groups_per_s : INFINITY;
    if (auto held = u[n - 1].group_seconds.find(name); held != u[n - 1].group_seconds.end() && held->second > 0)
      a.held_seconds = held->second;
    delivered += a.groups;
    f.actors.push_back(a);
  }
  if (delivered == 0)
    return InvalidArgument(metrics_path + ": no actor delivered a group after the first update of a process start; "
                           "rollout throughput cannot be measured");

  // The model, as the run ran: one class per actor.
  CapacityInputs& in = f.inputs;
  in.shape = RolloutShape{f.group_size, 0, f.completion_tokens};
  in.groups_per_step = f.groups_per_step;
  in.train_seconds = f.train_seconds;
  in.overhead_seconds = f.overhead_seconds;
  in.max_staleness = f.max_staleness;
  in.publish_period = f.publish_period;
  in.snapshot_bytes = 0;
  for (const ActorFit& a : f.actors) {
    if (a.groups_per_s <= 0) continue;
    WorkerClass c;
    c.name = a.name;
    c.gpu = "measured";
    c.available = c.count = 1;
    c.decode = MeasuredDecode(a.tokens_per_s, 1, in.shape);
    f.classes.push_back(c);
  }
  f.steady = PredictCapacity(in, f.classes);
  for (size_t k = 0; k < n; ++k)
    if (first[k]) f.startup_seconds += std::max(0.0, cycle[k] - f.steady.step_seconds);
  f.predicted_utilization =
      static_cast<double>(n) * f.train_seconds / (f.startup_seconds + static_cast<double>(n) * f.steady.step_seconds);
  return f;
}

Result<json> SimulateRun(const RunFit& fit, const RunSimOptions& options) {
  Plan p;
  p.inputs = fit.inputs;
  p.inputs.link.mode = BroadcastMode::kStar;  // no bytes: every snapshot arrives at once
  p.classes = fit.classes;
  if (p.classes.empty()) return InvalidArgument(fit.dir + ": no actor delivered a group; nothing to simulate");
  PlanConfig& c = p.config;
  c.steps = fit.updates;
  c.groups_per_step = fit.groups_per_step;
  c.shape = p.inputs.shape;
  c.link = p.inputs.link;
  c.sim.seed = options.seed;
  c.sim.throughput_cv = options.throughput_cv;
  c.sim.workers = static_cast<int64_t>(p.classes.size());
  c.sim.reactivate = false;
  c.sim.warmup_steps = 0;
  c.sim.dispatch = options.dispatch;
  c.sim.resume = options.resume;
  ECHELON_ASSIGN_OR_RETURN(SimResult r, Simulate(p, SimOptions()));
  const auto share = [&](double tokens) { return r.tokens_generated > 0 ? tokens / r.tokens_generated : 0.0; };
  return json{{"seed", options.seed},
              {"throughput_cv", options.throughput_cv},
              {"dispatch", options.dispatch},
              {"utilization", r.utilization},
              {"tokens_generated", r.tokens_generated},
              {"tokens_consumed", r.tokens_consumed},
              {"wasted_fraction", r.wasted_fraction()},
              {"stale_fraction", share(r.tokens_stale)},
              {"preempted_fraction", share(r.tokens_preempted)},
              {"groups_dropped_stale", r.counts.dropped_stale},
              {"groups_consumed", r.counts.consumed}};
}

double RunFit::wasted_fraction() const {
  const double share = obs::WastedTokenShare(tokens_by_fate);
  return std::isnan(share) ? -1 : share;
}

json RunFitJson(const RunFit& f) {
  json actors = json::array();
  for (const ActorFit& a : f.actors)
    actors.push_back({{"name", a.name}, {"groups", a.groups}, {"seconds", a.seconds}, {"groups_per_s", a.groups_per_s},
                      {"tokens_per_s", a.tokens_per_s},
                      {"group_seconds", std::isfinite(a.group_seconds) ? json(a.group_seconds) : json(nullptr)},
                      {"held_seconds", a.held_seconds}});
  return {{"run_dir", f.dir},
          {"updates", f.updates},
          {"process_starts", f.process_starts},
          {"groups_per_step", f.groups_per_step},
          {"group_size", f.group_size},
          {"completion_tokens", f.completion_tokens},
          {"max_staleness", f.max_staleness},
          {"publish_period", f.publish_period},
          {"rl_seconds", f.rl_seconds},
          {"busy_seconds", f.busy_seconds},
          {"train_seconds", f.train_seconds},
          {"overhead_seconds", f.overhead_seconds},
          {"startup_seconds", f.startup_seconds},
          {"window_full_fraction", f.window_full_fraction},
          {"learner_bound", f.learner_bound},
          {"actors", actors},
          {"supply_groups_per_s", f.steady.supply_groups_per_s},
          {"predicted_step_seconds", f.steady.step_seconds},
          {"predicted_steady_utilization", f.steady.utilization},
          {"predicted_utilization", f.predicted_utilization},
          {"measured_utilization", f.measured_utilization},
          {"measured_utilization_end", f.measured_utilization_end >= 0 ? json(f.measured_utilization_end) : json(nullptr)},
          {"end_event", f.end_event},
          {"tokens_by_fate", f.tokens_by_fate},
          {"wasted_fraction", f.wasted_fraction() >= 0 ? json(f.wasted_fraction()) : json(nullptr)},
          {"relative_error", f.relative_error()}};
}

std::string RunFitTable(const RunFit& f) {
  std::ostringstream o;
  char line[256];
  o << "run " << f.dir << ": " << f.updates << " updates (" << f.process_starts << " process start"
    << (f.process_starts == 1 ? "" : "s") << "), B = " << f.groups_per_step << " groups x G = " << f.group_size
    << ", S = " << f.max_staleness << ", kappa = " << f.publish_period << ", " << Fmt("%.1f", f.completion_tokens)
    << " generated tokens per rollout\n";
  o << "learner: " << Fmt("%.3f", f.train_seconds) << " s training per update (" << Fmt("%.1f", f.busy_seconds)
    << " s busy of " << Fmt("%.1f", f.rl_seconds) << " s), " << Fmt("%.3f", f.overhead_seconds)
    << " s between updates, start-up " << Fmt("%.2f", f.startup_seconds) << " s\n";
  std::snprintf(line, sizeof line, "%-20s %8s %10s %10s %10s\n", "actor", "groups", "groups/s", "tokens/s", "s/group");
  o << line;
  for (const ActorFit& a : f.actors) {
    std::snprintf(line, sizeof line, "%-20s %8lld %10.2f %10.0f %10.4f\n", a.name.c_str(),
                  static_cast<long long>(a.groups), a.groups_per_s, a.tokens_per_s, a.group_seconds);
    o << line;
  }
  if (f.learner_bound)
    o << "the admission window was full after " << Fmt("%.0f", 100 * f.window_full_fraction)
      << "% of updates: the actors outpaced the learner, so their rates are its consumption rate (a lower bound of "
         "what they can generate)\n";
  std::snprintf(line, sizeof line, "%-32s %10s %10s\n", "", "predicted", "measured");
  o << line;
  std::snprintf(line, sizeof line, "%-32s %10.3f %10.3f   (%+.1f%%)\n", "learner utilisation (run)",
                f.predicted_utilization, f.measured_utilization, 100 * f.relative_error());
  o << line;
  std::snprintf(line, sizeof line, "%-32s %10.3f\n", "learner utilisation (steady)", f.steady.utilization);
  o << line;
  std::snprintf(line, sizeof line, "%-32s %10.3f\n", "step seconds (steady)", f.steady.step_seconds);
  o << line;
  if (f.measured_utilization_end >= 0)
    o << "the " << f.end_event << " event's busy fraction, closing evaluation included: "
      << Fmt("%.3f", f.measured_utilization_end) << "\n";
  if (f.wasted_fraction() >= 0) {
    auto n = [&](const char* fate) {
      auto it = f.tokens_by_fate.find(fate);
      return it == f.tokens_by_fate.end() ? int64_t{0} : it->second;
    };
    o << "completion tokens: " << n("consumed") << " consumed, " << Fmt("%.1f", 100 * f.wasted_fraction())
      << "% wasted (" << n("stale") << " stale, " << n("preempted") << " preempted, " << n("refused")
      << " refused), " << n("filtered") << " filtered\n";
  }
  return o.str();
}

Status ApplyRunFit(const RunFit& fit, PlanConfig* c, std::vector<std::string>* notes) {
  std::map<std::string, const ActorFit*> by_name;
  std::string known;
  for (const ActorFit& a : fit.actors) {
    by_name[a.name] = &a;
    known += (known.empty() ? "" : ", ") + a.name;
  }
  bool any_mapped = false;
  for (const WorkerOfferConfig& w : c->workers) any_mapped |= !w.run_actors.empty();
  for (WorkerOfferConfig& w : c->workers) {
    std::vector<const ActorFit*> mine;
    if (!any_mapped && c->workers.size() == 1) {
      for (const ActorFit& a : fit.actors) mine.push_back(&a);
    } else {
      for (const std::string& name : w.run_actors) {
        auto it = by_name.find(name);
        if (it == by_name.end())
          return InvalidArgument(w.run_actors_where + ": workers run_actors names '" + name + "', which is not an actor of " +
                                 fit.dir + " (its actors: " + known + ")");
        mine.push_back(it->second);
      }
    }
    if (mine.empty()) continue;
    double tokens = 0;
    for (const ActorFit* a : mine) tokens += a->tokens_per_s;
    w.tokens_per_second = tokens / mine.size();
    w.concurrent_groups = 1;
    notes->push_back("worker class " + w.name + ": measured " + Fmt("%.1f", w.tokens_per_second) +
                     " tokens/s per instance, one group at a time (mean of " + std::to_string(mine.size()) +
                     " actor(s) of the run)" + (fit.learner_bound ? ", a lower bound: the run was learner-bound" : ""));
  }
  if (!any_mapped && c->workers.size() > 1)
    notes->push_back("no worker class names run_actors: the classes keep their own throughputs");
  if (c->groups_per_step != fit.groups_per_step || c->shape.group_size != fit.group_size)
    notes->push_back("rollout shape from the run: B = " + std::to_string(fit.groups_per_step) + ", G = " +
                     std::to_string(fit.group_size) + " (the config said B = " + std::to_string(c->groups_per_step) +
                     ", G = " + std::to_string(c->shape.group_size) + ")");
  c->groups_per_step = fit.groups_per_step;
  c->shape.group_size = fit.group_size;
  c->shape.completion_tokens = fit.completion_tokens;
  c->learner_step_seconds = fit.train_seconds;
  c->learner_overhead_seconds = fit.overhead_seconds;
  notes->push_back("learner step " + Fmt("%.3f", fit.train_seconds) + " s and overhead " +
                   Fmt("%.3f", fit.overhead_seconds) + " s per update, " + Fmt("%.1f", fit.completion_tokens) +
                   " generated tokens per rollout: measured in " + fit.dir);
  return Status::Ok();
}

}  // namespace echelon::plan
