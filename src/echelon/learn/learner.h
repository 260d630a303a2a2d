// Learner: one GRPO update per call. Builds the batch from groups of episodes, recomputes the
// policy's log-probs, applies PolicyLoss with the configured off-policy correction, clips the
// gradient norm and steps AdamW. Policy version = number of completed updates.
//
//   Learner learner(model, options);
//   ECHELON_ASSIGN_OR_RETURN(StepStats s, learner.Step(groups));   // version() is now +1
//
// The proximal policy of decoupled PPO is the learner's weights at the start of the update.
// With one optimizer step per update (minibatches = 1) that is pi_theta.detach() from the same
// forward pass, no extra forward is needed, and the ratio against it is 1 (no clipping); with
// several, one no-grad forward gives pi_prox and each minibatch takes an optimizer step.
//
// Thread contract: owned and called by the learner thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "echelon/common/fs.h"
#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/learn/grpo.h"
#include "echelon/model/qwen3.h"

namespace torch::optim {
class AdamW;
}

namespace echelon::learn {

// What the update computes in. kBf16: parameters and activations in bf16, fp32 master weights
// and AdamW state; log-probs, the loss and its reductions in fp32 either way.
enum class Precision { kFp32, kBf16 };
Result<Precision> ParsePrecision(const std::string& name);  // "fp32", "bf16"

// What several learner ranks divide between them (one rank: nothing). kOptimizer (ZeRO stage 1):
// each keeps the AdamW state of every world-th parameter, steps those and sends them to the
// others. kParams (ZeRO stage 3): each keeps 1/world of every weight, gradient and AdamW state
// (learn/layer_units.h), and of the KL reference; no rank keeps the whole weights after set-up:
// snapshots and checkpoints gather them unit by unit (WriteWeights).
enum class Shard { kNone, kOptimizer, kParams };
Result<Shard> ParseShard(const std::string& name);  // "none", "optimizer", "params"

struct LearnerOptions {
  PolicyLossOptions loss;
  double lr = 3e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double max_grad_norm = 1.0;
  double temperature = 1.0;  // the actors' sampling temperature (log-probs must match)
  bool scale_by_std = true;  // GRPO advantage normalisation
  // Optimizer steps per update: the batch is split into this many minibatches of whole groups
  // (at most one per group). Above 1, pi_prox is the policy at the start of the update and the
  // PPO clip against it acts from the second minibatch on (a trust region).
  int64_t minibatches = 1;
  std::string device = "cpu";  // a LibTorch device: cpu, cuda, cuda:N (model::CheckDevice)
  Precision precision = Precision::kFp32;
  // Token budget of one forward/backward: a minibatch's rows, sorted by length, go through in
  // micro-batches of at most this many tokens (packed: the rows' own, about; padded: rows x the
  // longest) with their gradients accumulated. 0: one forward/backward per minibatch.
  int64_t micro_batch_tokens = 0;
  // Padding-free forward/backward: a (micro-)batch's rows go back to back into rows as wide as
  // its longest (first-fit decreasing, attention kept inside each sequence), so the update
  // computes about the real tokens only. false: each row padded to the longest.
  bool pack_sequences = true;
  Shard shard = Shard::kNone;
  // Each decoder layer keeps only its input for the backward pass, which runs the layer again
  // (learn/layer_units.h); always so with Shard::kParams.
  bool activation_checkpointing = false;
  // Mixture-of-experts models: weight of the router's load-balancing loss added to the policy
  // loss (model/qwen3.h TakeRouterAuxLoss); 0: off.
  double router_aux_coef = 0;
  // How token losses add up to a minibatch's loss (rl.loss_aggregation, grpo.h TokenShares).
  LossAggregation loss_aggregation = LossAggregation::kTokenMean;
  // rl.max_group_share: the largest share of a minibatch's loss one group may carry (0: no cap).
  double max_group_share = 0;
  // DAPO's soft overlong punishment and overlong filter (rl.overlong, grpo.h).
  OverlongOptions overlong;
  // The rollouts' token limit and stop ids (rollout.max_new_tokens, the vocabulary's): what
  // tells a truncated completion (grpo.h Truncated), and seq_mean_token_sum_norm's constant.
  // 0: no limit known (nothing counts as truncated).
  int64_t max_new_tokens = 0;
  std::vector<int64_t> stop_ids;
  // Router replay (rl.router_replay, mixture-of-experts models): the gradient and pi_prox
  // forwards use the routes each turn carries (data::Turn::routes) where the model's own top-k
  // probability mass is within router_replay_trust of theirs (model/qwen3.h RouteTape); the
  // reference policy routes by itself.
  bool router_replay = false;
  double router_replay_trust = 0.1;
};

// Data-parallel learner ranks (learn/rank_group.h) plug in here: every rank computes the
// gradients of its share of the micro-batches; Reduce sums the flat gradient (and partial
// statistics) over the ranks, so every rank applies the same step.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Sums `flat` (fp32, on the learner's device) over every rank, in place.
  virtual Status AllReduceSum(at::Tensor& flat) = 0;
  // Every rank's `tensors` (same shapes everywhere) become rank `root`'s.
  virtual Status Broadcast(std::vector<at::Tensor>& tensors, int root) = 0;
  // Every rank's `shard` ([n], the same n everywhere) side by side, in rank order, in `full`
  // ([world * n], same dtype and device).
  virtual Status AllGather(const at::Tensor& shard, at::Tensor& full) = 0;
  // `full` ([world * n], fp32) summed over the ranks; this rank's n-long part of the sum into
  // `shard`. `full` may be overwritten.
  virtual Status ReduceScatterSum(at::Tensor& full, at::Tensor& shard) = 0;
};

// One prompt group as it reaches the learner.
struct LearnerGroup {
  int64_t behavior_version = 0;
  std::vector<data::Episode> episodes;
};

struct StepStats {
  double loss = 0;
  double grad_norm = 0;
  double clip_frac = 0;
  double clip_frac_low = 0, clip_frac_high = 0, clip_frac_dual = 0;  // PolicyLossOutput's
  double kl = 0;
  double behav_weight_mean = 1;
  double max_token_weight = 0;   // PolicyLossOutput's, the largest over the minibatches (rank 0's tokens)
  double group_share_max = 0;    // the largest share of a minibatch's loss one group carried (after the cap)
  ImportanceHealth health;       // of the behaviour policy against pi_prox (grpo.h)
  double logprob_gap = 0;        // mean |learner log-prob - actor log-prob| at the start of the update
  std::vector<double> group_logprob_gap;  // the same per group, in the order given
  // Per group, in the order given: the importance sums of pi_prox (the start of the update)
  // against the behaviour policy (learner_run bins them by staleness).
  std::vector<ImportanceSums> group_importance;
  int64_t tokens = 0;            // completion tokens trained on (a filtered truncated completion's are not)
  int64_t truncated = 0;         // episodes of the batch with a completion cut at max_new_tokens (grpo.h Truncated)
  int64_t episodes = 0;
  double entropy = 0;            // mean per-token entropy of the policy over them (at the update's start)
  // Positions of this rank's gradient forwards: computed (padding included) and real (prompt and
  // completion); their difference is what padding cost (learner.pack_sequences removes most).
  int64_t computed_positions = 0;
  int64_t sequence_positions = 0;
  int64_t zero_spread_groups = 0;  // groups whose rewards were all equal (no signal)
  int64_t skipped_nonfinite = 0;   // optimizer steps not taken: non-finite loss or gradient
  // Mixture-of-experts models: tokens this rank's forwards of the update routed to each expert,
  // one row per sparse layer (model/qwen3.h TakeRouterLoad); empty for dense models.
  std::vector<std::vector<int64_t>> router_load;
  double router_aux_loss = 0;  // the load-balancing loss (before its coefficient), when on
  std::vector<size_t> nonfinite_groups;  // the groups (indices into Step's) of those steps' minibatches
  // Router replay, per group in the order given: of its shipped routes, those the learner's own
  // top-k already chose, those applied over its own choice, and those refused (beyond the trust).
  struct RouteCounts {
    int64_t same = 0, applied = 0, refused = 0;
    int64_t total() const { return same + applied + refused; }
  };
  std::vector<RouteCounts> group_routes;
};

struct TrainingBatch;  // learner.cc: the padded rows of one update
class LayerUnits;      // learn/layer_units.h

class Learner {
 public:
  // `model` becomes the fp32 master copy, moved to options.device (CheckDevice first).
  // `reducer` (may be null: one rank) outlives the learner.
  Learner(model::Qwen3Model model, const LearnerOptions& options, GradientReducer* reducer = nullptr);
  ~Learner();
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  // Fails (and changes nothing) on an empty batch or episodes with no tokens.
  Result<StepStats> Step(const std::vector<LearnerGroup>& groups);
  int64_t version() const { return version_; }
  // The master weights (fp32, on the learner's device): snapshots, checkpoints and evaluation
  // read them (model/qwen3.h StorageStateDict converts to the storage dtype). With LoRA in
  // bf16 the frozen base is bf16 and only the adapters are fp32. With parameters_sharded() its
  // tensors are empty once the ranks are set up (the config alone is of use): WriteWeights.
  model::Qwen3Model& model() { return model_; }

  // The frozen reference weights of the KL term: empty when kl_coef is 0, with LoRA (whose
  // reference is the model's own base with the adapters off: no copy) and under Shard::kParams
  // over several ranks (each rank keeps its shards of it, as of the weights).
  std::map<std::string, at::Tensor> ReferenceState() const;
  const LearnerOptions& options() const { return options_; }
  // The learning rate of the updates from now on (rl.staleness: auto couples it to S).
  void SetLearningRate(double lr);

  // AdamW's per-parameter state for a checkpoint: "<param>.exp_avg", "<param>.exp_avg_sq"
  // and "<param>.step" (int64, one element); a parameter never stepped (no gradient yet: an
  // expert no token reached) has "<param>.step" = 0 alone. Empty before the first update. With a sharded
  // optimizer, this rank's share only; GatherOptimizerState (every rank calls it) gives all.
  std::map<std::string, at::Tensor> OptimizerState() const;
  Result<std::map<std::string, at::Tensor>> GatherOptimizerState();
  // Shard::kParams: the whole AdamW state as OptimizerState() names it, written as a safetensors
  // file to `sink` on rank 0 unit by unit as it is all-gathered, so no rank ever holds it whole.
  // Every rank calls it (the workers with a null sink). A failed write still takes part in
  // every unit's gathers, so the ranks stay in step; its error is returned after them.
  Status WriteOptimizerState(const ByteSink* sink);
  // Shard::kParams: the weights as a safetensors file of `dtype` (with `metadata`), written to
  // `sink` on rank 0 unit by unit as each is all-gathered (the tensors in unit order). Every
  // rank calls it (the workers with a null sink); a failed write still takes part in every
  // gather and its error is returned after them.
  // `units` [first, end): only those units' tensors (a shard of a sharded checkpoint; every rank
  // asks for the same).
  Status WriteWeights(const ByteSink* sink, at::ScalarType dtype, const std::map<std::string, std::string>& metadata = {},
                      std::pair<size_t, size_t> units = {0, SIZE_MAX});
  // Shard::kParams: each unit's tensor names, and its bytes in `dtype` (WriteWeights' order).
  std::vector<std::pair<std::vector<std::string>, uint64_t>> WeightUnits(at::ScalarType dtype) const;
  // Bytes of AdamW state this rank holds.
  int64_t OptimizerStateBytes() const;
  // Whether the AdamW state is spread over the ranks (GatherOptimizerState then needs them all).
  bool optimizer_state_sharded() const { return sharded_ || units_sharded_; }
  // Whether the parameters themselves are sharded (Shard::kParams over several ranks).
  bool parameters_sharded() const { return units_sharded_; }
  // Bytes of fp32 master weights, gradients and AdamW state this rank keeps between updates
  // (rank 0's whole host copy under Shard::kParams not counted).
  int64_t TrainingStateBytes() const;
  // The most of those bytes alive at once during the updates so far: with Shard::kParams, plus
  // the largest set of gathered weights and unreduced gradients held together.
  int64_t PeakTrainingStateBytes() const;
  // Continues from a checkpoint: the model's weights are already loaded; this sets the
  // version, the optimizer state (as OptimizerState() gave it, whole; a sharded optimizer keeps
  // its share) and, when the KL term is on,
  // the frozen reference weights. On error (naming the tensor) nothing is changed.
  Status Restore(int64_t version, const std::map<std::string, at::Tensor>& optimizer_state,
                 const std::map<std::string, at::Tensor>& reference_weights);
  // Shard::kParams over several ranks, at set-up: every rank's shards of the weights, and with
  // `with_optimizer` of the AdamW state, become rank 0's cut, one unit at a time (rank 0
  // broadcasts each unit's flat vector from its whole fp32 weights and `optimizer_state`, whole
  // as Restore takes it and already restored on rank 0; the workers pass null): a worker never
  // holds more than one unit of the whole model or its state. With the KL term, the reference's
  // shards too, from rank 0's whole `reference` (as Restore took it) or, when that is null or
  // empty (a fresh run), from its weights. Collective.
  Status ShardsFromRankZero(const std::map<std::string, at::Tensor>* optimizer_state, bool with_optimizer,
                            const std::map<std::string, at::Tensor>* reference = nullptr);

 private:
  struct Minibatch;
  // Forward/backward of one minibatch's rows, micro-batch by micro-batch (this rank's share);
  // gradients accumulate in the compute model, statistics into `mb`.
  // `m2po_bound`: m2po's clip bound over the whole batch (NaN for the other corrections).
  // `ref`: the KL reference's log-probs of every row (undefined without the KL term).
  Status AccumulateGradients(const TrainingBatch& b, const at::Tensor& rows, const at::Tensor& prox,
                             const at::Tensor& ref, double m2po_bound, Minibatch* mb);
  // The compute model's gradients (and the minibatch's statistics) summed over ranks into the
  // master's gradients; then clipping and the optimizer step, and the compute copy refreshed.
  // Returns the gradient norm, or NaN with no step taken when the loss or gradient is not finite.
  Result<double> ApplyGradients(Minibatch* mb);
  // Log-probs of every row without gradients, each rank computing its micro-batches' and the
  // result summed over ranks: the policy's at the start of the update (pi_prox) or, with
  // `reference`, the KL reference's (which routes by itself).
  Result<at::Tensor> StartLogProbs(const TrainingBatch& b, bool reference);
  // The log-probs [rows, len] of `rows`' targets, the rows packed when that pays (packing.h),
  // computed in chunks from the hidden states (model/token_logprobs.h: nothing len x vocab);
  // `*computed` (when given) grows by the positions the forward computed, padding included;
  // `*entropy` (when given) receives the per-token entropies, laid out as the log-probs.
  // `replay` (when given, with options().router_replay): the rows' routes are forced through
  // it (it must live until the backward pass is done), and their outcomes counted per group.
  struct RouteReplay;
  at::Tensor LogProbs(model::Qwen3Model& m, const TrainingBatch& b, const at::Tensor& rows, int64_t len,
                      int64_t* computed = nullptr, at::Tensor* entropy = nullptr, RouteReplay* replay = nullptr);
  std::vector<at::Tensor> MicroBatches(const TrainingBatch& b, const at::Tensor& rows) const;

  model::Qwen3Model model_;               // master weights, fp32
  model::Qwen3Model compute_;             // the forward/backward copy: model_ itself in fp32, bf16 otherwise
  // The KL term's reference (kl_coef > 0): a frozen copy, sharded under Shard::kParams; none
  // with LoRA (the compute model with its adapters off).
  model::Qwen3Model reference_{nullptr};
  LearnerOptions options_;
  GradientReducer* reducer_;
  at::Device device_;
  // A parameter's AdamW state lives on rank index % world (sharded), else everywhere.
  int Owner(size_t index) const;
  bool Owns(size_t index) const;
  // Shard::kParams: every unit that has AdamW state, its moments all-gathered (every rank calls
  // it, in unit order), handed to `visit` on rank 0 as whole per-parameter tensors.
  Status JoinOptimizerUnits(
      const std::function<Status(size_t unit, int64_t step, const std::vector<at::Tensor>& exp_avg,
                                 const std::vector<at::Tensor>& exp_avg_sq)>& visit);
  // After a sharded step: every rank's parameters become their owners'.
  Status ShareStepped();

  // Shard::kParams: the clipping and the step on this rank's shards, then rank 0's whole copy
  // gathered.
  Result<double> StepShards(double loss);
  // Runs `round(i)` for each of this rank's micro-batch indices below `n` (i = k * world + rank);
  // a rank short of a round (sharded units) takes an idle one of `units`, so collectives line up.
  Status ForEachMine(size_t n, LayerUnits* units, bool backward, const std::function<Status(size_t)>& round);

  std::unique_ptr<torch::optim::AdamW> optimizer_;
  bool sharded_ = false;  // Shard::kOptimizer over several ranks
  std::unique_ptr<LayerUnits> units_;  // checkpointing or Shard::kParams
  std::unique_ptr<LayerUnits> reference_units_;  // Shard::kParams with the KL term: reference_'s shards
  bool units_sharded_ = false;
  // Every parameter's name and shape, in named order (the model's own tensors may be emptied).
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_;
  int64_t version_ = 0;
};

}  // namespace echelon::learn
