// Generation by a pipeline of stages, each holding a contiguous range of the model's layers
// (Qwen3Model with a LayerRange) and its own KV cache for them.
//
//   Stage 2 (last) --+          StageServer s2(model_2_3, nullptr);
//   Stage 1 ---------+--> s1    StageServer s1(model_1_2, &s2);
//   Stage 0 (embeds, samples):  PipelineGenerate(model_0_1, s1, prompts, params, /*micro_batches=*/2);
//
// How the stages stay in step: every stage runs the same engine (generate.h) over the same
// prompts and parameters; the first samples, the others replay its draws (Replay). The engine's
// decisions (admissions, shared prefills, retirements) depend on the draws only, so every stage
// calls Forward in the same order with the same batch shapes, and a stage's layers compute
// exactly what they compute in the whole model. The first stage sends its last layer's output
// down the chain with the previous step's draws; each stage applies its layers and passes on;
// the last stage's output comes back up the chain to the first, whose head makes the logits.
// A prefill that wants no logits sends nothing back.
//
// Micro-batches: the rows are split into `micro_batches` lanes of consecutive rows, each an
// engine of its own on every stage (the same weights), so while one lane's step is on stage 2
// another's is on stage 0. Row r draws from its own random stream whatever lane it is in
// (SamplingParams::first_row): the tokens are the whole model's up to the float rounding of the
// batched arithmetic over a different set of rows (none with one lane).
//
// Thread contract: a StageServer takes calls from any thread, for different lanes at once; the
// calls of one lane come in order (Open, Forward..., Close). PipelineGenerate runs one thread
// per lane and waits for them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/model/generate.h"
#include "echelon/model/qwen3.h"

namespace echelon::model {

// What one stage sends the next for one lane.
struct StageMessage {
  // The draws of the step before this message (has_draws), for the rows in that order.
  bool has_draws = false;
  std::vector<int64_t> rows, tokens;
  at::Tensor hidden;   // [B, T, hidden] the sender's last layer's output; undefined in a close
  bool need = false;   // the first stage wants the last stage's output back
  bool stopped = false;  // close: generation stopped early (on_step returned false)
};

// A lane's rows and how they are decoded.
struct LaneSpec {
  std::vector<std::vector<int64_t>> prompts;
  SamplingParams params;  // first_row set to the lane's first row
  // The snapshot version every stage must hold (the first stage's); -1: any (stages that never
  // change weights, as `echelon stage`).
  int64_t version = -1;
};

// The rest of the pipeline, as a stage sees it: in this process (StageServer) or over the
// network.
class NextStage {
 public:
  virtual ~NextStage() = default;
  // Starts a lane on this stage and every later one.
  virtual Status Open(uint64_t lane, const LaneSpec& spec) = 0;
  // Passes one Forward's message on; returns the last stage's output when m.need, else an
  // undefined tensor.
  virtual Result<at::Tensor> Forward(uint64_t lane, StageMessage m) = 0;
  // Ends a lane with its last draws (m.hidden undefined); returns when every later stage is done
  // with it.
  virtual Status Close(uint64_t lane, StageMessage m) = 0;
};

// A stage after the first: its layers, a replaying engine per open lane, and the stage after it
// (nullptr for the last).
class StageServer : public NextStage {
 public:
  // `model` holds this stage's layers (or is null until SetModel); lanes run on copies sharing
  // its weights. `next` must outlive this. A lane that has had no message for lane_idle_seconds
  // and no call waiting on it (its first stage went away) is closed when the next lane opens, so
  // lost lanes neither pile up to the lane limit nor keep their caches.
  StageServer(Qwen3Model model, NextStage* next, double lane_idle_seconds = 300);
  ~StageServer() override;

  // New weights (a new model object, never the one in use: open lanes keep decoding on theirs)
  // for lanes that name `version`. The newest kKeptVersions are held, so a first stage one
  // snapshot behind its stages still runs. A lane that names a version not held is refused,
  // so every stage of a lane computes with one snapshot: Unavailable when it is newer than
  // this stage's (try again: the stage is fetching it), Aborted when older (the first stage
  // must move to a newer snapshot). A lane that names none (-1) takes the newest.
  static constexpr size_t kKeptVersions = 2;
  void SetModel(Qwen3Model model, int64_t version);
  // The newest version held (-1: none, or only unversioned weights).
  int64_t version() const;
  // The newest version a lane has asked for (-1: none): one this stage should fetch now.
  int64_t wanted() const;

  Status Open(uint64_t lane, const LaneSpec& spec) override;
  Result<at::Tensor> Forward(uint64_t lane, StageMessage m) override;
  Status Close(uint64_t lane, StageMessage m) override;

  int64_t open_lanes() const;

 private:
  class Lane;
  std::shared_ptr<Lane> Find(uint64_t lane) const;

  NextStage* const next_;
  const double lane_idle_seconds_;
  mutable std::mutex mu_;  // guards models_, lanes_
  std::map<int64_t, Qwen3Model> models_;  // by version
  int64_t wanted_ = -1;
  std::map<uint64_t, std::shared_ptr<Lane>> lanes_;
};

// Runs Generate over a pipeline whose first stage is `first` (layers [0, k) with the embedding
// and head) and whose later stages are behind `next`, in `micro_batches` lanes (clamped to
// [1, rows]). on_step is called from the lane threads, one at a time, with the rows numbered
// as in `prompts`. Fails with the first error of any stage; every lane is closed either way.
// `version` >= 0: every later stage must hold that snapshot (LaneSpec::version).
Result<std::vector<Completion>> PipelineGenerate(Qwen3Model& first, NextStage& next,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const SamplingParams& params, int64_t micro_batches,
                                                 const StepCallback& on_step = {}, int64_t version = -1);

// Lane ids unique within this process (a stage may serve several pipelines' lanes).
uint64_t NewLaneId();

// A snapshot cut to one stage's layers (what a pipeline member receives): the range its
// tensors name, and that range's model, loaded and in eval mode. Errors name `where`.
struct StageSnapshot {
  Qwen3Model model{nullptr};
  LayerRange layers;
};
Result<StageSnapshot> LoadStageSnapshot(const ModelConfig& config, const std::string& safetensors_bytes,
                                        const std::string& where);

}  // namespace echelon::model
