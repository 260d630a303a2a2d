// Resumable run checkpoints: `checkpoints/step-N/` holds the model checkpoint (config.json,
// model.safetensors, tokenizer.json, so `echelon eval` reads it) plus everything the run
// depends on to continue exactly:
//   optimizer.safetensors   AdamW state per parameter (Learner::OptimizerState)
//   master_weights.safetensors  the fp32 master weights, when model.safetensors is stored in a
//                           narrower dtype (a bf16 model): resume continues from them exactly
//   trainer_state.json      RunState below: version, dispatcher state, counters, metrics
//                           offset, the process RNG state, wall-clock offsets
//   checksums.json          size and SHA-256 of every file (model/checkpoint.h)
// The directory is written to a temporary name, fsync'd and renamed, so it is whole or absent.
// Resume takes the newest step-N whose checksums verify; a corrupt one is named and skipped.
//
//   ECHELON_RETURN_IF_ERROR(SaveRunCheckpoint(ckpt_dir, learner, vocab, state));
//   ECHELON_ASSIGN_OR_RETURN(ResumePoint p, LoadNewestRunCheckpoint(ckpt_dir, &skipped));
//
// Thread contract: free functions; the learner must not step while a checkpoint is written.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/learn/learner.h"
#include "echelon/learn/learner_ranks.h"
#include "echelon/model/checkpoint.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::learn {

// Everything besides weights and optimizer state that a resumed run needs.
struct RunState {
  int64_t version = 0;            // learner updates done (the policy version)
  double wall_seconds = 0;        // run time at the checkpoint (wall_s continues from here)
  double rl_wall_seconds = 0;     // of which in the RL loop
  double busy_seconds = 0;        // learner time spent in updates
  int64_t consumed_tokens = 0;
  uint64_t metrics_bytes = 0;     // metrics.jsonl length when the checkpoint was taken
  uint64_t samples_bytes = 0;     // samples.jsonl's (absent in checkpoints of older releases: 0)
  double warmstart_accuracy = 0;  // for the final summary
  int64_t heldout_n = 0;
  int64_t resumes = 0;            // how many times the run had been resumed
  sched::DispatcherState dispatcher;
  std::map<std::string, int64_t> refusals;
  int64_t accepted_tokens = 0;
  std::map<std::string, int64_t> actor_groups;
  std::map<std::string, int64_t> actor_forged;  // absent in checkpoints of older releases: empty
  std::string rng_state_hex;      // the process's default CPU generator
  nlohmann::json staleness_control;  // sched::StalenessControl::Export (null: a fixed S)
};

nlohmann::json RunStateToJson(const RunState& s);
// Errors name `where` and the missing or malformed field.
Result<RunState> RunStateFromJson(const nlohmann::json& j, const std::string& where);

// The default CPU generator's state, hex encoded, and back.
std::string CaptureRngState();
Status RestoreRngState(const std::string& hex);

// Writes checkpoints/step-<state.version>; then keeps the newest `keep` step-N checkpoints
// (older ones and leftovers of interrupted writes are deleted). `gathered`: files already
// gathered from several ranks (GatherCheckpointFiles: written ones are moved in, or removed on
// failure); the learner gives the rest. A learner with sharded parameters needs its weights
// among them.
Status SaveRunCheckpoint(const std::string& ckpt_dir, learn::Learner& learner, const model::Vocabulary& vocab,
                         const RunState& state, int64_t keep, model::CheckpointFiles gathered = {});
// Where a file gathered from the ranks is written before it joins a checkpoint (a temporary of
// this process: a crashed save's is removed by the next).
std::string GatheredPath(const std::string& ckpt_dir, const std::string& file);
// The files of a checkpoint that several ranks gather, each written under `ckpt_dir` as it is
// gathered: the AdamW state and, with sharded parameters, the weights (model.safetensors in
// the storage dtype, and the fp32 master where that differs). Every worker takes part.
Result<model::CheckpointFiles> GatherCheckpointFiles(LearnerRanks& ranks, Learner& learner, const std::string& ckpt_dir);

struct ResumePoint {
  std::string dir;
  RunState state;
  model::LoadedCheckpoint checkpoint;
  std::map<std::string, at::Tensor> optimizer;
};

// The newest whole step-N under `ckpt_dir`. Each skipped one (unfinished, corrupt,
// unreadable) is appended to `skipped` as "<dir>: <why>". NotFound when none is whole.
// `mapped`: the weights and AdamW state are views of the files mapped, not read
// (model/safetensors.h MapSafetensors): for rank 0 of sharded parameters, which only cuts
// them, unit by unit, and releases each unit's pages (the checkpoint is never resident whole).
Result<ResumePoint> LoadNewestRunCheckpoint(const std::string& ckpt_dir, std::vector<std::string>* skipped,
                                            bool mapped = false);

}  // namespace echelon::learn
