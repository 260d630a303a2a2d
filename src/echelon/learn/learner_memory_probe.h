// Measured learner memory: the real learner (learn/learner.h, learn/learner_ranks.h) on random
// weights of a model's config goes through the phases of a run (set-up, a few updates, a
// publication, a checkpoint save, a resume from that checkpoint) and every rank's peak resident
// set (VmHWM) is read after each phase and started over (learn/learner_ranks.h
// ExchangeRankMemory). Each figure stands beside the host memory model's estimate
// (learn/learner_memory.h EstimateHostMemory) for that rank and phase.
// `echelon plan --learner-memory MODEL --measure` prints the table.
//
//   MemoryProbeOptions o;  o.setup.ranks = 2;  o.setup.shard = Shard::kParams;  o.dir = tmp;
//   o.start_workers = [&](int port, int world) { ...start `echelon learner-rank` processes... };
//   ECHELON_ASSIGN_OR_RETURN(std::vector<PhaseMemory> phases, MeasureLearnerMemory(config, o, std::cerr));
//   std::cout << MeasuredMemoryTable(phases, config, o.setup);
//
// Thread contract: runs on the calling thread; the worker processes are the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/learn/learner_memory.h"
#include "echelon/learn/learner_ranks.h"
#include "echelon/model/model_config.h"

namespace echelon::learn {

struct MemoryProbeOptions {
  // Ranks, precision, shard, checkpointing, LoRA and tokens: every micro-batch is one sequence
  // of micro_batch_tokens tokens, two per rank and update.
  LearnerSetup setup;
  int64_t updates = 2;
  std::string dir;  // the checkpoint is written under DIR/checkpoints
  uint64_t seed = 1;
  // Starts ranks 1..world-1 (`echelon learner-rank --rank R --world W --master 127.0.0.1:PORT`)
  // once rank 0 listens; called twice: at set-up and at the resume.
  std::function<Status(int port, int world)> start_workers;
  // Waits until the workers started last have exited (they leave when rank 0 says stop).
  std::function<void()> wait_workers;
};

struct PhaseMemory {
  std::string phase;                // "set-up", "updates", "publication", "checkpoint save", "resume"
  std::vector<RankMemory> measured;  // per rank
  std::vector<double> estimate_mb;   // per rank: the peak the model expects (runtime included)
};

// Fails with the first error of a phase (a worker that died, a full disk).
Result<std::vector<PhaseMemory>> MeasureLearnerMemory(const model::ModelConfig& config, const MemoryProbeOptions& o,
                                                      std::ostream& progress);

// One row per phase and rank: the rank's runtime resident set, the measured peak, the estimate
// and the estimate's error; then each rank's peak over the whole run, and per rank what its peak
// above the runtime is against one rank's fp32 training state (weights, gradients and AdamW
// state) over N, and whether it reached the whole AdamW state of `model` under `setup`.
std::string MeasuredMemoryTable(const std::vector<PhaseMemory>& phases, const model::ModelConfig& model,
                                const LearnerSetup& setup);

}  // namespace echelon::learn
