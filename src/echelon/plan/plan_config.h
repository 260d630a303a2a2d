// PlanConfig: the input of `echelon plan` and `echelon simulate` (configs/plan*.yaml,
// configs/simulate*.yaml): model, rollout demand, learner and baseline hardware, the
// broadcast links, and the catalogue of workers that may be activated. Loading is strict:
// an unknown key, a wrong type, a value out of range or an unknown GPU name is one error
// naming file:line and the key. Relative paths (`prices:`) resolve against the config's
// directory.
//
//   ECHELON_ASSIGN_OR_RETURN(PlanConfig cfg, LoadPlanConfig("configs/plan-qwen3-8b.yaml"));
//
// The reader is also the key table: PlanConfigKeys() runs it in describe mode over the
// default structs (yaml_reader.h), for `echelon plan --help` and docs/CAPACITY.md.
//
// Thread contract: a value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/plan/link_model.h"
#include "echelon/plan/price_catalog.h"
#include "echelon/plan/throughput_model.h"
#include "echelon/plan/yaml_reader.h"

namespace echelon::plan {

struct WorkerOfferConfig {
  std::string name;
  std::string gpu;
  int64_t available = 0;
  double price_per_hour = -1;     // -1: the catalogue's price
  double tokens_per_second = 0;   // 0: derived from the GPU spec (throughput_model.h)
  int64_t concurrent_groups = 0;  // with tokens_per_second: groups decoded at once
  double downlink_mbps = 1000;
  double uplink_mbps = 500;
  double failures_per_hour = 0;  // of one GPU; a pipeline fails when any of its stages does
  // Warning a preempted worker gets first (a spot instance's notice): its actors stop, report
  // their groups' prefixes and hand their leases back (rollout/actor.h); 0: none.
  double preemption_notice_seconds = 0;
  // A pipeline of `pipeline` GPUs of this kind holding the layers in turn (throughput_model.h);
  // price, links and failures are per GPU unless price_per_hour is given (then per pipeline).
  int64_t pipeline = 1;
  double link_latency_ms = 0;  // between consecutive stages
  // `echelon plan CONFIG --from-run RUN`: the run's actors (names as in metrics.jsonl) whose
  // measured throughput this class takes; empty: none (or all, when the config has one class).
  std::vector<std::string> run_actors = {};
  std::string run_actors_where = {};  // file:line, for errors
};

// simulate.price_changes[]: from the end of learner update `at_step` on, every worker class
// on `gpu` costs `price_per_hour`; the simulator re-runs activation then.
struct PriceChange {
  int64_t at_step = 0;
  std::string gpu;
  double price_per_hour = 0;
};

struct SimulateConfig {
  uint64_t seed = 1;
  double throughput_cv = 0.1;      // per-group lognormal spread of generation time
  double restart_seconds = 600;    // a failed (preempted) worker is back after this
  double startup_seconds = 60;     // a newly activated worker boots before downloading
  double detect_seconds = 30;      // heartbeat timeout: its groups are re-issued after this
  double lease_seconds = 3600;     // dispatcher lease (longer than any group)
  int64_t workers = 0;             // 0: the plan's activation; N: run exactly N, no re-activation
  int64_t warmup_steps = -1;       // steps left out of steady-state figures (-1: 20% of steps)
  bool reactivate = true;          // re-run activation when workers fail or return (or prices change)
  std::vector<PriceChange> price_changes;  // by at_step
  // Which group goes to which worker: "fifo" (in order) or "deadline" (sched/dispatcher.h,
  // deadline-aware dispatch), as the learner's rollout.dispatch.
  std::string dispatch = "fifo";
  // Resumable groups, as the learner's rollout.resume: a failed worker's groups continue from
  // what it reported (every sched::kPrefixSeconds) while within the staleness bound.
  bool resume = true;
  // Response lengths: with length_sigma > 0 each prompt's completions average a length drawn
  // once from a lognormal of mean shape.completion_tokens and this sigma, at most
  // length_max_tokens; 0: every group shape.completion_tokens, as before.
  double length_sigma = 0;
  double length_max_tokens = 0;  // 0: 10 x shape.completion_tokens
  int64_t prompts = 0;           // dataset rows: group g is prompt g mod prompts (0: each group new)
};

struct PlanConfig {
  std::string path;
  PriceCatalog prices;
  std::string model_name;
  ModelProfile model;
  RolloutShape shape;
  int64_t groups_per_step = 32;
  int64_t steps = 1000;
  // learner
  std::string learner_gpu = "h200";
  int64_t learner_count = 4;
  double learner_step_seconds = 0;   // 0: derived from FLOPs
  double learner_overhead_seconds = 0;  // per update, outside training (publish, metrics, evaluation)
  double learner_mfu = 0.35;
  double learner_price_per_hour = -1;  // per GPU; -1: catalogue
  // centralised baseline
  std::string baseline_gpu = "a100";
  int64_t baseline_count = 8;
  double baseline_step_seconds = 0;      // training part; 0: derived
  double baseline_generate_seconds = 0;  // rollout part; 0: derived
  double baseline_mfu = 0.35;
  double baseline_price_per_hour = -1;
  // staleness and snapshots: -1 / 0 ask the planner to recommend
  int64_t max_staleness = -1;
  int64_t publish_period = 0;
  double target_utilization = 0.95;
  int64_t staleness_cap = 6;  // the published range where reward matches synchronous training
  LinkSpec link;
  std::vector<WorkerOfferConfig> workers;
  SimulateConfig sim;
};

Result<PlanConfig> LoadPlanConfig(const std::string& path);

// Every key LoadPlanConfig reads, with its type, default, range, help and readers: the
// reader run in describe mode. An error means a default fails a check of the reader.
Status DescribePlanConfig(KeyTable* table);
// DescribePlanConfig's table, built once.
const KeyTable& PlanConfigKeys();

}  // namespace echelon::plan
