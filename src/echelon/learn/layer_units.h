// LayerUnits: the learner's compute model in units, one per decoder layer plus one for the rest
// (embedding, final norm, lm_head), run through the model's LayerHook for two memory savings:
//
// - Activation checkpointing (learner.activation_checkpointing): a layer's forward keeps only
//   its input; the backward pass runs the layer again, with gradients, just before the layer's
//   own backward. Activations then cost one [tokens, hidden] input per layer plus one layer's
//   intermediates, for one more forward of every layer.
// - Sharded parameters (learner.shard: params, ZeRO stage 3 as FSDP's FULL_SHARD): each rank
//   keeps 1/world of every unit's fp32 master weights, gradient and AdamW state, as one flat
//   shard (the unit's parameters back to back, zero-padded to a multiple of world). A layer's
//   weights are all-gathered, in the compute dtype, just before it runs and dropped after it; the
//   backward pass gathers the layer again, runs it again (so sharding always checkpoints), and
//   reduce-scatters its gradients into the shards' gradients at once, so a rank never holds more
//   than one layer's full weights and gradients, a sparse layer's experts included. The outer
//   unit stays gathered through a micro-batch (BeginMicroBatch .. EndMicroBatch).
//
// Every rank runs the same sequence of collectives: a rank with no micro-batch in a round takes
// an IdleRound, which gathers and reduce-scatters (zeros) exactly as a micro-batch would.
//
//   LayerUnits units(compute, reducer, /*shard=*/true);      // compute's weights now shards
//   units.BeginMicroBatch();  loss = ...;  loss.backward();  units.EndMicroBatch(true);
//   optimizer over units.Shards();  units.Join(u, units.Shards()[u]);   // one unit's whole weights
//
// Thread contract: the learner thread of each rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/learn/learner.h"
#include "echelon/model/qwen3.h"

namespace echelon::learn {

// `m`'s parameters by unit: each held decoder layer's, then the rest, in named order.
struct ParameterUnit {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
};
std::vector<ParameterUnit> ParameterUnits(const model::Qwen3Model& m);

class LayerUnits : public model::LayerHook {
 public:
  // Both install themselves as `compute`'s LayerHook. Checkpointing alone: the weights stay
  // where they are and gradients accumulate in them as usual.
  explicit LayerUnits(model::Qwen3Model compute);
  // Sharded: this rank's part of each unit of `master` (a whole model of the same config, fp32,
  // anywhere) becomes its fp32 shard on `device`; `compute`'s own tensors are emptied, and hold
  // a unit's weights in `dtype` on `device` only while the unit runs.
  LayerUnits(model::Qwen3Model compute, const model::Qwen3Model& master, GradientReducer* reducer,
             at::ScalarType dtype, at::Device device);
  ~LayerUnits() override;
  LayerUnits(const LayerUnits&) = delete;
  LayerUnits& operator=(const LayerUnits&) = delete;

  bool sharded() const { return shard_; }
  // The fp32 shards (leaves with gradients), one per unit: what the optimizer steps.
  std::vector<at::Tensor> Shards() const;
  // Unit `u`'s parameters in the compute model, and their names (the last unit: the outer one).
  const std::vector<at::Tensor>& UnitParameters(size_t u) const { return units_[u].params; }
  const std::vector<std::string>& UnitNames(size_t u) const { return units_[u].names; }
  size_t num_units() const { return units_.size(); }
  // Sharded: the most bytes of gathered weights and of gradients not yet reduce-scattered that
  // were alive at once so far (the buffers' own sizes, taken as they are allocated).
  int64_t peak_transient_bytes() const { return peak_; }

  // The outer unit gathered for a micro-batch's forward; after it (and its backward when
  // `backward`), its gradients reduce-scattered into the shard and the weights dropped.
  Status BeginMicroBatch();
  Status EndMicroBatch(bool backward);
  // The collectives of one micro-batch (forward, and backward when `backward`) with no rows.
  Status IdleRound(bool backward);

  // This rank's shard of unit `u` cut from whole per-parameter tensors (one per UnitParameters,
  // same shapes): the padding is zero.
  at::Tensor Cut(size_t u, const std::vector<at::Tensor>& whole) const;
  // This rank's shard of unit `u` from rank 0's whole per-parameter tensors (`whole`, read on
  // rank 0 only): rank 0 broadcasts the unit's flat vector and every rank keeps its part, so a
  // rank holds one unit of the whole at a time. Collective.
  Result<at::Tensor> CutFromRankZero(size_t u, const std::vector<at::Tensor>& whole);
  // The whole tensors of unit `u` from every rank's shard of `mine` (fp32, as Cut gives).
  Result<std::vector<at::Tensor>> Join(size_t u, const at::Tensor& mine);

  // model::LayerHook
  std::vector<at::Tensor> Run(size_t index, const at::Tensor& x, const LayerFn& layer) override;

  // Called by the checkpointed layer's backward (layer_units.cc).
  void Gather(size_t u);
  void Release(size_t u);
  void TakeGradients(size_t u, const std::vector<at::Tensor>& grads);
  const LayerFn& Saved(int64_t call) const { return calls_[static_cast<size_t>(call)]; }

 private:
  struct Unit : ParameterUnit {  // params: the compute model's tensors (emptied when sharded)
    std::vector<std::vector<int64_t>> shapes;
    int64_t numel = 0, padded = 0;   // padded: a multiple of world
    at::Tensor shard;                // fp32 [padded / world], this rank's part, with .grad()
    int64_t gathered = 0;            // bytes of the gathered weights while gathered
  };
  int64_t ShardLength(const Unit& unit) const { return unit.padded / world_; }
  // Unit `u`'s flat fp32 vector [padded] on the device from its whole tensors (the padding zero).
  at::Tensor Flat(size_t u, const std::vector<at::Tensor>& whole) const;
  void TakeUnits();  // units_ from the compute model
  // Reduce-scatters fp32 [padded] gradients into unit `u`'s shard gradient; `also` more bytes
  // of gradients are alive beside `flat` meanwhile.
  void ScatterGradients(size_t u, at::Tensor flat, int64_t also = 0);
  void Note(int64_t transient) { peak_ = std::max(peak_, live_ + transient); }

  model::Qwen3Model compute_;
  GradientReducer* reducer_;
  bool shard_;
  int64_t world_ = 1, rank_ = 0;
  at::ScalarType dtype_;
  at::Device device_;
  std::vector<Unit> units_;
  std::vector<LayerFn> calls_;  // the layers of this micro-batch's forward, for their backward
  int64_t live_ = 0, peak_ = 0;  // bytes of gathered weights now; peak_transient_bytes
};

}  // namespace echelon::learn
