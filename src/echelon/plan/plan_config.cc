#include "echelon/plan/plan_config.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "echelon/plan/yaml_reader.h"

namespace echelon::plan {
namespace {

// A GPU name must be in the price catalogue (which describe mode has not loaded).
Status CheckGpu(const PriceCatalog& prices, const YamlMap& m, const std::string& key, const std::string& name) {
  if (m.describing() || prices.Find(name) != nullptr) return Status::Ok();
  return InvalidArgument(m.Where(key) + ": unknown GPU '" + name + "'; the price catalogue has: " + prices.Names());
}

Status ReadModel(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("model"));
  double params_billion = c->model.params / 1e9;
  double active_billion = c->model.active_params / 1e9;
  ECHELON_RETURN_IF_ERROR(m.String("name", &c->model_name, Help("a label for tables")));
  ECHELON_RETURN_IF_ERROR(m.Float("params_billion", &params_billion, 1e-6, 1e4,
                                  Required("P: parameters, in billions (all experts of a mixture)")));
  ECHELON_RETURN_IF_ERROR(m.Float("bytes_per_param", &c->model.bytes_per_param, 0.25, 8,
                                  Help("bytes per weight in snapshots and at inference (2: bf16)")));
  ECHELON_RETURN_IF_ERROR(m.Float("kv_bytes_per_token", &c->model.kv_bytes_per_token, 1, 1e9,
                                  Required("KV cache bytes per token: 2 x layers x KV heads x head dim x bytes")));
  ECHELON_RETURN_IF_ERROR(m.Float("active_params_billion", &active_billion, 0, 1e4,
                                  Help("mixture of experts: P_a, parameters per token, in billions (0: dense)")));
  ECHELON_RETURN_IF_ERROR(m.Int("experts", &c->model.experts, 0, 100000, Help("mixture of experts: X experts per layer (0: dense)")));
  ECHELON_RETURN_IF_ERROR(m.Int("experts_per_token", &c->model.experts_per_token, 0, 100000,
                                Help("mixture of experts: k experts routed per token (0: dense)")));
  c->model.params = params_billion * 1e9;
  c->model.active_params = active_billion * 1e9;
  ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());
  const bool moe = active_billion > 0 || c->model.experts > 0 || c->model.experts_per_token > 0;
  if (moe && !(active_billion > 0 && active_billion < params_billion && c->model.experts_per_token > 0 &&
               c->model.experts_per_token < c->model.experts))
    return InvalidArgument(m.Where("experts") + ": a mixture of experts needs active_params_billion (below "
                           "params_billion), experts and experts_per_token (below experts) together");
  return Status::Ok();
}

Status ReadRollout(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("rollout"));
  ECHELON_RETURN_IF_ERROR(m.Int("groups_per_step", &c->groups_per_step, 1, 1000000, Required("B: prompt groups per learner update")));
  ECHELON_RETURN_IF_ERROR(m.Int("group_size", &c->shape.group_size, 1, 4096, Required("G: rollouts per group")));
  ECHELON_RETURN_IF_ERROR(m.Float("prompt_tokens", &c->shape.prompt_tokens, 0, 1e7, Help("L_p: prompt tokens per rollout")));
  ECHELON_RETURN_IF_ERROR(m.Float("completion_tokens", &c->shape.completion_tokens, 1, 1e7,
                                  Required("L: generated tokens per rollout (mean)")));
  return m.NoUnknownKeys();
}

Status ReadLearner(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("learner"));
  ECHELON_RETURN_IF_ERROR(m.String("gpu", &c->learner_gpu, Help("the learner's GPU (a name in the price catalogue)")));
  ECHELON_RETURN_IF_ERROR(CheckGpu(c->prices, m, "gpu", c->learner_gpu));
  ECHELON_RETURN_IF_ERROR(m.Int("count", &c->learner_count, 1, 100000, Help("the learner's GPUs")));
  ECHELON_RETURN_IF_ERROR(m.Float("step_seconds", &c->learner_step_seconds, 0, 1e7,
                                  Help("T_train: measured seconds per update (0: derived from FLOPs and mfu)")));
  ECHELON_RETURN_IF_ERROR(m.Float("overhead_seconds", &c->learner_overhead_seconds, 0, 1e7,
                                  Help("T_over: learner seconds per update outside training (publish, metrics, evaluation)")));
  ECHELON_RETURN_IF_ERROR(m.Float("mfu", &c->learner_mfu, 0.01, 1, Help("model FLOPs utilisation of training, when step_seconds is 0")));
  ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &c->learner_price_per_hour, 0, 1e4,
                                  Help("$ per GPU-hour (default -1: the catalogue's price)")));
  return m.NoUnknownKeys();
}

Status ReadBaseline(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("baseline"));
  ECHELON_RETURN_IF_ERROR(m.String("gpu", &c->baseline_gpu,
                                   Help("GPU of the centralised baseline that generates and trains in lock-step")));
  ECHELON_RETURN_IF_ERROR(CheckGpu(c->prices, m, "gpu", c->baseline_gpu));
  ECHELON_RETURN_IF_ERROR(m.Int("count", &c->baseline_count, 1, 100000, Help("the baseline's GPUs")));
  ECHELON_RETURN_IF_ERROR(m.Float("step_seconds", &c->baseline_step_seconds, 0, 1e7,
                                  Help("the baseline's training seconds per update (0: derived)")));
  ECHELON_RETURN_IF_ERROR(m.Float("generate_seconds", &c->baseline_generate_seconds, 0, 1e7,
                                  Help("the baseline's rollout seconds per update (0: derived)")));
  ECHELON_RETURN_IF_ERROR(m.Float("mfu", &c->baseline_mfu, 0.01, 1, Help("the baseline's training MFU, when step_seconds is 0")));
  ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &c->baseline_price_per_hour, 0, 1e4,
                                  Help("$ per GPU-hour (default -1: the catalogue's price)")));
  return m.NoUnknownKeys();
}

Status ReadRl(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("rl"));
  ECHELON_RETURN_IF_ERROR(m.Int("steps", &c->steps, 1, 100000000, Help("learner updates in the run (cost per run; simulated steps)")));
  ECHELON_RETURN_IF_ERROR(m.Int("max_staleness", &c->max_staleness, -1, 1000,
                                Help("S: a rollout may be at most S versions behind the update (-1: the planner recommends)")));
  ECHELON_RETURN_IF_ERROR(m.Int("publish_period", &c->publish_period, 0, 1001,
                                Help("kappa: versions between snapshots (0: the planner recommends); at most S + 1")));
  ECHELON_RETURN_IF_ERROR(m.Float("target_utilization", &c->target_utilization, 0.01, 1,
                                  Help("learner utilisation the activation provisions workers for")));
  ECHELON_RETURN_IF_ERROR(m.Int("staleness_cap", &c->staleness_cap, 1, 1000,
                                Help("the largest S the planner recommends (reward matched synchronous training up to S ~ 3-6)")));
  ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());
  if (c->max_staleness >= 0 && c->publish_period > c->max_staleness + 1)
    return InvalidArgument(m.Where("publish_period") + ": rl.publish_period = " + std::to_string(c->publish_period) +
                           " exceeds rl.max_staleness + 1 = " + std::to_string(c->max_staleness + 1) +
                           "; a snapshot that old can never be used");
  return Status::Ok();
}

Status ReadBroadcast(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("broadcast"));
  std::string mode = c->link.mode == BroadcastMode::kStar ? "star" : "relay";
  ECHELON_RETURN_IF_ERROR(m.Choice("mode", &mode, {"relay", "star"},
                                   Help("relay: every holder uploads chunks to the others (a swarm); star: the learner "
                                        "sends every worker the whole snapshot")));
  c->link.mode = mode == "star" ? BroadcastMode::kStar : BroadcastMode::kRelay;
  ECHELON_RETURN_IF_ERROR(m.Float("origin_uplink_mbps", &c->link.origin_uplink_mbps, 0.001, 1e7,
                                  Help("U: the learner's uplink, Mbit/s")));
  if (m.Has("fanout"))
    return InvalidArgument(m.Where("fanout") + ": broadcast.fanout is no longer a setting: the relay is a swarm in "
                                               "which every holder uploads (see src/echelon/plan/link_model.h); "
                                               "delete the key");
  ECHELON_RETURN_IF_ERROR(m.Float("chunk_mb", &c->link.chunk_mb, 0.001, 1e5, Help("the broadcast's chunk size, MB")));
  return m.NoUnknownKeys();
}

Status ReadWorker(YamlMap& m, PlanConfig* c) {
  WorkerOfferConfig w;
  ECHELON_RETURN_IF_ERROR(m.String("gpu", &w.gpu, Required("the GPU of this class (a name in the price catalogue)")));
  ECHELON_RETURN_IF_ERROR(CheckGpu(c->prices, m, "gpu", w.gpu));
  w.name = w.gpu;
  ECHELON_RETURN_IF_ERROR(m.String("name", &w.name, Help("the class's name in tables (default: its gpu); unique")));
  ECHELON_RETURN_IF_ERROR(m.Int("available", &w.available, 0, 10000000, Required("c_j: instances that may be rented")));
  ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &w.price_per_hour, 0, 1e4,
                                  Help("p_j: $ per hour of one GPU, of the whole pipeline when given (default -1: the "
                                       "catalogue's price per GPU)")));
  ECHELON_RETURN_IF_ERROR(m.Float("tokens_per_second", &w.tokens_per_second, 0, 1e9,
                                  Help("measured decode rate of one worker (0: derived from the GPU spec); with "
                                       "concurrent_groups")));
  ECHELON_RETURN_IF_ERROR(m.Int("concurrent_groups", &w.concurrent_groups, 0, 100000,
                                Help("s_j: groups decoded at once at the measured rate; with tokens_per_second")));
  ECHELON_RETURN_IF_ERROR(m.Float("downlink_mbps", &w.downlink_mbps, 0.001, 1e7, Help("d_j: Mbit/s into one GPU")));
  ECHELON_RETURN_IF_ERROR(m.Float("uplink_mbps", &w.uplink_mbps, 0.001, 1e7,
                                  Help("u_j: Mbit/s out of one GPU (relays snapshot chunks)")));
  ECHELON_RETURN_IF_ERROR(m.Float("failures_per_hour", &w.failures_per_hour, 0, 3600,
                                  Help("f_j: failures (preemptions) per hour of one GPU")));
  ECHELON_RETURN_IF_ERROR(m.Float("preemption_notice_seconds", &w.preemption_notice_seconds, 0, 86400,
                                  Help("warning before a preemption (a spot instance's notice: the worker's actors "
                                       "report their groups' prefixes and hand them back at once); 0: none")
                                      .ReadBy("simulate")));
  ECHELON_RETURN_IF_ERROR(m.Int("pipeline", &w.pipeline, 1, 64,
                                Help("GPUs of this kind holding the layers in turn (a pipeline worker); links, "
                                     "failures and the catalogue price are per GPU")));
  ECHELON_RETURN_IF_ERROR(m.Float("link_latency_ms", &w.link_latency_ms, 0, 1e5,
                                  Help("a pipeline's latency between consecutive stages, ms")));
  ECHELON_RETURN_IF_ERROR(m.StringList("run_actors", &w.run_actors,
                                       Help("with --from-run: the run's actors whose measured throughput this class "
                                            "takes (default: all, when the config has one class)")
                                           .ReadBy("plan --from-run")));
  w.run_actors_where = m.Where("run_actors");
  ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());
  if ((w.tokens_per_second > 0) != (w.concurrent_groups > 0))
    return InvalidArgument(m.Where("tokens_per_second") +
                           ": give tokens_per_second and concurrent_groups together (a measured rate needs its "
                           "concurrency), or neither");
  for (const WorkerOfferConfig& other : c->workers)
    if (other.name == w.name) return InvalidArgument(m.Where("name") + ": duplicate worker name '" + w.name + "'");
  c->workers.push_back(w);
  return Status::Ok();
}

Status ReadWorkers(YamlMap& top, PlanConfig* c) {
  ECHELON_RETURN_IF_ERROR(top.EachMap("workers", Required("the classes of rollout workers that may be activated"),
                                      [c](YamlMap& m, size_t) { return ReadWorker(m, c); }));
  if (c->workers.empty()) return InvalidArgument(top.Where("workers") + ": workers must list at least one class");
  return Status::Ok();
}

Status ReadPriceChange(YamlMap& e, size_t i, PlanConfig* c) {
  PriceChange pc;
  ECHELON_RETURN_IF_ERROR(e.Int("at_step", &pc.at_step, 1, 100000000, Required("the change applies from the end of this update")));
  ECHELON_RETURN_IF_ERROR(e.String("gpu", &pc.gpu, Required("the GPU whose worker classes change price")));
  ECHELON_RETURN_IF_ERROR(e.Float("price_per_hour", &pc.price_per_hour, 0, 1e4, Required("the new $ per hour")));
  ECHELON_RETURN_IF_ERROR(e.NoUnknownKeys());
  std::set<std::string> gpus;
  for (const WorkerOfferConfig& w : c->workers) gpus.insert(w.gpu);
  if (!e.describing() && !gpus.count(pc.gpu)) {
    std::string names;
    for (const std::string& g : gpus) names += (names.empty() ? "" : ", ") + g;
    return InvalidArgument(e.Where("gpu") + ": simulate.price_changes[" + std::to_string(i) + "].gpu = '" + pc.gpu +
                           "' is not the GPU of any worker class (they use: " + names + ")");
  }
  c->sim.price_changes.push_back(pc);
  return Status::Ok();
}

Status ReadSimulate(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YamlMap m, top.Child("simulate"));
  m.ReadBy("simulate");
  SimulateConfig& s = c->sim;
  int64_t seed = static_cast<int64_t>(s.seed);
  ECHELON_RETURN_IF_ERROR(m.Int("seed", &seed, 0, INT64_MAX, Help("seed of generation times")));
  s.seed = static_cast<uint64_t>(seed);
  ECHELON_RETURN_IF_ERROR(m.Float("throughput_cv", &s.throughput_cv, 0, 2,
                                  Help("spread (coefficient of variation) of a group's lognormal generation time")));
  ECHELON_RETURN_IF_ERROR(m.Float("restart_seconds", &s.restart_seconds, 0, 1e7,
                                  Help("a failed (preempted) worker is back after this").ReadBy("plan, simulate")));
  ECHELON_RETURN_IF_ERROR(m.Float("startup_seconds", &s.startup_seconds, 0, 1e7,
                                  Help("a newly activated worker boots this long before downloading").ReadBy("plan, simulate")));
  ECHELON_RETURN_IF_ERROR(m.Float("detect_seconds", &s.detect_seconds, 0, 1e7,
                                  Help("heartbeat timeout: a failed worker's groups are re-issued after this")));
  ECHELON_RETURN_IF_ERROR(m.Float("lease_seconds", &s.lease_seconds, 1, 1e9,
                                  Help("the dispatcher's lease (longer than any group)")));
  ECHELON_RETURN_IF_ERROR(m.Int("workers", &s.workers, 0, 10000000,
                                Help("0: the plan's activation; N: run exactly N workers, no re-activation (--workers)")));
  ECHELON_RETURN_IF_ERROR(m.Int("warmup_steps", &s.warmup_steps, -1, 100000000,
                                Help("steps left out of the steady-state figures (-1: 20% of the steps)")));
  ECHELON_RETURN_IF_ERROR(m.Bool("reactivate", &s.reactivate,
                                 Help("re-run activation when workers fail or return, or prices change")));
  ECHELON_RETURN_IF_ERROR(m.Choice("dispatch", &s.dispatch, {"fifo", "deadline"},
                                 Help("which group goes to which worker: fifo (in order) or deadline (only groups a worker "
                                      "is predicted to return before they go stale; rollout.dispatch)")));
  ECHELON_RETURN_IF_ERROR(m.Bool("resume", &s.resume,
                                 Help("a failed worker's groups continue from the tokens it reported (every 10 s) while "
                                      "within the staleness bound, instead of from the start; rollout.resume")));
  ECHELON_RETURN_IF_ERROR(m.Float("length_sigma", &s.length_sigma, 0, 5,
                                  Help("per-prompt response lengths: lognormal sigma around shape.completion_tokens "
                                       "(0: every group that long)")));
  ECHELON_RETURN_IF_ERROR(m.Float("length_max_tokens", &s.length_max_tokens, 0, 1e7,
                                  Help("the longest a prompt's responses average (0: 10 x shape.completion_tokens)")));
  ECHELON_RETURN_IF_ERROR(m.Int("prompts", &s.prompts, 0, INT64_MAX,
                                Help("dataset rows: group g is prompt g mod prompts, whose length repeats (0: every "
                                     "group a new prompt)")));
  ECHELON_RETURN_IF_ERROR(m.EachMap("price_changes", Help("price changes during the run, each re-running activation"),
                                    [c](YamlMap& e, size_t i) { return ReadPriceChange(e, i, c); }));
  std::stable_sort(s.price_changes.begin(), s.price_changes.end(),
                   [](const PriceChange& a, const PriceChange& b) { return a.at_step < b.at_step; });
  return m.NoUnknownKeys();
}

// Reads a plan config through `top`; in describe mode, records its keys instead.
Status ReadPlanConfig(YamlMap& top, PlanConfig* c) {
  std::string prices = "../data/prices.yaml";
  ECHELON_RETURN_IF_ERROR(top.String("prices", &prices,
                                     Help("the price catalogue: GPU specs and $ per hour (relative to this file)")));
  if (!top.describing()) {
    std::filesystem::path prices_path(prices);
    if (prices_path.is_relative()) prices_path = std::filesystem::path(c->path).parent_path() / prices_path;
    Result<PriceCatalog> catalogue = LoadPriceCatalog(prices_path.lexically_normal().string());
    if (!catalogue.ok()) return catalogue.status().WithContext(top.Where("prices") + ": loading the price catalogue");
    c->prices = std::move(catalogue).value();
  }
  ECHELON_RETURN_IF_ERROR(ReadModel(top, c));
  ECHELON_RETURN_IF_ERROR(ReadRollout(top, c));
  ECHELON_RETURN_IF_ERROR(ReadLearner(top, c));
  ECHELON_RETURN_IF_ERROR(ReadBaseline(top, c));
  ECHELON_RETURN_IF_ERROR(ReadRl(top, c));
  ECHELON_RETURN_IF_ERROR(ReadBroadcast(top, c));
  ECHELON_RETURN_IF_ERROR(ReadWorkers(top, c));
  ECHELON_RETURN_IF_ERROR(ReadSimulate(top, c));
  return top.NoUnknownKeys();
}

}  // namespace

Result<PlanConfig> LoadPlanConfig(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  PlanConfig c;
  c.path = path;
  YamlMap top(root, path, "");
  ECHELON_RETURN_IF_ERROR(ReadPlanConfig(top, &c));
  return c;
}

Status DescribePlanConfig(KeyTable* table) {
  YamlMap d = YamlMap::Describing(table, "plan, simulate");
  PlanConfig defaults;
  return ReadPlanConfig(d, &defaults);
}

const KeyTable& PlanConfigKeys() {
  static const KeyTable table = [] {
    KeyTable t;
    (void)DescribePlanConfig(&t);  // the defaults pass the checks describe mode runs (tested)
    return t;
  }();
  return table;
}

}  // namespace echelon::plan
