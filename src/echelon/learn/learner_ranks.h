// Data-parallel learner ranks: rank 0 is the learner of the run (intake, dispatcher,
// publishing, checkpoints, all in learn/learner_run.h); ranks 1..N-1 are workers that hold the
// same model and optimizer and take part in every update. Rank 0 sends each worker the model,
// the learner options and its state at the start (weights, KL reference, AdamW state; under
// learner.shard: params each unit's in turn, of which a worker keeps its shard, so no worker
// ever holds the whole model), then the groups of every update; every rank computes the gradients of its share of the
// micro-batches, the gradients are summed over the ranks (RankGroup), and every rank applies
// the same step, so their weights stay equal. The state lives whole on rank 0, so a run
// resumes with any number of ranks.
//
//   rank 0:   LearnerRanks ranks(group);  ranks.Setup(learner);  ranks.SendStep(groups);  learner.Step(groups);
//   worker:   RunRankWorker(group, std::cout);   // until rank 0 says stop
//
// Messages are msgpack (nlohmann's binary JSON): {"op": "setup" | "step" | "gather_optimizer" |
// "peak_rss" | "stop", ...}.
// Thread contract: the learner thread of each rank.
#pragma once

#include <memory>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/learn/learner.h"
#include "echelon/learn/rank_group.h"
#include "echelon/model/checkpoint.h"

namespace echelon::learn {

// One rank's host memory, in MiB: its peak resident set (VmHWM) since the previous reading (or
// its start), the resident set after the reading, and the resident set when it became a rank
// (the runtime's own: LibTorch, Gloo, before any model).
struct RankMemory {
  double peak_mb = 0, now_mb = 0, start_mb = 0;
};

// Every rank's RankMemory, rank 0's from this process, gathered in rank order (AllGather); each
// rank then starts its peak over (common/process.h ResetPeakResidentSet), so the next reading
// is the next phase's. Every rank calls it (workers on the "peak_rss" message).
Result<std::vector<RankMemory>> ExchangeRankMemory(RankGroup& group);
// This process's RankMemory without ranks (the peak then starts over too).
RankMemory TakeOwnMemory();

class LearnerRanks {
 public:
  explicit LearnerRanks(std::unique_ptr<RankGroup> group) : group_(std::move(group)) {}
  ~LearnerRanks();
  RankGroup* group() { return group_.get(); }
  int world() const { return group_->world(); }

  // Sends every worker the model config, the options and the state of `learner` (rank 0's,
  // already restored when resuming) with the whole AdamW state (empty: none yet); under
  // Shard::kParams each worker's shards of them, unit by unit (Learner::ShardsFromRankZero),
  // and of the KL reference: `reference` as Restore took it (empty: a fresh run's, the weights).
  // Otherwise the reference is the learner's own copy.
  Status Setup(Learner& learner, const std::map<std::string, at::Tensor>& optimizer_state,
               const std::map<std::string, at::Tensor>& reference = {});
  // The groups of the next update; every rank then runs Learner::Step on them.
  // `lr`: the learning rate of this update (rank 0's, which rl.staleness: auto may move).
  Status SendStep(const std::vector<LearnerGroup>& groups, double lr);
  // The whole AdamW state, also when it is sharded across the ranks (for a checkpoint).
  Result<std::map<std::string, at::Tensor>> GatherOptimizerState(Learner& learner);
  // The AdamW state as a run checkpoint's file (run_checkpoint.h SaveRunCheckpoint): under
  // Shard::kParams written to `path` (run_checkpoint.h GatheredPath) unit by unit as it
  // is gathered, so rank 0 never holds it whole; otherwise from GatherOptimizerState.
  Result<model::CheckpointFile> OptimizerFile(Learner& learner, const std::string& path);
  // Shard::kParams: the weights gathered unit by unit (Learner::WriteWeights; every worker takes
  // part) into a safetensors file of `dtype`: in memory (a snapshot's bytes), or written to
  // `path` as they come (a checkpoint's weights). Rank 0 never holds the whole fp32 weights.
  Result<std::shared_ptr<const std::string>> WeightsBytes(Learner& learner, at::ScalarType dtype,
                                                          const std::map<std::string, std::string>& metadata = {});
  // `units`: only those units [first, end) (a shard of a sharded checkpoint).
  Result<model::CheckpointFile> WeightsFile(Learner& learner, const std::string& path, at::ScalarType dtype,
                                            const std::map<std::string, std::string>& metadata = {},
                                            std::pair<size_t, size_t> units = {0, SIZE_MAX});
  // Shard::kParams: the weights of `dtype` as Hugging Face's sharded files of at most
  // `max_shard_bytes` each (model/checkpoint.h PlanWeightsShards, whole units to a file), each
  // gathered unit by unit into its file beside `ckpt_dir` (run_checkpoint.h GatheredPath) as
  // WeightsFile does, then the index; one model.safetensors when they fit. On a failure the
  // files already written are removed.
  Result<model::CheckpointFiles> WeightsFiles(Learner& learner, const std::string& ckpt_dir, at::ScalarType dtype,
                                              uint64_t max_shard_bytes);
  // Every rank's host memory since the previous call (ExchangeRankMemory).
  Result<std::vector<RankMemory>> TakeRankMemory();
  // Workers leave their loop (best effort: a dead group just ends).
  void Stop();

 private:
  std::unique_ptr<RankGroup> group_;
  bool stopped_ = false;
};

// A worker rank: receives the set-up, then runs every update rank 0 sends, until "stop".
// Returns the first error (rank 0 gone, a failed update).
Status RunRankWorker(RankGroup& group, std::ostream& progress);

// The groups of an update as JSON and back (every field the update reads).
nlohmann::json GroupsToJson(const std::vector<LearnerGroup>& groups);
Result<std::vector<LearnerGroup>> GroupsFromJson(const nlohmann::json& j);

}  // namespace echelon::learn
