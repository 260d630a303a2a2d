// `echelon plan CONFIG [--json] [--from-run RUN_DIR]`: cost-aware activation and the capacity
// model's prediction for a run (docs/CAPACITY.md). Prints a table; with --json the last line
// is one JSON object (predicted_utilization, cost_per_step, baseline_cost_per_step, workers,
// ...). With --from-run the model is fitted to a real run directory: its measured inputs and
// its predicted against its measured learner utilisation are printed (JSON: "from_run"), and
// the plan uses the run's step time, overhead, rollout shape and actor throughput instead of
// the config's. `echelon plan --from-run RUN_DIR` without CONFIG prints only the fit.
// `echelon plan --config-keys markdown` prints the config's key table (docs/CAPACITY.md,
// "Config keys"); --help ends with it as text. `echelon plan --learner-memory MODEL` prints the
// learner's memory per rank by set-up and which GPUs it fits (learn/learner_memory.h).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/cli/train_config.h"
#include "echelon/common/config.h"
#include "echelon/common/fs.h"
#include "echelon/cli/processes.h"
#include "echelon/learn/learner_memory.h"
#include "echelon/learn/learner_memory_probe.h"
#include "echelon/model/model_config.h"
#include "echelon/plan/price_catalog.h"
#include "echelon/plan/plan_config.h"
#include "echelon/plan/planner.h"
#include "echelon/plan/run_fit.h"

namespace echelon::cli {
namespace {

// The run's B, G, S and kappa, from its config.yaml read with the training schema (the keys,
// ranges and resolution `echelon train` used). learner.device and learner.ranks are
// checked against this machine by RunOptionsFromConfig; the fit needs neither, so a run
// made elsewhere (on GPUs, on more cores) is read as if it ran here on one CPU rank.
Result<plan::RunShape> ReadRunShape(const std::string& run_dir) {
  ECHELON_ASSIGN_OR_RETURN(const std::string path, plan::RunConfigPath(run_dir));
  ECHELON_ASSIGN_OR_RETURN(const Config cfg, Config::Load(TrainSchema(), path, {"learner.device=cpu", "learner.ranks=1"}));
  ECHELON_ASSIGN_OR_RETURN(const RunOptions o, RunOptionsFromConfig(cfg));
  plan::RunShape shape;
  shape.groups_per_step = o.groups_per_step;
  shape.group_size = o.group_size;
  shape.staleness = o.staleness;
  shape.staleness_auto = o.staleness_control.has_value();
  shape.publish_period = o.publish_period;
  shape.dispatch = o.dispatch;
  shape.resume = o.resume;
  return shape;
}

Result<plan::RunFit> FitRunDir(const std::string& run_dir, plan::RunShape* shape_out = nullptr) {
  ECHELON_ASSIGN_OR_RETURN(const plan::RunShape shape, ReadRunShape(run_dir));
  if (shape_out != nullptr) *shape_out = shape;
  return plan::FitRun(run_dir, shape);
}

struct PlanArgs {
  std::string config;
  std::string from_run;
  std::string config_keys;
  bool json = false;
  bool simulate = false;  // with --from-run: the simulator's prediction of the run
  uint64_t seed = 1;
  std::string learner_memory;  // a model's config.json, or its directory
  std::string prices = "data/prices.yaml";
  // Reasoning lengths: the DAPO recipes' 4k-20k responses and Qwen3's 32k context.
  std::vector<int64_t> micro_batch_tokens = {4096, 10240, 20480, 32768};
  int64_t staleness = 2;         // the verifier's window (rl.staleness)
  int64_t verify_memory_mb = 0;  // rollout.verify_memory_mb; -1: every snapshot in RAM
  // --measure: the real learner's phases on random weights (learn/learner_memory_probe.h).
  bool measure = false;
  int64_t ranks = 1;
  std::string shard = "none";
  std::string precision = "fp32";
  int64_t tokens = 1024;
  int64_t lora = 0;
  bool checkpointing = false;
  int64_t updates = 2;
  std::string out;  // where the checkpoint and the ranks' logs go (default: a temporary directory)
};

// LoRA adapters of `rank` (alpha 2 x rank) on every projection of `c` that takes one (a model whose
// every layer is a mixture of experts: attention only).
model::LoraConfig EveryProjection(const model::ModelConfig& c, int64_t rank) {
  model::ModelConfig adapted = c;
  adapted.lora = {rank, 2.0 * static_cast<double>(rank), model::kLoraTargets};
  if (!adapted.Validate().ok()) adapted.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  return adapted.lora;
}

// `--learner-memory MODEL --measure`: every rank's measured peak per phase beside the estimate.
int RunMeasuredLearnerMemory(const PlanArgs& args, const model::ModelConfig& c, const std::string& path) {
  learn::MemoryProbeOptions o;
  Result<learn::Shard> shard = learn::ParseShard(args.shard);
  Result<learn::Precision> precision = learn::ParsePrecision(args.precision);
  if (!shard.ok() || !precision.ok()) {
    spdlog::error("plan --measure: {}", (shard.ok() ? precision.status() : shard.status()).message());
    return 2;
  }
  o.setup.ranks = args.ranks;
  o.setup.shard = shard.value();
  o.setup.precision = precision.value();
  o.setup.micro_batch_tokens = args.tokens;
  o.setup.activation_checkpointing = args.checkpointing || (o.setup.shard == learn::Shard::kParams && args.ranks > 1);
  if (args.lora > 0) {
    o.setup.lora = EveryProjection(c, args.lora);
  }
  o.updates = args.updates;
  std::error_code ec;
  const bool temporary = args.out.empty();
  o.dir = temporary ? (std::filesystem::temp_directory_path() / ("echelon-memory-" + std::to_string(::getpid()))).string()
                    : args.out;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) {
    spdlog::error("plan --measure: cannot create {}: {}", o.dir, ec.message());
    return 2;
  }
  std::unique_ptr<ProcessGroup> workers;
  o.start_workers = [&](int port, int world) -> Status {
    workers = std::make_unique<ProcessGroup>(/*max_restarts=*/0);
    return StartLocalRanks(workers.get(), world, port, 600, o.dir);
  };
  o.wait_workers = [&] {
    if (workers && !workers->WaitAll(120)) spdlog::warn("plan --measure: a learner rank did not exit; stopped it");
    workers.reset();
  };
  std::printf("%s: %.1fM parameters; measured on this machine's CPU: %lld rank(s), shard %s, %s, %smicro-batches of one "
              "%lld-token sequence, two per rank, %lld updates; MiB of resident set (VmHWM), each phase's peak read and started "
              "over; estimate: learn/learner_memory.h EstimateHostPeak\n",
              path.c_str(), c.NumParameters() / 1e6, static_cast<long long>(args.ranks), args.shard.c_str(),
              args.precision.c_str(), args.lora > 0 ? ("LoRA rank " + std::to_string(args.lora) + ", ").c_str() : "",
              static_cast<long long>(args.tokens), static_cast<long long>(args.updates));
  std::fflush(stdout);
  Result<std::vector<learn::PhaseMemory>> phases = learn::MeasureLearnerMemory(c, o, std::cerr);
  o.wait_workers();
  if (temporary) std::filesystem::remove_all(o.dir, ec);
  if (!phases.ok()) {
    spdlog::error("plan --measure: {}{}", phases.status().message(),
                  temporary ? "" : " (the ranks' logs are in " + o.dir + ")");
    return 1;
  }
  std::cout << learn::MeasuredMemoryTable(phases.value(), c, o.setup);
  return 0;
}

// `--learner-memory MODEL`: the learner's bytes per rank for set-ups of ranks, shard mode and
// checkpointing, and which GPUs of the catalogue they fit (learn/learner_memory.h).
int RunLearnerMemory(const PlanArgs& args) {
  std::string path = args.learner_memory;
  if (std::filesystem::is_directory(path)) path += "/config.json";
  Result<nlohmann::json> j = ReadJsonFile(path);
  Result<model::ModelConfig> config =
      j.ok() ? model::ModelConfig::FromJson(j.value(), path) : Result<model::ModelConfig>(j.status());
  if (!config.ok()) {
    spdlog::error("plan --learner-memory: {}", config.status().message());
    return 2;
  }
  if (args.measure) return RunMeasuredLearnerMemory(args, config.value(), path);
  Result<plan::PriceCatalog> prices = plan::LoadPriceCatalog(args.prices);
  if (!prices.ok()) {
    spdlog::error("plan --learner-memory: {} (--prices names the GPU catalogue)", prices.status().message());
    return 2;
  }
  std::vector<std::pair<std::string, double>> gpus;
  for (const plan::GpuSpec& g : prices->gpus())
    if (g.name.find("community") == std::string::npos) gpus.emplace_back(g.name, g.memory_gb);
  std::vector<learn::LearnerSetup> setups;
  // LoRA (learner.lora) of rank 16 on every projection that takes one (a model whose every
  // layer is sparse: attention only), the base frozen in bf16, one rank.
  const model::ModelConfig& c = config.value();
  const model::LoraConfig lora16 = EveryProjection(c, 16);
  const auto add = [&](int64_t ranks, learn::Shard shard, bool checkpointing, bool lora) {
    for (int64_t tokens : args.micro_batch_tokens) {
      learn::LearnerSetup s;
      s.ranks = ranks;
      s.shard = shard;
      s.activation_checkpointing = checkpointing;
      s.micro_batch_tokens = tokens;
      if (lora) s.lora = lora16;
      setups.push_back(s);
    }
  };
  add(1, learn::Shard::kNone, false, false);
  add(1, learn::Shard::kNone, true, false);
  for (int64_t ranks : {2, 4, 8}) {
    add(ranks, learn::Shard::kOptimizer, true, false);
    add(ranks, learn::Shard::kParams, true, false);
  }
  for (bool checkpointing : {false, true}) add(1, learn::Shard::kNone, checkpointing, true);
  std::printf("%s: %.2fB parameters (%lld layers), bf16 compute, fp32 master weights, gradients and AdamW; "
              "tokens: of one forward/backward (one sequence of that length, or several packed); GiB per rank; "
              "a GPU fits when the total is within 90%% of its memory\n",
              path.c_str(), c.NumParameters() / 1e9, static_cast<long long>(c.num_hidden_layers));
  std::cout << learn::LearnerMemoryTable(c, setups, gpus);
  std::cout << "weights, grads, adamw: held between updates (as Learner keeps them); gathered: the most one rank "
               "holds gathered at once under shard params; activ.: an estimate of one micro-batch's; lora: the "
               "rank of adapters (learner.lora) on every projection that takes one, the base frozen\n";
  std::cout << learn::VerifierMemoryLine(c, args.staleness,
                                         args.verify_memory_mb < 0 ? -1.0 : args.verify_memory_mb * 1048576.0);
  return 0;
}

int RunPlan(const PlanArgs& args) {
  if (!args.learner_memory.empty()) return RunLearnerMemory(args);
  if (!args.config_keys.empty()) {
    const plan::KeyTable& keys = plan::PlanConfigKeys();
    std::cout << (args.config_keys == "markdown" ? keys.Markdown() : keys.Describe());
    return 0;
  }
  if (args.config.empty() && args.from_run.empty()) {
    spdlog::error("plan needs a CONFIG (configs/plan*.yaml), --from-run RUN_DIR or --learner-memory MODEL");
    return 2;
  }
  std::optional<plan::RunFit> fit;
  std::optional<nlohmann::json> simulated;
  if (args.simulate && args.from_run.empty()) {
    spdlog::error("plan --simulate needs --from-run RUN_DIR");
    return 2;
  }
  if (!args.from_run.empty()) {
    plan::RunShape shape;
    Result<plan::RunFit> f = FitRunDir(args.from_run, &shape);
    if (!f.ok()) {
      spdlog::error("--from-run {}", f.status().message());
      return 2;
    }
    fit = std::move(f).value();
    std::cout << plan::RunFitTable(*fit);
    if (args.simulate) {
      Result<nlohmann::json> s = plan::SimulateRun(*fit, {shape.dispatch, shape.resume, args.seed, 0.1});
      if (!s.ok()) {
        spdlog::error("--from-run {} --simulate: {}", args.from_run, s.status().message());
        return 2;
      }
      simulated = std::move(s).value();
      std::printf("simulated (%s dispatch, seed %llu): wasted %.2f%% of generated tokens (stale %.2f%%, preempted %.2f%%), "
                  "%llu groups dropped stale, learner utilisation %.3f; measured: wasted %.2f%%, %lld dropped, %.3f\n",
                  shape.dispatch.c_str(), static_cast<unsigned long long>(args.seed),
                  100 * (*simulated)["wasted_fraction"].get<double>(), 100 * (*simulated)["stale_fraction"].get<double>(),
                  100 * (*simulated)["preempted_fraction"].get<double>(),
                  static_cast<unsigned long long>((*simulated)["groups_dropped_stale"].get<uint64_t>()),
                  (*simulated)["utilization"].get<double>(), 100 * fit->wasted_fraction(),
                  static_cast<long long>(fit->groups_dropped_stale), fit->measured_utilization);
    }
  }
  if (args.config.empty()) {
    if (args.json) {
      nlohmann::json j = plan::RunFitJson(*fit);
      if (simulated) j["simulated"] = *simulated;
      std::cout << nlohmann::json{{"from_run", j}}.dump() << std::endl;
    }
    return 0;
  }
  Result<plan::PlanConfig> config = plan::LoadPlanConfig(args.config);
  if (!config.ok()) {
    spdlog::error("{}", config.status().message());
    return 2;
  }
  std::vector<std::string> fit_notes;
  if (fit) {
    Status st = plan::ApplyRunFit(*fit, &config.value(), &fit_notes);
    if (!st.ok()) {
      spdlog::error("{}", st.message());
      return 2;
    }
    std::cout << "\n";
  }
  Result<plan::Plan> p = plan::MakePlan(config.value());
  if (!p.ok()) {
    spdlog::error("{}", p.status().message());
    return 2;
  }
  p->notes.insert(p->notes.begin(), fit_notes.begin(), fit_notes.end());
  std::cout << plan::PlanTable(p.value());
  if (args.json) {
    nlohmann::json j = plan::PlanJson(p.value());
    if (fit) j["from_run"] = plan::RunFitJson(*fit);
    std::cout << j.dump() << std::endl;
  }
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "choose the cheapest rollout workers for a run and predict its utilisation and cost");
  cmd->add_option("config", args->config, "plan config (configs/plan*.yaml); optional with --from-run");
  cmd->add_option("--from-run", args->from_run,
                  "fit the model to a run directory (echelon train/learner --out): measured step time and actor "
                  "throughput; prints its predicted vs measured learner utilisation");
  cmd->add_flag("--json", args->json, "also print the plan as one JSON object on the last line");
  cmd->add_flag("--simulate", args->simulate,
                "with --from-run: simulate the fitted run (its actors at their measured rates, its dispatch rule) and "
                "print the tokens it predicts wasted beside those measured");
  cmd->add_option("--seed", args->seed, "with --simulate: the simulation's seed (default 1)");
  cmd->add_option("--learner-memory", args->learner_memory,
                  "print the learner's memory per rank for a model (its config.json or directory; "
                  "data/models/ has Qwen3-30B-A3B, 8B, 4B) by ranks and shard mode, and which GPUs it fits");
  cmd->add_option("--prices", args->prices, "with --learner-memory: the GPU catalogue (default data/prices.yaml)");
  cmd->add_option("--micro-batch-tokens", args->micro_batch_tokens,
                  "with --learner-memory: tokens of one forward/backward, a comma list (default 4096,10240,20480,32768)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--staleness", args->staleness,
                  "with --learner-memory: rl.staleness, the snapshots the behaviour verifier keeps (default 2)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--verify-memory-mb", args->verify_memory_mb,
                  "with --learner-memory: rollout.verify_memory_mb, older snapshots the verifier keeps in RAM "
                  "(default 0; -1: all of them)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 30));
  cmd->add_flag("--measure", args->measure,
                "with --learner-memory: run the learner on random weights of the model (set-up, updates, a "
                "publication, a checkpoint save and a resume, ranks as local processes) and print every rank's "
                "measured peak resident set per phase beside the estimate");
  cmd->add_option("--ranks", args->ranks, "with --measure: learner ranks (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--shard", args->shard, "with --measure: learner.shard (none, optimizer, params; default none)");
  cmd->add_option("--precision", args->precision, "with --measure: learner.precision (fp32, bf16; default fp32)");
  cmd->add_option("--tokens", args->tokens, "with --measure: tokens of one sequence, each micro-batch's (two per rank and update; default 1024)")
      ->check(CLI::Range(int64_t{32}, int64_t{1} << 24));
  cmd->add_option("--lora", args->lora, "with --measure: LoRA rank on every projection that takes one (default 0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  cmd->add_flag("--activation-checkpointing", args->checkpointing,
                "with --measure: learner.activation_checkpointing (implied by --shard params over several ranks)");
  cmd->add_option("--updates", args->updates, "with --measure: updates before the publication (default 2)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--out", args->out,
                  "with --measure: directory for the checkpoint and the ranks' logs (default: a temporary one, removed)");
  cmd->add_option("--config-keys", args->config_keys, "print the config's keys as text or markdown, and exit")
      ->check(CLI::IsMember({"text", "markdown"}));
  cmd->footer("Config keys:\n" + plan::PlanConfigKeys().Describe());
  cmd->callback([args, exit_code] { *exit_code = RunPlan(*args); });
}

}  // namespace echelon::cli
