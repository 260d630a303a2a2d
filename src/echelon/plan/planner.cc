#include "echelon/plan/planner.h"

#include <cmath>
#include <cstdio>
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
  k.price_per_hour = w.price_per_hour >= 0 ? w.price_per_hour : gpu.price_per_hour;
  k.decode = w.tokens_per_second > 0 ? MeasuredDecode(w.tokens_per_second, w.concurrent_groups, c.shape)
                                     : EstimateDecode(gpu, c.model, c.shape);
  k.downlink_mbps = w.downlink_mbps;
  k.uplink_mbps = w.uplink_mbps;
  k.failures_per_hour = w.failures_per_hour;
  return k;
}

double TrainedTokens(const PlanConfig& c) {
  return static_cast<double>(c.groups_per_step) * c.shape.group_size * (c.shape.prompt_tokens + c.shape.completion_tokens);
}

// Picks S (if asked) and kappa (if asked) as planner.h describes; fills plan->inputs.
void ChooseStalenessAndPeriod(Plan* plan) {
  const PlanConfig& c = plan->config;
  CapacityInputs& in = plan->inputs;
  auto predict_with = [&](int64_t s, int64_t kappa) {
    in.max_staleness = s;
    in.publish_period = kappa;
    return PredictCapacity(in, plan->classes);
  };
  auto best_period = [&](int64_t s) {
    if (s == 0) return int64_t{1};
    CapacityPrediction p = predict_with(s, 1);
    return MaxFreshPublishPeriod(s, p.step_seconds, p.bcast_seconds, p.max_group_seconds);
  };
  int64_t s = c.max_staleness;
  if (s < 0) {
    plan->staleness_recommended = true;
    s = c.staleness_cap;
    for (int64_t cand = 1; cand <= c.staleness_cap; ++cand) {
      CapacityPrediction p = predict_with(cand, 1);
      if (!p.window_limited && best_period(cand) >= 1) {
        s = cand;
        break;
      }
    }
  }
  int64_t kappa = c.publish_period;
  if (kappa == 0) {
    plan->period_recommended = true;
    kappa = std::max<int64_t>(1, best_period(s));
  }
  predict_with(s, kappa);
}

}  // namespace

std::vector<WorkerOffer> ActivationOffers(const Plan& plan, const std::vector<int64_t>& available) {
  std::vector<WorkerOffer> offers;
  int64_t receivers = 0;
  double up = 0;
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    receivers += available[j];
    up += available[j] * plan.classes[j].uplink_mbps;
  }
  const double relay_up = receivers > 0 ? up / receivers : 0;
  for (size_t j = 0; j < plan.classes.size(); ++j) {
    const WorkerClass& k = plan.classes[j];
    WorkerOffer o;
    o.name = k.name;
    o.available = available[j];
    o.price_per_hour = k.price_per_hour;
    if (k.decode.feasible) {
      const double bcast = ClassSnapshotSeconds(plan.inputs, k, receivers, relay_up);
      o.rate = Availability(k, bcast, plan.inputs.rejoin_seconds) * k.decode.slots / k.decode.group_seconds;
    }
    offers.push_back(o);
  }
  return offers;
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
                           " GB) plus one group's KV cache does not fit in a " + w.gpu + "; class not used");
  }
  CapacityInputs& in = plan.inputs;
  in.shape = c.shape;
  in.groups_per_step = c.groups_per_step;
  in.train_seconds = c.learner_step_seconds > 0
                         ? c.learner_step_seconds
                         : EstimateTrainSeconds(learner, c.learner_count, c.learner_mfu, c.model, TrainedTokens(c));
  in.learner_price_per_hour =
      c.learner_count * (c.learner_price_per_hour >= 0 ? c.learner_price_per_hour : learner.price_per_hour);
  in.snapshot_bytes = c.model.weight_bytes();
  in.link = c.link;
  in.rejoin_seconds = c.sim.restart_seconds + c.sim.startup_seconds;

  plan.demand_groups_per_s = c.target_utilization * c.groups_per_step / in.train_seconds;
  std::vector<int64_t> available;
  for (const WorkerClass& k : plan.classes) available.push_back(k.available);
  plan.activation = Activate(ActivationOffers(plan, available), plan.demand_groups_per_s);
  for (size_t j = 0; j < plan.classes.size(); ++j) plan.classes[j].count = plan.activation.counts[j];
  if (!plan.activation.feasible)
    plan.notes.push_back("the catalogue cannot reach the target utilisation " + Fmt("%.2f", c.target_utilization) +
                         "; every usable worker is activated");
  if (plan.activation.method == "greedy")
    plan.notes.push_back("activation used the greedy heuristic (catalogue too large to search exactly); cost is at "
                         "most one worker's price above optimal");

  ChooseStalenessAndPeriod(&plan);
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
  for (const WorkerClass& k : plan.classes) {
    workers.push_back({{"name", k.name}, {"gpu", k.gpu}, {"count", k.count}, {"available", k.available},
                       {"price_per_hour", k.price_per_hour}, {"tokens_per_s", k.decode.tokens_per_s},
                       {"concurrent_groups", k.decode.slots}, {"group_seconds", k.decode.group_seconds}});
  }
  const double steps = static_cast<double>(plan.config.steps);
  return {
      {"predicted_utilization", p.utilization},
      {"step_seconds", p.step_seconds},
      {"train_seconds", plan.inputs.train_seconds},
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
