#include "echelon/plan/plan_config.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "echelon/plan/yaml_reader.h"

namespace echelon::plan {
namespace {

Status CheckGpu(const PriceCatalog& prices, const YamlMap& m, const std::string& key, const std::string& name) {
  if (prices.Find(name) != nullptr) return Status::Ok();
  return InvalidArgument(m.Where(key) + ": unknown GPU '" + name + "'; the price catalogue has: " + prices.Names());
}

Status ReadModel(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("model"));
  YamlMap m(node, c->path, "model.");
  double params_billion = 8;
  ECHELON_RETURN_IF_ERROR(m.String("name", &c->model_name));
  ECHELON_RETURN_IF_ERROR(m.Float("params_billion", &params_billion, 1e-6, 1e4, true));
  ECHELON_RETURN_IF_ERROR(m.Float("bytes_per_param", &c->model.bytes_per_param, 0.25, 8));
  ECHELON_RETURN_IF_ERROR(m.Float("kv_bytes_per_token", &c->model.kv_bytes_per_token, 1, 1e9, true));
  double active_billion = 0;
  ECHELON_RETURN_IF_ERROR(m.Float("active_params_billion", &active_billion, 0, 1e4));
  ECHELON_RETURN_IF_ERROR(m.Int("experts", &c->model.experts, 0, 100000));
  ECHELON_RETURN_IF_ERROR(m.Int("experts_per_token", &c->model.experts_per_token, 0, 100000));
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
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("rollout"));
  YamlMap m(node, c->path, "rollout.");
  ECHELON_RETURN_IF_ERROR(m.Int("groups_per_step", &c->groups_per_step, 1, 1000000, true));
  ECHELON_RETURN_IF_ERROR(m.Int("group_size", &c->shape.group_size, 1, 4096, true));
  ECHELON_RETURN_IF_ERROR(m.Float("prompt_tokens", &c->shape.prompt_tokens, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("completion_tokens", &c->shape.completion_tokens, 1, 1e7, true));
  return m.NoUnknownKeys();
}

Status ReadLearner(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("learner"));
  YamlMap m(node, c->path, "learner.");
  ECHELON_RETURN_IF_ERROR(m.String("gpu", &c->learner_gpu));
  ECHELON_RETURN_IF_ERROR(CheckGpu(c->prices, m, "gpu", c->learner_gpu));
  ECHELON_RETURN_IF_ERROR(m.Int("count", &c->learner_count, 1, 100000));
  ECHELON_RETURN_IF_ERROR(m.Float("step_seconds", &c->learner_step_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("overhead_seconds", &c->learner_overhead_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("mfu", &c->learner_mfu, 0.01, 1));
  ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &c->learner_price_per_hour, 0, 1e4));
  return m.NoUnknownKeys();
}

Status ReadBaseline(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("baseline"));
  YamlMap m(node, c->path, "baseline.");
  ECHELON_RETURN_IF_ERROR(m.String("gpu", &c->baseline_gpu));
  ECHELON_RETURN_IF_ERROR(CheckGpu(c->prices, m, "gpu", c->baseline_gpu));
  ECHELON_RETURN_IF_ERROR(m.Int("count", &c->baseline_count, 1, 100000));
  ECHELON_RETURN_IF_ERROR(m.Float("step_seconds", &c->baseline_step_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("generate_seconds", &c->baseline_generate_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("mfu", &c->baseline_mfu, 0.01, 1));
  ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &c->baseline_price_per_hour, 0, 1e4));
  return m.NoUnknownKeys();
}

Status ReadRl(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("rl"));
  YamlMap m(node, c->path, "rl.");
  ECHELON_RETURN_IF_ERROR(m.Int("steps", &c->steps, 1, 100000000));
  ECHELON_RETURN_IF_ERROR(m.Int("max_staleness", &c->max_staleness, -1, 1000));
  ECHELON_RETURN_IF_ERROR(m.Int("publish_period", &c->publish_period, 0, 1001));
  ECHELON_RETURN_IF_ERROR(m.Float("target_utilization", &c->target_utilization, 0.01, 1));
  ECHELON_RETURN_IF_ERROR(m.Int("staleness_cap", &c->staleness_cap, 1, 1000));
  ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());
  if (c->max_staleness >= 0 && c->publish_period > c->max_staleness + 1)
    return InvalidArgument(m.Where("publish_period") + ": rl.publish_period = " + std::to_string(c->publish_period) +
                           " exceeds rl.max_staleness + 1 = " + std::to_string(c->max_staleness + 1) +
                           "; a snapshot that old can never be used");
  return Status::Ok();
}

Status ReadBroadcast(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("broadcast"));
  YamlMap m(node, c->path, "broadcast.");
  std::string mode = "relay";
  ECHELON_RETURN_IF_ERROR(m.String("mode", &mode));
  if (mode != "relay" && mode != "star")
    return InvalidArgument(m.Where("mode") + ": broadcast.mode = '" + mode + "' is invalid; expected relay or star");
  c->link.mode = mode == "star" ? BroadcastMode::kStar : BroadcastMode::kRelay;
  ECHELON_RETURN_IF_ERROR(m.Float("origin_uplink_mbps", &c->link.origin_uplink_mbps, 0.001, 1e7));
  if (m.Has("fanout"))
    return InvalidArgument(m.Where("fanout") + ": broadcast.fanout is no longer a setting: the relay is a swarm in "
                                               "which every holder uploads (see src/echelon/plan/link_model.h); "
                                               "delete the key");
  ECHELON_RETURN_IF_ERROR(m.Float("chunk_mb", &c->link.chunk_mb, 0.001, 1e5));
  return m.NoUnknownKeys();
}

Status ReadWorkers(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node list, top.Sequence("workers", true));
  for (size_t i = 0; i < list.size(); ++i) {
    YamlMap m(list[i], c->path, "workers[" + std::to_string(i) + "].");
    ECHELON_RETURN_IF_ERROR(m.status());
    WorkerOfferConfig w;
    ECHELON_RETURN_IF_ERROR(m.String("gpu", &w.gpu, true));
    ECHELON_RETURN_IF_ERROR(CheckGpu(c->prices, m, "gpu", w.gpu));
    w.name = w.gpu;
    ECHELON_RETURN_IF_ERROR(m.String("name", &w.name));
    ECHELON_RETURN_IF_ERROR(m.Int("available", &w.available, 0, 10000000, true));
    ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &w.price_per_hour, 0, 1e4));
    ECHELON_RETURN_IF_ERROR(m.Float("tokens_per_second", &w.tokens_per_second, 0, 1e9));
    ECHELON_RETURN_IF_ERROR(m.Int("concurrent_groups", &w.concurrent_groups, 0, 100000));
    ECHELON_RETURN_IF_ERROR(m.Float("downlink_mbps", &w.downlink_mbps, 0.001, 1e7));
    ECHELON_RETURN_IF_ERROR(m.Float("uplink_mbps", &w.uplink_mbps, 0.001, 1e7));
    ECHELON_RETURN_IF_ERROR(m.Float("failures_per_hour", &w.failures_per_hour, 0, 3600));
    ECHELON_RETURN_IF_ERROR(m.Int("pipeline", &w.pipeline, 1, 64));
    ECHELON_RETURN_IF_ERROR(m.Float("link_latency_ms", &w.link_latency_ms, 0, 1e5));
    ECHELON_ASSIGN_OR_RETURN(YAML::Node actors, m.Sequence("run_actors"));
    for (size_t a = 0; actors && a < actors.size(); ++a) {
      if (!actors[a].IsScalar() || actors[a].Scalar().empty())
        return InvalidArgument(m.Where("run_actors") + ": workers[" + std::to_string(i) + "].run_actors[" +
                               std::to_string(a) + "] must be an actor name");
      w.run_actors.push_back(actors[a].Scalar());
    }
    w.run_actors_where = m.Where("run_actors");
    ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());
    if ((w.tokens_per_second > 0) != (w.concurrent_groups > 0))
      return InvalidArgument(m.Where("tokens_per_second") +
                             ": give tokens_per_second and concurrent_groups together (a measured rate needs its "
                             "concurrency), or neither");
    for (const WorkerOfferConfig& other : c->workers)
      if (other.name == w.name) return InvalidArgument(m.Where("name") + ": duplicate worker name '" + w.name + "'");
    c->workers.push_back(w);
  }
  if (c->workers.empty()) return InvalidArgument(top.Where("workers") + ": workers must list at least one class");
  return Status::Ok();
}

Status ReadSimulate(YamlMap& top, PlanConfig* c) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, top.Map("simulate"));
  YamlMap m(node, c->path, "simulate.");
  int64_t seed = 1;
  ECHELON_RETURN_IF_ERROR(m.Int("seed", &seed, 0, INT64_MAX));
  c->sim.seed = static_cast<uint64_t>(seed);
  ECHELON_RETURN_IF_ERROR(m.Float("throughput_cv", &c->sim.throughput_cv, 0, 2));
  ECHELON_RETURN_IF_ERROR(m.Float("restart_seconds", &c->sim.restart_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("startup_seconds", &c->sim.startup_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("detect_seconds", &c->sim.detect_seconds, 0, 1e7));
  ECHELON_RETURN_IF_ERROR(m.Float("lease_seconds", &c->sim.lease_seconds, 1, 1e9));
  ECHELON_RETURN_IF_ERROR(m.Int("workers", &c->sim.workers, 0, 10000000));
  ECHELON_RETURN_IF_ERROR(m.Int("warmup_steps", &c->sim.warmup_steps, -1, 100000000));
  std::string reactivate = "true";
  ECHELON_RETURN_IF_ERROR(m.String("reactivate", &reactivate));
  if (reactivate != "true" && reactivate != "false")
    return InvalidArgument(m.Where("reactivate") + ": simulate.reactivate = '" + reactivate +
                           "' is invalid; expected true or false");
  c->sim.reactivate = reactivate == "true";
  ECHELON_ASSIGN_OR_RETURN(YAML::Node changes, m.Sequence("price_changes"));
  for (size_t i = 0; changes && i < changes.size(); ++i) {
    YamlMap e(changes[i], c->path, "simulate.price_changes[" + std::to_string(i) + "].");
    ECHELON_RETURN_IF_ERROR(e.status());
    PriceChange pc;
    ECHELON_RETURN_IF_ERROR(e.Int("at_step", &pc.at_step, 1, 100000000, true));
    ECHELON_RETURN_IF_ERROR(e.String("gpu", &pc.gpu, true));
    ECHELON_RETURN_IF_ERROR(e.Float("price_per_hour", &pc.price_per_hour, 0, 1e4, true));
    ECHELON_RETURN_IF_ERROR(e.NoUnknownKeys());
    bool used = false;
    for (const WorkerOfferConfig& w : c->workers) used |= w.gpu == pc.gpu;
    if (!used) {
      std::set<std::string> names;
      for (const WorkerOfferConfig& w : c->workers) names.insert(w.gpu);
      std::string gpus;
      for (const std::string& g : names) gpus += (gpus.empty() ? "" : ", ") + g;
      return InvalidArgument(e.Where("gpu") + ": simulate.price_changes[" + std::to_string(i) + "].gpu = '" + pc.gpu +
                             "' is not the GPU of any worker class (they use: " + gpus + ")");
    }
    c->sim.price_changes.push_back(pc);
  }
  std::stable_sort(c->sim.price_changes.begin(), c->sim.price_changes.end(),
                   [](const PriceChange& a, const PriceChange& b) { return a.at_step < b.at_step; });
  return m.NoUnknownKeys();
}

}  // namespace

Result<PlanConfig> LoadPlanConfig(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  PlanConfig c;
  c.path = path;
  YamlMap top(root, path, "");
  std::string prices = "../data/prices.yaml";
  ECHELON_RETURN_IF_ERROR(top.String("prices", &prices));
  std::filesystem::path prices_path(prices);
  if (prices_path.is_relative()) prices_path = std::filesystem::path(path).parent_path() / prices_path;
  Result<PriceCatalog> catalogue = LoadPriceCatalog(prices_path.lexically_normal().string());
  if (!catalogue.ok()) return catalogue.status().WithContext(top.Where("prices") + ": loading the price catalogue");
  c.prices = std::move(catalogue).value();
  ECHELON_RETURN_IF_ERROR(ReadModel(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadRollout(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadLearner(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadBaseline(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadRl(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadBroadcast(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadWorkers(top, &c));
  ECHELON_RETURN_IF_ERROR(ReadSimulate(top, &c));
  ECHELON_RETURN_IF_ERROR(top.NoUnknownKeys());
  return c;
}

}  // namespace echelon::plan
