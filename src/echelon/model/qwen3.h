// Qwen3-architecture decoder on LibTorch, on any device and in fp32 or bf16 (Module::to):
// token embedding; per layer RMSNorm -> attention (q/k/v projections, per-head RMSNorm on q
// and k, rotary embedding in the rotate-half layout, grouped-query attention, causal +
// padding mask) -> residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; lm_head (or
// the embedding when tied). As transformers does, RMSNorm, the rotary tables and the
// attention softmax run in fp32 whatever the weights' dtype; logits come in the weights' dtype.
// Qwen3-MoE's sparse layers replace the MLP by a mixture of experts: router softmax in fp32,
// the top-k experts per token (weights renormalised iff norm_topk_prob, then cast back), each
// expert a SwiGLU MLP run once over the tokens routed to it (gathered by expert, not a loop
// over tokens), outputs summed with the router weights; the router's gradient flows through
// those weights.
//
// Parameter names are exactly Hugging Face's ("model.layers.0.self_attn.q_proj.weight",
// "lm_head.weight", ...), so NamedParameters() maps one-to-one onto a safetensors file.
//
//   Qwen3Model m(cfg);
//   at::Tensor logits = m->Forward(ids, positions, key_valid, nullptr);   // [B, T, vocab]
//
// Thread contract: a module is used by one thread at a time (forward on one thread while
// another thread writes its weights is a data race); copy weights with LoadStateDict.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "echelon/common/routes.h"
#include "echelon/common/status.h"
#include "echelon/model/attention.h"
#include "echelon/model/kv_cache.h"
#include "echelon/model/model_config.h"

namespace echelon::model {

// The part of the model one pipeline stage holds: decoder layers [first, last) (last < 0: to
// the end). The first stage (first == 0) also holds the embedding and the head (final norm,
// lm_head), so it both embeds and samples; a later stage holds its layers only. Parameter names
// keep the whole model's layer numbers.
struct LayerRange {
  int64_t first = 0;
  int64_t last = -1;
};

// Whether a stage of `range` (resolved: last >= 0) holds the tensor of this Hugging Face name:
// a decoder layer's tensors by their layer number, the rest (embedding, final norm, lm_head)
// on the first stage. What Own picks, by name alone (for a learner serving stages' snapshots).
bool StageHolds(const std::string& name, LayerRange range);
// The layers [first, last) whose tensors `names` hold; `first` is 0 when the embedding is
// among them. Fails when they hold no layer.
Result<LayerRange> RangeOfTensors(const std::map<std::string, at::Tensor>& tensors);

// How a pipeline stage's model meets its neighbours (model/pipeline.h). A model with a
// StageIo calls Input at the start of every Forward of a stage after the first (its layers'
// input instead of the embedding), and Output with its last layer's output (`need`: the caller
// wants logits): the first stage gets back the last stage's output, which its head turns into
// logits; a later stage gets an undefined tensor and its Forward returns one.
class StageIo {
 public:
  virtual ~StageIo() = default;
  virtual at::Tensor Input() = 0;
  virtual at::Tensor Output(const at::Tensor& x, bool need) = 0;
};

// How a Forward runs its decoder layers (none installed: one after the other, directly). A
// learner that shards parameters across ranks or recomputes activations in the backward pass
// installs one (learn/layer_units.h). `layer(x, replay)` is held layer `index`'s function: its
// outputs are the layer's output and, for a sparse layer while routing is recorded, the router
// probabilities summed over its positions ([num_experts] fp32, with their graph); `replay`
// recomputes it (a backward pass) without counting the router load or recording the choices
// again. Run returns what `layer` returned. Forwards with a cache never call the hook.
class LayerHook {
 public:
  using LayerFn = std::function<std::vector<at::Tensor>(const at::Tensor& x, bool replay)>;
  virtual ~LayerHook() = default;
  virtual std::vector<at::Tensor> Run(size_t index, const at::Tensor& x, const LayerFn& layer) = 0;
};

// Router replay (R3, Rollout Routing Replay: Ma et al., "Stabilizing MoE Reinforcement Learning
// by Aligning Training and Inference Routers", arXiv 2510.11370): what a Forward's sparse layers
// record and are made to choose. Layers are the decoder's layer numbers; positions index the Forward's tokens flattened
// row-major ([B, T] -> B * T).
//   Recording (an actor): after each Forward without a LayerHook replay, chosen[l] [N, k] int64
//   and margin[l] [N] fp32 (log p_k - log p_{k+1}, the gap between the router logits of the k-th
//   chosen expert and of the best one left out; +inf when every expert is chosen) of each
//   sparse layer l; undefined for dense layers.
//   Forcing (a learner): force[l] replaces the top-k at its positions by its experts (router
//   weights then the router's probabilities of those experts, renormalised as the top-k's are),
//   but only where the forced experts' probability sum is within `trust` of the model's own
//   top-k's: a claimed route the model finds implausible is not trained with (its outcome says
//   so). outcome[l] [M] int8 per forced entry: 0 the model's own choice already (as a set),
//   1 applied, 2 refused; written by the first pass of a Forward, not by a LayerHook's replay.
struct RouteForce {
  at::Tensor at;       // [M] int64, distinct positions
  at::Tensor experts;  // [M, k] int64, distinct experts in [0, num_experts) per entry
};
struct RouteTape {
  bool record = false;
  std::vector<at::Tensor> chosen, margin;
  std::vector<RouteForce> force;  // by layer; an undefined `at`: nothing forced there
  double trust = 1.0;
  std::vector<at::Tensor> outcome;
  enum Outcome : int8_t { kSame = 0, kApplied = 1, kRefused = 2 };
};

// A tape that forces the routes of several sequences in one Forward of a model of `layers`
// layers: rows[i]'s entries (nullptr: none) at flat positions flat_of(i, position). With
// `source`, (*source)[l][j] is the i whose entry is layer l's j-th.
RouteTape ForcingTape(const std::vector<const Routes*>& rows, int64_t layers, double trust,
                      const std::function<int64_t(size_t row, int64_t position)>& flat_of,
                      std::vector<std::vector<size_t>>* source = nullptr);

class Qwen3ModelImpl : public torch::nn::Module {
 public:
  // cfg must pass Validate() (c10::Error otherwise), and range lie in it; weights start as
  // InitWeights(0).
  explicit Qwen3ModelImpl(const ModelConfig& cfg, LayerRange range = {});
  // A model of `cfg` whose weights are allocated and never written: their contents are undefined
  // and their pages not resident until written. For weights about to be replaced (received,
  // loaded, cut into shards), so the model costs no memory or time of its own first. `dtype`:
  // of every weight (a model about to be bound to a snapshot's bf16 bytes: BindStateDict).
  struct Uninitialized {
    at::ScalarType dtype = at::kFloat;
  };
  Qwen3ModelImpl(const ModelConfig& cfg, Uninitialized);
  // A model of `other`'s config and layers whose parameters are `other`'s tensors (not copies):
  // models that decode side by side on one copy of the weights (each with its own StageIo).
  struct SharingWeights {};
  Qwen3ModelImpl(const Qwen3ModelImpl& other, SharingWeights);

  // ids, positions: [B, T] int64. key_valid: [B, cache length + T] bool, false for padding
  // slots (nullptr-equivalent: undefined tensor = all valid). With a cache the T new keys are
  // appended at the cache's length (each row's own with row_lengths; the cache adds blocks as
  // needed, up to its limit) and attention covers every cached slot of the row (causal within
  // the new T); the lengths grow by T. Returns logits [B, T, vocab] in the weights' dtype, on
  // their device. Attention runs in tiles (model/attention.h): nothing T x T is held.
  // compute_logits false skips the final norm and lm_head (a prefill that only fills the
  // cache) and returns an undefined tensor.
  at::Tensor Forward(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_valid,
                     KVCache* cache, bool compute_logits = true);

  // A padding-free batch: each row holds several sequences back to back. segments [B, T] int64
  // names each position's sequence; a token attends only to the earlier tokens of its own
  // segment, so every sequence's logits are those of a Forward of it alone. positions restart
  // at 0 with each sequence (the caller's). Trailing padding takes segment -1. No cache.
  at::Tensor ForwardPacked(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& segments);
  // The final hidden states (after the final norm, before lm_head) [B, T, hidden] of a Forward
  // without a cache (segments undefined) or of ForwardPacked (segments [B, T]): what per-token
  // log-probabilities are computed from in chunks against head() without T x vocab logits.
  at::Tensor Hidden(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& segments);
  // lm_head's weight [vocab, hidden] (the embedding when tied); undefined after the first stage.
  const at::Tensor& head() const { return lm_head_; }

  // A cache for this model's own layers, of at most `limit` columns per row; blocks are added
  // as rows grow.
  KVCache NewCache(int64_t batch, int64_t limit, int64_t block = kKvBlock) const;
  const ModelConfig& config() const { return cfg_; }
  // The layers held ([first, last), last resolved), and whether this is the whole model.
  LayerRange range() const { return range_; }
  bool whole() const { return range_.first == 0 && range_.last == cfg_.num_hidden_layers; }
  // Pipeline stages (nullptr: none); not owned, must outlive every Forward.
  void SetStageIo(StageIo* io) { io_ = io; }
  // How the layers run (nullptr: directly); not owned, must outlive every Forward and backward.
  void SetLayerHook(LayerHook* hook) { hook_ = hook; }
  size_t num_layers() const { return layers_.size(); }
  // Of `weights` (a whole model's), the tensors this model holds.
  std::map<std::string, at::Tensor> Own(const std::map<std::string, at::Tensor>& weights) const;

  // Weights by Hugging Face name (tied models have no "lm_head.weight"), as they are (device,
  // dtype of the parameters).
  std::map<std::string, at::Tensor> StateDict() const;
  // The same on the CPU in the model's storage dtype (config torch_dtype): what checkpoints and
  // snapshots hold.
  std::map<std::string, at::Tensor> StorageStateDict() const;
  // Where the parameters live and their dtype (Module::to moves and converts them).
  at::Device device() const { return ref_.device(); }
  at::ScalarType dtype() const { return ref_.scalar_type(); }
  // Copies weights in; every parameter must be present with the right shape, and no extra
  // names (lm_head.weight is ignored when tied). Converts dtype and device.
  Status LoadStateDict(const std::map<std::string, at::Tensor>& weights, const std::string& where);
  // The same checks, but each parameter becomes `weights`' tensor itself (converted only where
  // its dtype or device differs): no copy of views (ViewSafetensors), which must outlive the
  // binding. A bound model is for forward passes alone: nothing may write its parameters (no
  // LoadStateDict, LoadAdapter or optimizer step) until every one is bound anew.
  Status BindStateDict(const std::map<std::string, at::Tensor>& weights, const std::string& where);
  // Re-initialises weights (normal(0, 0.02), norms to 1; LoRA's A uniform in +-1/sqrt(in), as
  // PEFT's, and B zero) from a seed; deterministic.
  void InitWeights(uint64_t seed);

  // LoRA (config().lora on): the adapter tensors alone, by name, as StateDict gives them, and
  // in the storage dtype on the CPU as StorageStateDict does.
  std::map<std::string, at::Tensor> AdapterStateDict() const;
  std::map<std::string, at::Tensor> StorageAdapterStateDict() const;
  // Copies adapter tensors in: exactly every adapter tensor of this model, right shapes; the
  // base weights are left as they are. Nothing changes on error.
  Status LoadAdapter(const std::map<std::string, at::Tensor>& adapter, const std::string& where);

  // Tokens routed to each expert since the last call, one row per sparse layer in layer order
  // ([sparse layers, num_experts] int64 on the CPU; [0, 0] for a dense model): the router's
  // load, for the metrics. Every Forward adds to it (padding positions included).
  at::Tensor TakeRouterLoad();
  // While on, Forwards keep each sparse layer's router probabilities and choices (with their
  // graph) for TakeRouterAuxLoss.
  void RecordRouting(bool on) { record_routing_ = on; }
  // The load-balancing loss of what was recorded since the last call, as transformers'
  // Qwen3-MoE computes it (Switch Transformer's, over every recorded layer's positions at
  // once): X * sum_j f_j * P_j, f_j the share of top-k choices that went to expert j, P_j the
  // mean router probability of j; k (the experts per token) under uniform routing, up to about
  // X when one expert takes everything.
  // fp32 scalar with gradient to the routers; undefined when nothing was recorded. Clears it.
  at::Tensor TakeRouterAuxLoss();
  // Router replay (see RouteTape; nullptr: none); not owned, must outlive every Forward and
  // backward while set.
  void SetRouteTape(RouteTape* tape) { route_tape_ = tape; }
  // LoRA: while off, each adapted projection is its base weight alone: the policy a run started
  // from (B starts at zero), which a LoRA run's KL term takes as its reference (no copy). Its
  // routes are not the policy's: TakeRouterLoad does not count them.
  void SetAdaptersOn(bool on) { adapters_on_ = on; }

 private:
  // One decoder layer's weights (the same tensors are registered as HF-named parameters).
  struct Layer {
    at::Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    at::Tensor post_norm, gate_proj, up_proj, down_proj;
    // Undefined when the family has none (see ModelConfig).
    at::Tensor q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;
    // A sparse (Qwen3-MoE) layer: the router [num_experts, hidden] and each expert's SwiGLU
    // weights; gate_proj / up_proj / down_proj are then undefined.
    at::Tensor router;
    std::vector<at::Tensor> expert_gate, expert_up, expert_down;
    int64_t sparse_index = -1;  // row of router_load_
    int64_t number = 0;         // the decoder's layer number
    // LoRA's A and B of each projection, indexed as kLoraTargets (undefined: not adapted).
    at::Tensor lora_a[7], lora_b[7];
  };
  enum Projection { kQ, kK, kV, kO, kGate, kUp, kDown };
  // x W^T + b, plus the adapter's (alpha / rank) x A^T B^T when the projection has one.
  at::Tensor Project(const Layer& l, Projection which, const at::Tensor& x, const at::Tensor& w,
                     const at::Tensor& b = at::Tensor()) const;

  // How a Forward's T new keys are read with a cache (the layout says where they are written):
  // `end` = columns read. `fused_lengths` (one new token per row, fp32 CPU): attention by
  // DecodeAttention, row b over its shared prefix (`prefixes`) and its first fused_lengths[b] keys.
  struct CacheWrite {
    int64_t end = 0;
    KVCache::WritePlan plan;  // rows at their own lengths: where each layer writes
    std::vector<int64_t> fused_lengths;
    const std::vector<const KVPrefix*>* prefixes = nullptr;
  };
  // What Layers returns after the last layer.
  enum class Output { kNothing, kHidden, kLogits };
  // Embedding, the layers and, by `output`, the final norm and lm_head, with attention as
  // `layout` says.
  at::Tensor Layers(const at::Tensor& ids, const at::Tensor& positions, const AttentionLayout& layout, KVCache* cache,
                    const CacheWrite& write, Output output);
  // A Forward without a cache; segments as ForwardPacked's, or undefined (causal).
  at::Tensor Uncached(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& segments, Output output);
  at::Tensor Attention(const Layer& layer, const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                       const AttentionLayout& layout, KVCache* cache, const CacheWrite& write, size_t index) const;
  // One decoder layer: its output and, for a sparse layer when `record`, the router
  // probabilities summed over positions (LayerHook's contract).
  std::vector<at::Tensor> DecoderLayer(size_t index, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const AttentionLayout& layout, KVCache* cache, const CacheWrite& write,
                                       bool record, bool replay, RouteTape* tape);
  // `prob_sum` (when given) receives the router probabilities summed over positions.
  at::Tensor Mlp(const Layer& layer, const at::Tensor& h, bool replay, at::Tensor* prob_sum, RouteTape* tape);
  at::Tensor Experts(const Layer& layer, const at::Tensor& h, bool replay, at::Tensor* prob_sum, RouteTape* tape);

  Qwen3ModelImpl(const ModelConfig& cfg, LayerRange range, const Qwen3ModelImpl* shared);
  // Named parameters that are (adapters) or are not (base) LoRA tensors.
  std::map<std::string, at::Tensor> Select(bool adapters, bool storage) const;

  ModelConfig cfg_;
  LayerRange range_;
  StageIo* io_ = nullptr;
  LayerHook* hook_ = nullptr;
  at::Tensor ref_;  // a parameter every range holds: device and dtype
  at::Tensor embed_;  // undefined, as the head's, in a stage after the first
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  at::Tensor lm_head_;   // the embedding itself when tied
  at::Tensor inv_freq_;  // [head_dim / 2] rotary frequencies, not a parameter
  std::vector<int64_t> router_load_;  // [sparse layers * num_experts], see TakeRouterLoad
  bool record_routing_ = false;
  RouteTape* route_tape_ = nullptr;
  bool adapters_on_ = true;
  // Per recorded layer: router probabilities summed over its N positions ([X] fp32, with their
  // graph) and its choices [N, k].
  std::vector<at::Tensor> routed_prob_sums_, routed_choices_;
};
TORCH_MODULE(Qwen3Model);

// Gives `model` a route tape for the scope's life (SetRouteTape, then nullptr however it ends).
class RouteTapeScope {
 public:
  RouteTapeScope(Qwen3Model& model, RouteTape* tape) : model_(model) { model_->SetRouteTape(tape); }
  ~RouteTapeScope() { model_->SetRouteTape(nullptr); }
  RouteTapeScope(const RouteTapeScope&) = delete;
  RouteTapeScope& operator=(const RouteTapeScope&) = delete;

 private:
  Qwen3Model& model_;
};

// The model with its LoRA adapters off for the scope's life (SetAdaptersOn).
class AdaptersOffScope {
 public:
  explicit AdaptersOffScope(Qwen3Model& model) : model_(model) { model_->SetAdaptersOn(false); }
  ~AdaptersOffScope() { model_->SetAdaptersOn(true); }
  AdaptersOffScope(const AdaptersOffScope&) = delete;
  AdaptersOffScope& operator=(const AdaptersOffScope&) = delete;

 private:
  Qwen3Model& model_;
};

// `base`'s weights with LoRA adapters `lora` added (freshly initialised from `seed`: B zero, so
// the result computes what `base` does); on the CPU in fp32. Fails when `base` has adapters
// already or `lora` does not fit its config.
Result<Qwen3Model> WithLora(const Qwen3Model& base, const LoraConfig& lora, uint64_t seed);
// `adapted`'s adapters merged into its weights (W + (alpha / rank) B A, in fp32): a plain model
// of its config without them, which any Hugging Face tool reads; on the CPU in fp32.
Result<Qwen3Model> MergeLora(const Qwen3Model& adapted);

// The ATen dtype of config.torch_dtype.
at::ScalarType StorageDtype(const ModelConfig& config);

// Fails with one line when LibTorch cannot place tensors on `device` ("cpu", "cuda",
// "cuda:N"): an unparsable name, a LibTorch built without it, or no such device.
Status CheckDevice(const std::string& device);

}  // namespace echelon::model
