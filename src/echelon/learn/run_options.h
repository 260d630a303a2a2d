// RunOptions: everything a training run is configured with, typed. cli/train_config.h reads
// them from YAML (the schema with every key, its default and why); the learning plane
// (learn/learner_run.h) and the run spec handed to actors consume them. A run's defaults are
// the schema's alone (docs/CONFIG.md): the members here start at zero, and the nested
// option structs keep their own library defaults until the reader sets every member.
//
// Thread contract: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "echelon/data/adapter.h"
#include "echelon/common/run_secret.h"
#include "echelon/learn/behaviour_verifier.h"
#include "echelon/learn/learner.h"
#include "echelon/learn/warmstart.h"
#include "echelon/model/generate.h"
#include "echelon/model/model_config.h"
#include "echelon/sched/staleness_control.h"

namespace echelon::learn {

struct RunOptions {
  uint64_t seed = 0;
  // secret: seed. The run's secret (common/run_secret.h) is derived from the seed, not drawn
  // from the OS and kept in the run directory (learn/run_checkpoint.h RunSecretFor).
  bool secret_from_seed = false;
  std::string task_name;
  data::AdapterOptions task_options;
  std::string model_init;    // model directory to start from; empty: a new character model
  model::ModelConfig model;  // the new character model's shape (vocab_size from the task's alphabet)
  WarmstartOptions warmstart;
  LearnerOptions learner;
  // learner.lora: adapters trained over the frozen model the run starts RL from (after the
  // warm-start); snapshots then carry the adapters alone (rank 0: off).
  model::LoraConfig lora;
  int64_t steps = 0;
  int64_t groups_per_step = 0;  // B
  int64_t group_size = 0;       // G
  int64_t staleness = 0;        // S (with staleness_control: its starting S)
  std::optional<sched::StalenessControlOptions> staleness_control;  // rl.staleness: auto
  int64_t publish_period = 0;   // kappa
  int64_t actors = 0;
  bool thread_actors = false;  // `echelon train` runs its actors as threads, not processes
  double temperature = 0;
  double top_p = 0;
  int64_t top_k = 0;     // 0: off
  bool partial = false;  // rollout.partial: generations move to newer snapshots midway (rollout::ActorOptions)
  // rl.dynamic_sampling: groups without a reward spread are dropped and more prompts drawn
  // (learn/batch_collector.h), up to dynamic_sampling_max x groups_per_step per update.
  bool dynamic_sampling = false;
  int64_t dynamic_sampling_max = 8;
  double min_p = 0;    // 0: off
  int64_t max_new_tokens = 0;
  int64_t slots = 0;  // the builtin engine's sequence slots (model::SamplingParams::slots; 0: every row)
  bool chat = false;  // prompts as chat turns (Vocabulary::WithChat)
  bool enable_thinking = false;  // with chat: the template's thinking mode (Qwen3's enable_thinking)
  double lease_seconds = 0;
  int64_t max_leases_per_worker = 0;
  std::string dispatch = "fifo";   // "fifo" or "deadline" (sched/dispatcher.h: deadline-aware dispatch)
  bool resume = true;              // resumable groups (learn/trajectory_intake.h)
  bool untrusted_workers = false;  // `echelon learner` takes only per-worker tokens (cli/launch.cc)
  double stall_timeout_seconds = 0;
  double verify_fraction = 0;    // of groups whose behaviour log-probs are recomputed (learn/behaviour_verifier.h)
  double verify_tolerance = 0;  // largest mean log-prob difference a checked group may have
  // Router replay (learner.router_replay on): actors record the routes whose top-k margin is
  // below this (model::SamplingParams::route_margin).
  double router_replay_margin = 0.1;  // nats of router logit
  bool verify_draws = true;      // checked groups' tokens must be the seeded draws (learn/behaviour_verifier.h)
  double verify_draw_tolerance = 0;  // probability mass a token may miss its draw by (near-ties)
  double verify_token_tolerance = 0;  // largest |recomputed - claimed| log-prob of any one token
  int64_t verify_memory_mb = 0;  // snapshots besides the newest the verifier keeps in RAM; the rest on disk
  std::vector<double> actor_slowdowns;  // per actor, 1 = full speed
  int64_t eval_every = 0;
  // The learner's own greedy held-out evaluation (after the warm-start, every eval_every versions,
  // at the end); false: none, and the learner never builds an evaluation copy (eval.sets measure).
  bool eval_heldout = true;
  // Evaluation as work (eval.sets; learn/eval_rounds.h): each set's file, read by the task's
  // adapter as its held-out file, k samples a prompt at `temperature`, on actors every
  // eval_every versions.
  struct EvalSetOptions {
    std::string name;
    std::string file;
    int64_t k = 4;
    double temperature = 1.0;
  };
  std::vector<EvalSetOptions> eval_sets;
  // Known-answer canary prompts mixed into training work (eval.canaries; learn/trajectory_intake.h
  // SetCanaries): their file ("" : none) and the share of new groups that are canaries.
  std::string canary_file;
  double canary_share = 0;
  int64_t checkpoint_every = 0;
  int64_t checkpoint_keep = 0;
  double checkpoint_shard_mb = 0;  // checkpoints/final's weight files hold at most this many MB (10^6 bytes)
  bool snapshot_broadcast = false;  // remote actors get snapshots by peer-assisted broadcast
  int64_t wait_for_actors = 0;     // remote actors registered before the first update
  int64_t learner_ranks = 0;       // data-parallel learner ranks started on this host (rank 0 is this process)
  double rank_timeout_seconds = 0;  // one collective of the ranks (learn/rank_group.h)
};

// The sampling parameters of the run's actors (stop ids come from the vocabulary).
model::SamplingParams RolloutSampling(const RunOptions& options);

// The behaviour verifier's options (learn/behaviour_verifier.h) of a run whose secret is
// `secret`; `task_draws`: the task samples a group with its seed (TaskAdapter::SamplesWithGroupSeed);
// `spill_dir`: where its older snapshots go (VerifyOptions::spill_dir; empty: RAM).
VerifyOptions VerifierOptions(const RunOptions& options, const RunSecret& secret, bool task_draws,
                              const std::string& spill_dir = "");

// The largest S the run can use: rl.staleness, or rl.staleness: auto's ceiling. A group older
// than this never enters an update; the verifier keeps the snapshots of that many versions.
int64_t LargestStaleness(const RunOptions& options);

}  // namespace echelon::learn
