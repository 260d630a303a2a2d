#include "echelon/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

namespace echelon::plan {
namespace {

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

WorkerClass ResolveClass(const PlanConfig& c, const WorkerOfferConfig& w) {
  const GpuSpec& gpu = *c.prices.Find(w.gpu);
  WorkerClass k;
  k.name = w.name;
  k.gpu = w.gpu;
  k.available = w.available;
  // A pipeline of k GPUs: k times the price and the failures; each stage fetches its 1/k of a
  // snapshot over its own link, as fast as one link k times wider.
  const int64_t stages = w.pipeline;
  k.price_per_hour = w.price_per_hour >= 0 ? w.price_per_hour : stages * gpu.price_per_hour;
  k.decode = w.tokens_per_second > 0
                 ? MeasuredDecode(w.tokens_per_second, w.concurrent_groups, c.shape)
                 : EstimateDecode(gpu, c.model, c.shape, stages, w.link_latency_ms / 1000);
  k.downlink_mbps = stages * w.downlink_mbps;
  k.uplink_mbps = stages * w.uplink_mbps;
  k.failures_per_hour = stages * w.failures_per_hour;
  k.preemption_notice_seconds = w.preemption_notice_seconds;
  return k;
}

double CostPerMillionConsumedTokens(const PlanConfig& c, double cost_per_step) {
  const double tokens = static_cast<double>(c.groups_per_step) * c.shape.group_size * c.shape.completion_tokens;
  return tokens > 0 ? cost_per_step / tokens * 1e6 : 0.0;
}

double TrainedTokens(const PlanConfig& c) {
  return static_cast<double>(c.groups_per_step) * c.shape.group_size * (c.shape.prompt_tokens + c.shape.completion_tokens);
}

// One choice of S: the activation over the classes fresh at S, kappa, and its prediction.
struct Candidate {
  int64_t s = 0;
  int64_t kappa = 1;
  Activation activation;
  CapacityPrediction prediction;
  bool valid() const {
    return prediction.supply_groups_per_s > 0 && !prediction.window_limited && prediction.fresh;
  }
};

// Activates for staleness s (kappa as configured, or 1 while it is still to be chosen: the
// most permissive for freshness), then picks kappa if the config leaves it to the planner.
// Leaves plan->inputs and the class counts as evaluated.
Candidate Evaluate(Plan* plan, int64_t s, const std::vector<int64_t>& available) {
  const PlanConfig& c = plan->config;
  CapacityInputs& in = plan->inputs;
  Candidate k;
  k.s = s;
  in.max_staleness = s;
  in.publish_period = c.publish_period > 0 ? c.publish_period : 1;
  const FreshActivation fa = ActivateFresh(*plan, available);
  k.activation = fa.activation;
  plan->class_fresh = fa.fresh;
  plan->class_arrival_staleness = fa.arrival;
  for (size_t j = 0; j < plan->classes.size(); ++j) plan->classes[j].count = k.activation.counts[j];
  k.kappa = in.publish_period;
  if (c.publish_period == 0 && s > 0) {
    const CapacityPrediction p = PredictCapacity(in, plan->classes);
    if (p.slots > 0)
      k.kappa = std::max<int64_t>(1, MaxFreshPublishPeriod(s, p.step_seconds, p.bcast_seconds, p.max_group_seconds));
  }
  in.publish_period = k.kappa;
  k.prediction = PredictCapacity(in, plan->classes);
  return k;
}

// b is a better choice than a: valid first, then a met target, then the lower $/step (the
// higher utilisation when the target is out of reach); ties keep a (the smaller S).
bool Better(const Candidate& b, const Candidate& a) {
  if (b.valid() != a.valid()) return b.valid();
  if (b.activation.feasible != a.activation.feasible) return b.activation.feasible;
  if (b.activation.feasible) {
    return b.prediction.cost_per_step < a.prediction.cost_per_step * (1 - 1e-9);
  }
  return b.prediction.utilization > a.prediction.utilization * (1 + 1e-9);
}

// Chooses S (if asked), the activation and kappa (if asked) as planner.h describes; leaves
// plan->inputs, plan->activation and the class counts at the choice.
void ChooseActivation(Plan* plan, const std::vector<int64_t>& available) {
  const PlanConfig& c = plan->config;
  int64_t s = c.max_staleness;
  if (s < 0) {
    plan->staleness_recommended = true;
    std::optional<Candidate> best;
    for (int64_t cand = 1; cand <= c.staleness_cap; ++cand) {
      if (c.publish_period > cand + 1) continue;  // that snapshot period is never fresh at this S
      Candidate k = Evaluate(plan, cand, available);
      if (!best || Better(k, *best)) best = k;
    }
    s = best && best->valid() ? best->s : c.staleness_cap;
  }
  plan->period_recommended = c.publish_period == 0;
  plan->activation = Evaluate(plan, s, available).activation;
}

// How many workers receive snapshots when `counts[j]` of each class take part, and their mean
// uplink (the relay bandwidth of the broadcast), 0 when there are none.
std::pair<int64_t, double> Receivers(const Plan& plan, const std::vector<int64_t>& counts) {
  int64_t n = 0;
  double up = 0;
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    n += counts[j];
    up += counts[j] * plan.classes[j].uplink_mbps;
  }
  return {n, n > 0 ? up / n : 0};
}

}  // namespace

std::vector<int64_t> ClassMinArrivalStalenesses(const Plan& plan, const std::vector<int64_t>& receivers) {
  std::vector<int64_t> out(plan.classes.size(), -1);
  const auto [n, relay_up] = Receivers(plan, receivers);
  const double step = FreshnessStepSeconds(plan);
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    const WorkerClass& k = plan.classes[j];
    if (!k.decode.feasible) continue;
    const double bcast = ClassSnapshotSeconds(plan.inputs, k, std::max<int64_t>(n, 1), n > 0 ? relay_up : k.uplink_mbps);
    out[j] = ClassMinArrivalStaleness(step, bcast, k.decode.group_seconds);
  }
  return out;
}

std::vector<WorkerOffer> ActivationOffers(const Plan& plan, const std::vector<int64_t>& available,
                                          const std::vector<bool>& excluded) {
  std::vector<WorkerOffer> offers;
  const auto [receivers, relay_up] = Receivers(plan, available);
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    const WorkerClass& k = plan.classes[j];
    WorkerOffer o;
    o.name = k.name;
    o.available = available[j];
    o.price_per_hour = k.price_per_hour;
    if (k.decode.feasible && (excluded.empty() || !excluded[j])) {
      const double bcast = ClassSnapshotSeconds(plan.inputs, k, receivers, relay_up);
      o.rate = Availability(k, bcast, plan.inputs.rejoin_seconds) * k.decode.slots / k.decode.group_seconds;
    }
    offers.push_back(o);
  }
  return offers;
}

FreshActivation ActivateFresh(const Plan& plan, const std::vector<int64_t>& available,
                              const std::vector<int64_t>* incumbent) {
  const size_t n = plan.classes.size();
  const int64_t s = plan.inputs.max_staleness;
  const double step = FreshnessStepSeconds(plan);
  FreshActivation out;
  std::vector<bool> excluded(n, false);
  std::vector<int64_t> excluded_at(n, -1);
  // Generation alone longer than S steps: no broadcast can make the class's groups usable.
  for (size_t j = 0; j < n && s > 0; ++j) {
    const WorkerClass& k = plan.classes[j];
    if (!k.decode.feasible) continue;
    const int64_t a = ClassMinArrivalStaleness(step, 0, k.decode.group_seconds);
    if (a > s) {
      excluded[j] = true;
      excluded_at[j] = a;
    }
  }
  while (true) {
    out.offers = ActivationOffers(plan, available, excluded);
    out.activation = Activate(out.offers, plan.demand_groups_per_s);
    if (s == 0) break;
    // With the broadcast the chosen workers will have (relays forward at their own uplinks).
    // One class leaves per round, the stale one with the slowest uplink (then the stalest):
    // it slows everyone's broadcast most, and without it the others may arrive in time.
    const std::vector<int64_t> arrival = ClassMinArrivalStalenesses(plan, out.activation.counts);
    int worst = -1;
    for (size_t j = 0; j < n; ++j) {
      if (out.activation.counts[j] == 0 || arrival[j] <= s) continue;
      const WorkerClass& k = plan.classes[j];
      if (worst < 0 || k.uplink_mbps < plan.classes[worst].uplink_mbps ||
          (k.uplink_mbps == plan.classes[worst].uplink_mbps && arrival[j] > arrival[worst]))
        worst = static_cast<int>(j);
    }
    if (worst < 0) break;
    excluded[worst] = true;
    excluded_at[worst] = arrival[worst];
  }
  // Leaving classes out is greedy (a class stale among the workers chosen with it is not
  // tried again beside better relays), so a set already known to work may be cheaper: keep
  // it when it still meets the demand, every class in it is usable, and it costs less.
  if (incumbent != nullptr && incumbent->size() == n) {
    const std::vector<WorkerOffer> all = ActivationOffers(plan, available);
    const std::vector<int64_t> arrival = ClassMinArrivalStalenesses(plan, *incumbent);
    double supply = 0, cost = 0;
    bool usable = true;
    for (size_t j = 0; j < n; ++j) {
      const int64_t c = (*incumbent)[j];
      if (c == 0) continue;
      usable &= c <= available[j] && all[j].rate > 0 && (s == 0 || arrival[j] <= s);
      supply += c * all[j].rate;
      cost += c * all[j].price_per_hour;
    }
    const double eps = 1e-9 * std::max(1.0, cost);
    if (usable && supply >= plan.demand_groups_per_s * (1 - 1e-9) &&
        (!out.activation.feasible || cost < out.activation.cost_per_hour - eps)) {
      out.activation.counts = *incumbent;
      out.activation.cost_per_hour = cost;
      out.activation.supply = supply;
      out.activation.feasible = true;
      out.activation.method = "kept";
      for (size_t j = 0; j < n; ++j)
        if ((*incumbent)[j] > 0) excluded[j] = false;
    }
  }
  int64_t chosen = 0;
  for (int64_t c : out.activation.counts) chosen += c;
  const std::vector<int64_t> arrival = ClassMinArrivalStalenesses(plan, chosen > 0 ? out.activation.counts : available);
  out.fresh.resize(n);
  out.arrival.resize(n);
  for (size_t j = 0; j < n; ++j) {
    out.arrival[j] = excluded[j] ? excluded_at[j] : arrival[j];
    out.fresh[j] = plan.classes[j].decode.feasible && (s == 0 || (!excluded[j] && arrival[j] <= s));
  }
  return out;
}

double FreshnessStepSeconds(const Plan& plan) {
  const CapacityInputs& in = plan.inputs;
  return std::max(in.train_seconds + in.overhead_seconds, in.train_seconds / plan.config.target_utilization);
}

Result<Plan> MakePlan(const PlanConfig& config) {
  Plan plan;
  plan.config = config;
  const PlanConfig& c = plan.config;
  const GpuSpec& learner = *c.prices.Find(c.learner_gpu);
  const GpuSpec& base = *c.prices.Find(c.baseline_gpu);
  for (const WorkerOfferConfig& w : c.workers) {
    plan.classes.push_back(ResolveClass(c, w));
    if (!plan.classes.back().decode.feasible)
      plan.notes.push_back("worker class " + w.name + ": the model (" + Fmt("%.1f", c.model.weight_bytes() / 1e9) +
                           " GB) plus one group's KV cache does not fit in " +
                           (w.pipeline > 1 ? std::to_string(w.pipeline) + " x " + w.gpu : "a " + w.gpu) +
                           "; class not used");
  }
  CapacityInputs& in = plan.inputs;
  in.shape = c.shape;
  in.groups_per_step = c.groups_per_step;
  in.train_seconds = c.learner_step_seconds > 0
                         ? c.learner_step_seconds
                         : EstimateTrainSeconds(learner, c.learner_count, c.learner_mfu, c.model, TrainedTokens(c));
  in.overhead_seconds = c.learner_overhead_seconds;
  in.learner_price_per_hour =
      c.learner_count * (c.learner_price_per_hour >= 0 ? c.learner_price_per_hour : learner.price_per_hour);
  in.snapshot_bytes = c.model.weight_bytes();
  in.link = c.link;
  in.rejoin_seconds = c.sim.restart_seconds + c.sim.startup_seconds;

  plan.demand_groups_per_s = c.target_utilization * c.groups_per_step / in.train_seconds;
  std::vector<int64_t> available;
  for (const WorkerClass& k : plan.classes) available.push_back(k.available);
  ChooseActivation(&plan, available);
  if (!plan.activation.feasible)
    plan.notes.push_back("the catalogue cannot reach the target utilisation " + Fmt("%.2f", c.target_utilization) +
                         "; every usable worker is activated");
  if (plan.activation.method == "greedy")
    plan.notes.push_back("activation used the greedy heuristic (catalogue too large to search exactly); cost is at "
                         "most one worker's price above optimal");
  bool any_fresh = false;
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    any_fresh |= plan.class_fresh[j];
    if (plan.class_fresh[j] || !plan.classes[j].decode.feasible) continue;
    plan.notes.push_back("worker class " + plan.classes[j].name + ": a group takes " +
                         Fmt("%.1f", plan.classes[j].decode.group_seconds) +
                         " s; with its snapshot download, at the target step of " + Fmt("%.1f", FreshnessStepSeconds(plan)) +
                         " s every group would be at least " + std::to_string(plan.class_arrival_staleness[j]) +
                         " versions old when it arrives (S = " + std::to_string(in.max_staleness) + "); not activated");
  }
  if (!any_fresh && in.max_staleness > 0) {
    // The smallest S at which activation finds any usable worker (kappa = 1).
    Plan probe = plan;
    probe.inputs.publish_period = 1;
    for (int64_t need = in.max_staleness + 1; need <= 1000; ++need) {
      probe.inputs.max_staleness = need;
      if (ActivateFresh(probe, available).activation.supply <= 0) continue;
      plan.notes.push_back("no worker class delivers usable groups at S = " + std::to_string(in.max_staleness) +
                           "; the smallest S at which one does is " + std::to_string(need) +
                           " (raise rl.max_staleness or rl.staleness_cap, or use faster links or GPUs)");
      break;
    }
  }
  if (in.overhead_seconds > 0 && in.train_seconds / (in.train_seconds + in.overhead_seconds) < c.target_utilization)
    plan.notes.push_back("learner overhead " + Fmt("%.2f", in.overhead_seconds) + " s per update caps utilisation at " +
                         Fmt("%.3f", in.train_seconds / (in.train_seconds + in.overhead_seconds)));

  plan.prediction = PredictCapacity(plan.inputs, plan.classes);
  if (plan.prediction.window_limited)
    plan.notes.push_back("the staleness window S*B is smaller than the workers' concurrent slots; raise S or B");
  if (!plan.prediction.fresh)
    plan.notes.push_back("freshness bound " + std::to_string(plan.prediction.staleness_bound) + " exceeds S = " +
                         std::to_string(plan.inputs.max_staleness) + ": some rollouts will arrive too stale");

  const double base_train = c.baseline_step_seconds > 0
                                ? c.baseline_step_seconds
                                : EstimateTrainSeconds(base, c.baseline_count, c.baseline_mfu, c.model, TrainedTokens(c));
  const double base_gen = c.baseline_generate_seconds > 0
                              ? c.baseline_generate_seconds
                              : BaselineGenerateSeconds(base, c.baseline_count, c.model, c.shape, c.groups_per_step);
  const double base_price = c.baseline_count * (c.baseline_price_per_hour >= 0 ? c.baseline_price_per_hour : base.price_per_hour);
  if (!std::isfinite(base_gen))
    return FailedPrecondition(c.path + ": baseline.gpu " + c.baseline_gpu + " cannot hold the model for generation");
  plan.baseline = PredictBaseline(base_train, base_gen, base_price);
  return plan;
}

nlohmann::json PlanJson(const Plan& plan) {
  const CapacityPrediction& p = plan.prediction;
  nlohmann::json workers = nlohmann::json::array();
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    const WorkerClass& k = plan.classes[j];
    const int64_t arrival = plan.class_arrival_staleness[j];
    const bool fresh = plan.class_fresh[j];
    workers.push_back({{"name", k.name}, {"gpu", k.gpu}, {"count", k.count}, {"available", k.available},
                       {"price_per_hour", k.price_per_hour}, {"tokens_per_s", k.decode.tokens_per_s},
                       {"concurrent_groups", k.decode.slots}, {"group_seconds", k.decode.group_seconds},
                       {"min_arrival_staleness", arrival}, {"fresh", fresh}});
  }
  const double steps = static_cast<double>(plan.config.steps);
  return {
      {"predicted_utilization", p.utilization},
      {"cost_per_million_consumed_tokens", CostPerMillionConsumedTokens(plan.config, p.cost_per_step)},
      {"baseline_cost_per_million_consumed_tokens", CostPerMillionConsumedTokens(plan.config, plan.baseline.cost_per_step)},
      {"step_seconds", p.step_seconds},
      {"train_seconds", plan.inputs.train_seconds},
      {"overhead_seconds", plan.inputs.overhead_seconds},
      {"cost_per_step", p.cost_per_step},
      {"cost_per_hour", p.cost_per_hour},
      {"cost_per_run", p.cost_per_step * steps},
      {"run_hours", p.step_seconds * steps / 3600},
      {"baseline_cost_per_step", plan.baseline.cost_per_step},
      {"baseline_step_seconds", plan.baseline.step_seconds},
      {"baseline_cost_per_run", plan.baseline.cost_per_step * steps},
      {"baseline_run_hours", plan.baseline.step_seconds * steps / 3600},
      {"saving", plan.saving()},
      {"max_staleness", plan.inputs.max_staleness},
      {"publish_period", plan.inputs.publish_period},
      {"staleness_bound", p.staleness_bound},
      {"fresh", p.fresh},
      {"bcast_seconds", p.bcast_seconds},
      {"window_limited", p.window_limited},
      {"activation", {{"method", plan.activation.method}, {"workers_cost_per_hour", plan.activation.cost_per_hour},
                      {"lp_bound_per_hour", plan.activation.lp_cost}, {"feasible", plan.activation.feasible}}},
      {"workers", workers},
      {"notes", plan.notes},
  };
}

std::string PlanTable(const Plan& plan) {
  const PlanConfig& c = plan.config;
  const CapacityPrediction& p = plan.prediction;
  std::ostringstream o;
  o << "plan for " << (c.model_name.empty() ? c.path : c.model_name) << ": B=" << c.groups_per_step << " groups x G="
    << c.shape.group_size << ", " << c.shape.completion_tokens << " tokens/rollout, learner " << c.learner_count << "x"
    << c.learner_gpu << " (T_train " << Fmt("%.1f", plan.inputs.train_seconds) << " s)\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %-18s %6s %6s %8s %10s %6s %9s\n", "worker class", "gpu", "avail", "use",
                "$/h", "tok/s", "slots", "T_gen s");
  o << line;
  for (const WorkerClass& k : plan.classes) {
    std::snprintf(line, sizeof line, "%-20s %-18s %6lld %6lld %8.2f %10.0f %6lld %9.1f\n", k.name.c_str(), k.gpu.c_str(),
                  static_cast<long long>(k.available), static_cast<long long>(k.count), k.price_per_hour,
                  k.decode.tokens_per_s, static_cast<long long>(k.decode.slots), k.decode.group_seconds);
    o << line;
  }
  o << "\nactivation: " << plan.activation.method << ", workers $" << Fmt("%.2f", plan.activation.cost_per_hour)
    << "/h (LP bound $" << Fmt("%.2f", plan.activation.lp_cost) << "/h)\n";
  o << "staleness S = " << plan.inputs.max_staleness << (plan.staleness_recommended ? " (recommended)" : "")
    << ", snapshot every kappa = " << plan.inputs.publish_period << (plan.period_recommended ? " (recommended)" : "")
    << " steps; broadcast " << Fmt("%.1f", p.bcast_seconds) << " s (" << BroadcastModeName(c.link.mode)
    << "), staleness bound " << p.staleness_bound << (p.fresh ? " (fresh)" : " (TOO STALE)") << "\n\n";
  std::snprintf(line, sizeof line, "%-28s %14s %14s\n", "", "distributed", "centralised");
  o << line;
  auto row = [&](const char* name, const std::string& a, const std::string& b) {
    std::snprintf(line, sizeof line, "%-28s %14s %14s\n", name, a.c_str(), b.c_str());
    o << line;
  };
  const double steps = static_cast<double>(c.steps);
  row("learner utilisation", Fmt("%.3f", p.utilization), Fmt("%.3f", plan.baseline.train_seconds / plan.baseline.step_seconds));
  row("step seconds", Fmt("%.1f", p.step_seconds), Fmt("%.1f", plan.baseline.step_seconds));
  row("$/hour", Fmt("%.2f", p.cost_per_hour), Fmt("%.2f", plan.baseline.price_per_hour));
  row("$/step", Fmt("%.4f", p.cost_per_step), Fmt("%.4f", plan.baseline.cost_per_step));
  row("$/M consumed tokens", Fmt("%.4f", CostPerMillionConsumedTokens(c, p.cost_per_step)),
      Fmt("%.4f", CostPerMillionConsumedTokens(c, plan.baseline.cost_per_step)));
  row(("$/run (" + std::to_string(c.steps) + " steps)").c_str(), Fmt("%.0f", p.cost_per_step * steps),
      Fmt("%.0f", plan.baseline.cost_per_step * steps));
  row("run hours", Fmt("%.1f", p.step_seconds * steps / 3600), Fmt("%.1f", plan.baseline.step_seconds * steps / 3600));
  o << "saving against the centralised baseline: " << Fmt("%.1f", 100 * plan.saving()) << "%\n";
  for (const std::string& n : plan.notes) o << "note: " << n << "\n";
  return o.str();
}

Result<Plan> MakePlanFromFile(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(PlanConfig config, LoadPlanConfig(path));
  return MakePlan(config);
}

}  // namespace echelon::plan
