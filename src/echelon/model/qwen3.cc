// The decoder follows transformers' modeling_qwen3.py operation by operation (checked against
// an independent reference by qwen3_test.cc). Weights are plain tensors registered under
// their Hugging Face names through a tree of empty submodules, because torch::nn::Module
// forbids dots in a parameter's own name.
#include "echelon/model/qwen3.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>

#include "echelon/model/decode_attention.h"
#include "echelon/model/fused_ops.h"

namespace echelon::model {
namespace {

// Creates "a.b.c" as parameter "c" of submodule "a.b", making the submodules on the way.
class ParamTree {
 public:
  // With `shared`, each parameter is that module's tensor of the same name (not a copy).
  ParamTree(torch::nn::Module* root, const torch::nn::Module* shared) : root_(root) {
    if (shared != nullptr) shared_ = shared->named_parameters(/*recurse=*/true);
  }

  at::Tensor Add(const std::string& path, at::IntArrayRef shape) {
    const size_t dot = path.rfind('.');
    torch::nn::Module* owner = dot == std::string::npos ? root_ : Node(path.substr(0, dot));
    return owner->register_parameter(path.substr(dot + 1), shared_.is_empty() ? at::empty(shape, at::kFloat)
                                                                               : shared_[path]);
  }

 private:
  torch::nn::Module* Node(const std::string& prefix) {
    auto it = nodes_.find(prefix);
    if (it != nodes_.end()) return it->second.get();
    const size_t dot = prefix.rfind('.');
    torch::nn::Module* parent = dot == std::string::npos ? root_ : Node(prefix.substr(0, dot));
    auto node = parent->register_module(prefix.substr(dot + 1), std::make_shared<torch::nn::Module>());
    nodes_[prefix] = node;
    return node.get();
  }

  torch::nn::Module* root_;
  torch::OrderedDict<std::string, at::Tensor> shared_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> nodes_;
};

// RMSNorm over the last dimension, computed in fp32 and cast back (as HF does for bf16).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (FusedOpsApply(x) && FusedOpsApply(w)) return RmsNormFused(x, w, eps);  // inference in fp32 on the CPU
  const at::Tensor xf = x.to(at::kFloat);
  return w * (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
}

// Rotate-half (NeoX) layout: dimension i pairs with i + D/2.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

std::string ShapeString(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

// Checks `weights` against `targets` by name: every target there, floating-point and of its
// shape, and no other name but `ignored`.
Status CheckWeights(const std::map<std::string, at::Tensor>& targets, const std::map<std::string, at::Tensor>& weights,
                    const std::string& where, const std::string& ignored) {
  for (const auto& [name, target] : targets) {
    auto it = weights.find(name);
    if (it == weights.end()) return NotFound(where + ": missing tensor " + name);
    if (!it->second.defined() || !at::isFloatingType(it->second.scalar_type()))
      return InvalidArgument(where + ": tensor " + name + " is not a floating-point tensor");
    if (it->second.sizes() != target.sizes())
      return InvalidArgument(where + ": tensor " + name + " has shape " + ShapeString(it->second.sizes()) +
                             ", config.json needs " + ShapeString(target.sizes()));
  }
  for (const auto& [name, tensor] : weights) {
    if (targets.count(name) > 0 || (!ignored.empty() && name == ignored)) continue;
    return InvalidArgument(where + ": unexpected tensor " + name + " (not a parameter of this config)");
  }
  return Status::Ok();
}

// Copies `weights` into `targets` by name (converting dtype and device). Everything is checked
// before anything is copied, so bad input leaves the model unchanged.
Status CopyInto(const std::map<std::string, at::Tensor>& targets, const std::map<std::string, at::Tensor>& weights,
                const std::string& where, const std::string& ignored) {
  ECHELON_RETURN_IF_ERROR(CheckWeights(targets, weights, where, ignored));
  try {
    at::NoGradGuard no_grad;
    for (const auto& [name, target] : targets) {
      at::Tensor t = target;
      t.copy_(weights.at(name));
    }
  } catch (const c10::Error& e) {
    return Internal(where + ": copying weights failed: " + e.what_without_backtrace());
  }
  return Status::Ok();
}

}  // namespace

Status CheckDevice(const std::string& device) {
  std::optional<at::Device> d;
  try {
    d = at::Device(device);
  } catch (const c10::Error&) {
    return InvalidArgument("\"" + device + "\" is not a device name (cpu, cuda, cuda:N)");
  }
  if (d->is_cuda() && !at::hasCUDA())
    return FailedPrecondition("\"" + device + "\": this LibTorch was built without CUDA (Debian's libtorch is "
                              "CPU-only); build echelon against the LibTorch of a PyTorch installation "
                              "(scripts/gpu-check.sh)");
  if (d->is_cuda() && d->has_index() && d->index() >= static_cast<int>(at::getNumGPUs()))
    return FailedPrecondition("\"" + device + "\": this machine has " + std::to_string(at::getNumGPUs()) +
                              " CUDA device(s)");
  try {
    (void)at::empty({1}, at::TensorOptions().device(*d));
  } catch (const c10::Error& e) {
    return FailedPrecondition("\"" + device + "\": LibTorch cannot place tensors there: " +
                              std::string(e.what_without_backtrace()).substr(0, 200));
  }
  return Status::Ok();
}

at::ScalarType StorageDtype(const ModelConfig& config) {
  if (config.torch_dtype == "bfloat16") return at::kBFloat16;
  if (config.torch_dtype == "float16") return at::kHalf;
  return at::kFloat;
}

Qwen3ModelImpl::Qwen3ModelImpl(const ModelConfig& cfg, LayerRange range) : Qwen3ModelImpl(cfg, range, nullptr) {
  InitWeights(0);
}

Qwen3ModelImpl::Qwen3ModelImpl(const ModelConfig& cfg, Uninitialized u) : Qwen3ModelImpl(cfg, {}, nullptr) {
  if (u.dtype == at::kFloat) return;
  at::NoGradGuard no_grad;
  for (at::Tensor& p : parameters(/*recurse=*/true)) p.set_data(at::empty(p.sizes(), p.options().dtype(u.dtype)));
}

Qwen3ModelImpl::Qwen3ModelImpl(const Qwen3ModelImpl& other, SharingWeights)
    : Qwen3ModelImpl(other.cfg_, other.range_, &other) {}

Qwen3ModelImpl::Qwen3ModelImpl(const ModelConfig& cfg, LayerRange range, const Qwen3ModelImpl* shared)
    : cfg_(cfg), range_(range) {
  const Status valid = cfg.Validate();
  TORCH_CHECK(valid.ok(), "Qwen3Model: invalid config: ", valid.message());
  if (range_.last < 0) range_.last = cfg.num_hidden_layers;
  TORCH_CHECK(range_.first >= 0 && range_.first <= range_.last && range_.last <= cfg.num_hidden_layers &&
                  (range_.first == 0 || range_.first < range_.last),
              "Qwen3Model: layers [", range_.first, ", ", range_.last, ") do not fit a model of ",
              cfg.num_hidden_layers, " layers (a stage after the first holds at least one)");
  const int64_t e = cfg.hidden_size, d = cfg.head_dim, q = cfg.num_attention_heads * d;
  const int64_t kv = cfg.num_key_value_heads * d, inter = cfg.intermediate_size;
  const bool first = range_.first == 0;
  ParamTree tree(this, shared);
  // LoRA's A [rank, in] and B [out, rank] beside projection `which` under `path`, when targeted.
  const auto adapt = [&](Layer& l, Projection which, const std::string& path, int64_t out, int64_t in) {
    const std::string& target = kLoraTargets[which];
    if (!cfg.lora.on() || std::find(cfg.lora.targets.begin(), cfg.lora.targets.end(), target) == cfg.lora.targets.end())
      return;
    l.lora_a[which] = tree.Add(path + target + ".lora_A.weight", {cfg.lora.rank, in});
    l.lora_b[which] = tree.Add(path + target + ".lora_B.weight", {out, cfg.lora.rank});
  };
  if (first) embed_ = tree.Add("model.embed_tokens.weight", {cfg.vocab_size, e});
  for (int64_t i = range_.first; i < range_.last; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = tree.Add(p + "input_layernorm.weight", {e});
    l.q_proj = tree.Add(p + "self_attn.q_proj.weight", {q, e});
    l.k_proj = tree.Add(p + "self_attn.k_proj.weight", {kv, e});
    l.v_proj = tree.Add(p + "self_attn.v_proj.weight", {kv, e});
    l.o_proj = tree.Add(p + "self_attn.o_proj.weight", {e, q});
    if (cfg.qkv_bias()) {
      l.q_bias = tree.Add(p + "self_attn.q_proj.bias", {q});
      l.k_bias = tree.Add(p + "self_attn.k_proj.bias", {kv});
      l.v_bias = tree.Add(p + "self_attn.v_proj.bias", {kv});
    }
    if (cfg.o_bias()) l.o_bias = tree.Add(p + "self_attn.o_proj.bias", {e});
    adapt(l, kQ, p + "self_attn.", q, e);
    adapt(l, kK, p + "self_attn.", kv, e);
    adapt(l, kV, p + "self_attn.", kv, e);
    adapt(l, kO, p + "self_attn.", e, q);
    if (cfg.qk_norm()) {
      l.q_norm = tree.Add(p + "self_attn.q_norm.weight", {d});
      l.k_norm = tree.Add(p + "self_attn.k_norm.weight", {d});
    }
    l.post_norm = tree.Add(p + "post_attention_layernorm.weight", {e});
    if (cfg.is_sparse(i)) {
      const int64_t mi = cfg.moe_intermediate_size;
      l.router = tree.Add(p + "mlp.gate.weight", {cfg.num_experts, e});
      for (int64_t j = 0; j < cfg.num_experts; ++j) {
        const std::string x = p + "mlp.experts." + std::to_string(j) + ".";
        l.expert_gate.push_back(tree.Add(x + "gate_proj.weight", {mi, e}));
        l.expert_up.push_back(tree.Add(x + "up_proj.weight", {mi, e}));
        l.expert_down.push_back(tree.Add(x + "down_proj.weight", {e, mi}));
      }
      l.sparse_index = static_cast<int64_t>(router_load_.size()) / cfg.num_experts;
      l.number = i;
      router_load_.resize(router_load_.size() + static_cast<size_t>(cfg.num_experts), 0);
      layers_.push_back(l);
      continue;
    }
    l.gate_proj = tree.Add(p + "mlp.gate_proj.weight", {inter, e});
    l.up_proj = tree.Add(p + "mlp.up_proj.weight", {inter, e});
    l.down_proj = tree.Add(p + "mlp.down_proj.weight", {e, inter});
    if (cfg.mlp_biased()) {
      l.gate_bias = tree.Add(p + "mlp.gate_proj.bias", {inter});
      l.up_bias = tree.Add(p + "mlp.up_proj.bias", {inter});
      l.down_bias = tree.Add(p + "mlp.down_proj.bias", {e});
    }
    adapt(l, kGate, p + "mlp.", inter, e);
    adapt(l, kUp, p + "mlp.", inter, e);
    adapt(l, kDown, p + "mlp.", e, inter);
    layers_.push_back(l);
  }
  if (first) {
    final_norm_ = tree.Add("model.norm.weight", {e});
    lm_head_ = cfg.tie_word_embeddings ? embed_ : tree.Add("lm_head.weight", {cfg.vocab_size, e});
  }
  ref_ = first ? embed_ : layers_.front().input_norm;
  // As HF: 1 / theta^(arange(0, D, 2) / D) in fp32.
  inv_freq_ =
      at::pow(cfg.rope_theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d)).reciprocal();
}

at::Tensor Qwen3ModelImpl::Forward(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_valid,
                                   KVCache* cache, bool compute_logits) {
  TORCH_CHECK(ids.dim() == 2 && positions.sizes() == ids.sizes(), "Forward: ids and positions must be [B, T], got ",
              ids.sizes(), " and ", positions.sizes());
  const int64_t batch = ids.size(0), t = ids.size(1);
  AttentionLayout layout;
  layout.key_valid = key_valid;
  CacheWrite write;
  write.end = t;
  if (cache != nullptr) {
    TORCH_CHECK(cache->layers() == layers_.size() && cache->batch() == batch, "KV cache of ", cache->layers(),
                " layers and ", cache->batch(), " rows for a Forward of ", layers_.size(), " layers and ", batch,
                " rows");
    if (cache->row_lengths.empty()) {
      layout.start = cache->length;
      write.end = layout.start + t;
    } else {
      TORCH_CHECK(batch > 0 && static_cast<int64_t>(cache->row_lengths.size()) == batch,
                  "KV cache row_lengths must hold ", batch, " lengths, got ", cache->row_lengths.size());
      layout.row_start = cache->row_lengths;
      write.end = *std::max_element(cache->row_lengths.begin(), cache->row_lengths.end()) + t;
      if (t == 1 && !key_valid.defined() && DecodeAttentionSupports(ref_)) {
        write.fused_lengths = cache->row_lengths;
        for (int64_t& len : write.fused_lengths) ++len;
      }
      if (!cache->row_prefix.empty()) {
        TORCH_CHECK(!write.fused_lengths.empty(), "KV cache prefixes need the fused decoding attention (one token per "
                    "row, fp32 on the CPU, no key_valid)");
        TORCH_CHECK(static_cast<int64_t>(cache->row_prefix.size()) == batch, "KV cache row_prefix must hold ", batch,
                    " entries, got ", cache->row_prefix.size());
        write.prefixes = &cache->row_prefix;
      }
    }
    cache->Reserve(write.end);  // adds blocks; fails past the cache's limit
    if (!layout.row_start.empty()) write.plan = cache->PlanWrite(layout.row_start, t);
  }
  return Layers(ids, positions, layout, cache, write, compute_logits ? Output::kLogits : Output::kNothing);
}

at::Tensor Qwen3ModelImpl::ForwardPacked(const at::Tensor& ids, const at::Tensor& positions,
                                         const at::Tensor& segments) {
  TORCH_CHECK(ids.dim() == 2 && positions.sizes() == ids.sizes() && segments.sizes() == ids.sizes(),
              "ForwardPacked: ids, positions and segments must be [B, T] alike, got ", ids.sizes(), ", ",
              positions.sizes(), " and ", segments.sizes());
  return Uncached(ids, positions, segments, Output::kLogits);
}

at::Tensor Qwen3ModelImpl::Hidden(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& segments) {
  TORCH_CHECK(ids.dim() == 2 && positions.sizes() == ids.sizes() &&
                  (!segments.defined() || segments.sizes() == ids.sizes()),
              "Hidden: ids, positions (and segments) must be [B, T] alike, got ", ids.sizes(), " and ",
              positions.sizes());
  return Uncached(ids, positions, segments, Output::kHidden);
}

at::Tensor Qwen3ModelImpl::Uncached(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& segments,
                                    Output output) {
  AttentionLayout layout;
  layout.segments = segments;  // causal within a segment, nothing across; padding (-1) to padding only
  CacheWrite write;
  write.end = ids.size(1);
  return Layers(ids, positions, layout, nullptr, write, output);
}

at::Tensor Qwen3ModelImpl::Layers(const at::Tensor& ids, const at::Tensor& positions, const AttentionLayout& layout,
                                  KVCache* cache, const CacheWrite& write, Output output) {
  const int64_t t = ids.size(1);
  // Rotary tables in fp32, then in the weights' dtype (as HF).
  at::Tensor angles = positions.to(at::kFloat).unsqueeze(-1) * inv_freq_.to(ids.device());  // [B, T, D/2]
  angles = at::cat({angles, angles}, -1).unsqueeze(1);                                      // [B, 1, T, D]
  const at::Tensor cos = angles.cos().to(ref_.scalar_type()), sin = angles.sin().to(ref_.scalar_type());

  TORCH_CHECK(embed_.defined() || io_ != nullptr, "Qwen3Model: a pipeline stage after the first needs its StageIo");
  at::Tensor x = embed_.defined() ? at::embedding(embed_, ids) : io_->Input();
  TORCH_CHECK(x.dim() == 3 && x.size(0) == ids.size(0) && x.size(1) == t && x.size(2) == cfg_.hidden_size,
              "Qwen3Model: stage input of shape ", x.sizes(), " for ids ", ids.sizes());
  x = x.to(ref_.device(), ref_.scalar_type());
  for (size_t i = 0; i < layers_.size(); ++i) {
    std::vector<at::Tensor> out;
    if (hook_ != nullptr && cache == nullptr) {
      // By value: the hook may call the layer again in the backward pass, after this Forward.
      out = hook_->Run(i, x, [this, i, cos, sin, layout, write, record = record_routing_,
                              tape = route_tape_](const at::Tensor& in, bool replay) {
        return DecoderLayer(i, in, cos, sin, layout, nullptr, write, record, replay, tape);
      });
    } else {
      out = DecoderLayer(i, x, cos, sin, layout, cache, write, record_routing_, false, route_tape_);
    }
    x = out[0];
    if (out.size() > 1) routed_prob_sums_.push_back(out[1]);
  }
  if (cache != nullptr) {
    if (cache->row_lengths.empty()) cache->length += t;
    for (int64_t& len : cache->row_lengths) len += t;
  }
  const bool head = output != Output::kNothing;
  if (io_ != nullptr) x = io_->Output(x, head && embed_.defined());
  if (!head || !embed_.defined()) return at::Tensor();
  x = RmsNorm(x.to(ref_.device(), ref_.scalar_type()), final_norm_, cfg_.rms_norm_eps);
  return output == Output::kHidden ? x : at::linear(x, lm_head_);
}

at::Tensor Qwen3ModelImpl::Attention(const Layer& l, const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                                     const AttentionLayout& layout, KVCache* cache, const CacheWrite& write,
                                     size_t index) const {
  const int64_t b = h.size(0), t = h.size(1), d = cfg_.head_dim;
  const int64_t heads = cfg_.num_attention_heads, kv = cfg_.num_key_value_heads;
  const double eps = cfg_.rms_norm_eps;
  at::Tensor q = Project(l, kQ, h, l.q_proj, l.q_bias).view({b, t, heads, d});
  at::Tensor k = Project(l, kK, h, l.k_proj, l.k_bias).view({b, t, kv, d});
  at::Tensor v = Project(l, kV, h, l.v_proj, l.v_bias).view({b, t, kv, d}).transpose(1, 2);
  if (FusedOpsApply(q) && FusedOpsApply(cos)) {  // inference in fp32 on the CPU: norm + rotary in one pass
    const at::Tensor c = cos.view({b * t, d}), s = sin.view({b * t, d});
    q = NormRopeFused(q.view({b * t, heads, d}), l.q_norm, eps, c, s).view({b, t, heads, d}).transpose(1, 2);
    k = NormRopeFused(k.view({b * t, kv, d}), l.k_norm, eps, c, s).view({b, t, kv, d}).transpose(1, 2);
  } else {
    if (l.q_norm.defined()) {  // qwen3: per-head RMSNorm before RoPE
      q = RmsNorm(q, l.q_norm, eps);
      k = RmsNorm(k, l.k_norm, eps);
    }
    q = ApplyRope(q.transpose(1, 2), cos, sin);  // [B, H, T, D]
    k = ApplyRope(k.transpose(1, 2), cos, sin);  // [B, KV, T, D]
  }
  const double scale = 1.0 / std::sqrt(double(d));
  at::Tensor out;  // [B, H, T, D]
  if (cache == nullptr) {
    out = Attend(q, k, v, layout, scale);
  } else {
    if (layout.row_start.empty()) cache->Write(index, k, v, layout.start);
    else cache->Write(index, k, v, write.plan);
    if (!write.fused_lengths.empty()) {
      std::vector<DecodePrefix> prefixes;
      if (write.prefixes != nullptr) {
        for (const KVPrefix* p : *write.prefixes)
          prefixes.push_back(p == nullptr ? DecodePrefix{} : DecodePrefix{p->k[index], p->v[index]});
      }
      out = DecodeAttention(q.reshape({b, heads, d}).contiguous(), cache->k(index), cache->v(index),
                            write.fused_lengths, scale, prefixes);
      return Project(l, kO, out.view({b, 1, heads * d}), l.o_proj, l.o_bias);
    }
    out = AttendBlocks(q, cache->k(index), cache->v(index), write.end, layout, scale);
  }
  return Project(l, kO, out.transpose(1, 2).reshape({b, t, heads * d}), l.o_proj, l.o_bias);
}

std::vector<at::Tensor> Qwen3ModelImpl::DecoderLayer(size_t index, const at::Tensor& x, const at::Tensor& cos,
                                                     const at::Tensor& sin, const AttentionLayout& layout,
                                                     KVCache* cache, const CacheWrite& write, bool record,
                                                     bool replay, RouteTape* tape) {
  const Layer& l = layers_[index];
  const double eps = cfg_.rms_norm_eps;
  at::Tensor h = x + Attention(l, RmsNorm(x, l.input_norm, eps), cos, sin, layout, cache, write, index);
  at::Tensor prob_sum;
  h = h + Mlp(l, RmsNorm(h, l.post_norm, eps), replay, record ? &prob_sum : nullptr, tape);
  if (prob_sum.defined()) return {h, prob_sum};
  return {h};
}

at::Tensor Qwen3ModelImpl::Mlp(const Layer& l, const at::Tensor& h, bool replay, at::Tensor* prob_sum,
                               RouteTape* tape) {
  if (l.router.defined()) return Experts(l, h, replay, prob_sum, tape);
  return Project(l, kDown,
                 at::silu(Project(l, kGate, h, l.gate_proj, l.gate_bias)) * Project(l, kUp, h, l.up_proj, l.up_bias),
                 l.down_proj, l.down_bias);
}

at::Tensor Qwen3ModelImpl::Project(const Layer& l, Projection which, const at::Tensor& x, const at::Tensor& w,
                                   const at::Tensor& b) const {
  at::Tensor y = at::linear(x, w, b);
  if (!l.lora_a[which].defined() || !adapters_on_) return y;
  // In the input's dtype: a bf16 learner keeps its adapters in fp32 (their own master weights).
  const at::ScalarType dtype = x.scalar_type();
  return y + at::linear(at::linear(x, l.lora_a[which].to(dtype)), l.lora_b[which].to(dtype)) * cfg_.lora.scale();
}

namespace {

// Router replay's forcing (RouteTape): `chosen` [N, k] with the forced entries put in where
// their probability mass under `probs` [N, X] is within `trust` of the own top-k's
// (`own_mass` [N]); the outcome of each entry in *outcome.
at::Tensor ForceRoutes(const at::Tensor& probs, const at::Tensor& chosen, const at::Tensor& own_mass,
                       const RouteForce& force, double trust, at::Tensor* outcome) {
  const at::Tensor at = force.at.to(chosen.device()), experts = force.experts.to(chosen.device());
  const at::Tensor forced_mass = probs.index_select(0, at).gather(1, experts).sum(-1);
  const at::Tensor accept = forced_mass >= own_mass.index_select(0, at) - trust;
  const at::Tensor same = std::get<0>(experts.sort(-1)).eq(std::get<0>(chosen.index_select(0, at).sort(-1))).all(-1);
  if (outcome != nullptr)
    *outcome = at::where(same, at::zeros_like(at), at::where(accept, at::ones_like(at), at::full_like(at, 2)))
                   .to(at::kCPU, at::kChar);
  const at::Tensor apply = accept.logical_and(same.logical_not());
  return chosen.index_put({at.masked_select(apply)}, experts.index({apply}));
}

}  // namespace

RouteTape ForcingTape(const std::vector<const Routes*>& rows, int64_t layers, double trust,
                      const std::function<int64_t(size_t row, int64_t position)>& flat_of,
                      std::vector<std::vector<size_t>>* source) {
  std::vector<std::vector<int64_t>> at(static_cast<size_t>(layers)), experts(static_cast<size_t>(layers));
  if (source != nullptr) source->assign(static_cast<size_t>(layers), {});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] == nullptr) continue;
    const Routes& r = *rows[i];
    const size_t k = r.k();
    for (size_t e = 0; e < r.size(); ++e) {
      const size_t l = static_cast<size_t>(r.layers[e]);
      at[l].push_back(flat_of(i, r.positions[e]));
      experts[l].insert(experts[l].end(), r.experts.begin() + static_cast<std::ptrdiff_t>(e * k),
                        r.experts.begin() + static_cast<std::ptrdiff_t>((e + 1) * k));
      if (source != nullptr) (*source)[l].push_back(i);
    }
  }
  RouteTape tape;
  tape.trust = trust;
  tape.force.resize(static_cast<size_t>(layers));
  for (size_t l = 0; l < at.size(); ++l)
    if (!at[l].empty())
      tape.force[l] = {at::tensor(at[l], at::kLong),
                       at::tensor(experts[l], at::kLong).view({static_cast<int64_t>(at[l].size()), -1})};
  return tape;
}

at::Tensor Qwen3ModelImpl::Experts(const Layer& l, const at::Tensor& h, bool replay, at::Tensor* prob_sum,
                                   RouteTape* tape) {
  const int64_t experts = cfg_.num_experts, k = cfg_.num_experts_per_tok;
  const at::Tensor x = h.reshape({-1, h.size(-1)});  // [N, E]
  // As transformers: router logits in the weights' dtype, softmax and top-k in fp32.
  const at::Tensor probs = at::softmax(at::linear(x, l.router).to(at::kFloat), -1);  // [N, X]
  auto [weights, chosen] = probs.topk(k, -1);                                       // [N, k]
  if (tape != nullptr) {
    const size_t n = static_cast<size_t>(l.number);
    if (tape->record && !replay) {
      if (tape->chosen.size() <= n) tape->chosen.resize(n + 1), tape->margin.resize(n + 1);
      tape->chosen[n] = chosen.to(at::kCPU);
      // In log-probability (router logits): what arithmetic noise moves alike at any sharpness.
      tape->margin[n] = (k < experts ? (weights.select(1, k - 1) / std::get<0>(probs.topk(k + 1, -1)).select(1, k)).log()
                                     : at::full({x.size(0)}, INFINITY, probs.options()))
                            .to(at::kCPU);
    }
    if (n < tape->force.size() && tape->force[n].at.defined() && tape->force[n].at.numel() > 0) {
      if (tape->outcome.size() <= n) tape->outcome.resize(n + 1);
      chosen = ForceRoutes(probs, chosen, weights.sum(-1), tape->force[n], tape->trust,
                           replay ? nullptr : &tape->outcome[n]);
      weights = probs.gather(1, chosen);
    }
  }
  if (prob_sum != nullptr) {
    *prob_sum = probs.sum(0);
    if (!replay) routed_choices_.push_back(chosen);
  }
  if (cfg_.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());
  // Group the N * k (token, slot) pairs by expert: one gather and three matmuls per expert.
  const at::Tensor flat = chosen.reshape({-1});
  const at::Tensor order = flat.argsort();
  const at::Tensor counts = at::bincount(flat, /*weights=*/{}, experts).to(at::kCPU);
  const int64_t* count = counts.data_ptr<int64_t>();
  const at::Tensor token_of = at::floor_divide(order, k);
  const at::Tensor flat_weights = weights.reshape({-1}).index_select(0, order);
  at::Tensor out = at::zeros_like(x);
  int64_t start = 0;
  for (int64_t j = 0; j < experts; ++j) {
    if (!replay && adapters_on_) router_load_[static_cast<size_t>(l.sparse_index * experts + j)] += count[j];
    if (count[j] == 0) continue;
    const at::Tensor tokens = token_of.narrow(0, start, count[j]);
    const at::Tensor xe = x.index_select(0, tokens);
    const at::Tensor ye = at::linear(at::silu(at::linear(xe, l.expert_gate[j])) * at::linear(xe, l.expert_up[j]),
                                     l.expert_down[j]);
    out = out.index_add(0, tokens, ye * flat_weights.narrow(0, start, count[j]).unsqueeze(1));
    start += count[j];
  }
  return out.view(h.sizes());
}

at::Tensor Qwen3ModelImpl::TakeRouterAuxLoss() {
  if (routed_prob_sums_.empty()) return at::Tensor();
  const at::Tensor chosen = at::one_hot(at::cat(routed_choices_, 0), cfg_.num_experts).to(at::kFloat);  // [L*N, k, X]
  const at::Tensor share = chosen.mean(0);  // [k, X]: f, per top-k slot as transformers
  const at::Tensor mean_prob = at::stack(routed_prob_sums_).sum(0) / static_cast<double>(chosen.size(0));  // [X]: P
  routed_prob_sums_.clear();
  routed_choices_.clear();
  return (share * mean_prob.unsqueeze(0)).sum() * static_cast<double>(cfg_.num_experts);
}

at::Tensor Qwen3ModelImpl::TakeRouterLoad() {
  const int64_t experts = cfg_.num_experts, rows = experts > 0 ? static_cast<int64_t>(router_load_.size()) / experts : 0;
  at::Tensor load = at::tensor(router_load_, at::kLong).view({rows, rows > 0 ? experts : 0});
  std::fill(router_load_.begin(), router_load_.end(), 0);
  return load;
}

KVCache Qwen3ModelImpl::NewCache(int64_t batch, int64_t limit, int64_t block) const {
  return KVCache(static_cast<int64_t>(layers_.size()), batch, cfg_.num_key_value_heads, cfg_.head_dim, limit,
                 ref_.options(), block);
}

namespace {
// The layer number of "model.layers.N.…", or -1.
int64_t LayerOf(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size()) return -1;
  int64_t n = 0;
  for (size_t i = kPrefix.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || n > (int64_t{1} << 40)) return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}
}  // namespace

bool StageHolds(const std::string& name, LayerRange range) {
  const int64_t layer = LayerOf(name);
  if (layer < 0) return range.first == 0;
  return layer >= range.first && layer < range.last;
}

Result<LayerRange> RangeOfTensors(const std::map<std::string, at::Tensor>& tensors) {
  LayerRange r{-1, -1};
  bool embeds = false;
  for (const auto& [name, t] : tensors) {
    const int64_t layer = LayerOf(name);
    if (layer < 0) {
      embeds = true;
      continue;
    }
    r.first = r.first < 0 ? layer : std::min(r.first, layer);
    r.last = std::max(r.last, layer + 1);
  }
  if (r.first < 0) return InvalidArgument("the tensors hold no decoder layer");
  if (embeds) r.first = 0;
  return r;
}

std::map<std::string, at::Tensor> Qwen3ModelImpl::Own(const std::map<std::string, at::Tensor>& weights) const {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const auto it = weights.find(item.key());
    if (it != weights.end()) out.emplace(it->first, it->second);
  }
  return out;
}

std::map<std::string, at::Tensor> Qwen3ModelImpl::StateDict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : named_parameters(/*recurse=*/true)) out[item.key()] = item.value().detach();
  return out;
}

std::map<std::string, at::Tensor> Qwen3ModelImpl::Select(bool adapters, bool storage) const {
  const at::ScalarType dtype = StorageDtype(cfg_);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    if (IsLoraTensor(item.key()) != adapters) continue;
    out[item.key()] = storage ? item.value().detach().to(at::kCPU, dtype).contiguous() : item.value().detach();
  }
  return out;
}

std::map<std::string, at::Tensor> Qwen3ModelImpl::AdapterStateDict() const { return Select(true, false); }

std::map<std::string, at::Tensor> Qwen3ModelImpl::StorageAdapterStateDict() const { return Select(true, true); }

Status Qwen3ModelImpl::LoadAdapter(const std::map<std::string, at::Tensor>& adapter, const std::string& where) {
  if (!cfg_.lora.on()) return FailedPrecondition(where + ": LoRA adapter tensors for a model without adapters");
  return CopyInto(AdapterStateDict(), adapter, where, "");
}

Result<Qwen3Model> WithLora(const Qwen3Model& base, const LoraConfig& lora, uint64_t seed) {
  if (base->config().lora.on()) return FailedPrecondition("the model has LoRA adapters already");
  ModelConfig cfg = base->config();
  cfg.lora = lora;
  ECHELON_RETURN_IF_ERROR(cfg.Validate().WithContext("learner.lora"));
  Qwen3Model out(cfg, base->range());
  out->InitWeights(seed);
  std::map<std::string, at::Tensor> weights = base->StateDict();
  for (auto& [name, t] : out->AdapterStateDict()) weights[name] = t.clone();
  ECHELON_RETURN_IF_ERROR(out->LoadStateDict(weights, "the base model"));
  return out;
}

Result<Qwen3Model> MergeLora(const Qwen3Model& adapted) {
  if (!adapted->config().lora.on()) return FailedPrecondition("merging LoRA adapters of a model without them");
  ModelConfig cfg = adapted->config();
  const double scale = cfg.lora.scale();
  cfg.lora = LoraConfig{0, cfg.lora.alpha, {}};
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, t] : adapted->StateDict())  // copies: the adapted model stays as it is
    weights[name] = t.to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  static const std::string kA = ".lora_A.weight";
  for (auto it = weights.begin(); it != weights.end();) {
    if (!IsLoraTensor(it->first)) {
      ++it;
      continue;
    }
    if (it->first.compare(it->first.size() - kA.size(), kA.size(), kA) == 0) {
      const std::string stem = it->first.substr(0, it->first.size() - kA.size());
      weights.at(stem + ".weight") += scale * at::matmul(weights.at(stem + ".lora_B.weight"), it->second);
    }
    it = weights.erase(it);
  }
  Qwen3Model out(cfg, adapted->range());
  ECHELON_RETURN_IF_ERROR(out->LoadStateDict(weights, "merged LoRA weights"));
  return out;
}

std::map<std::string, at::Tensor> Qwen3ModelImpl::StorageStateDict() const {
  const at::ScalarType dtype = StorageDtype(cfg_);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : named_parameters(/*recurse=*/true))
    out[item.key()] = item.value().detach().to(at::kCPU, dtype).contiguous();
  return out;
}

Status Qwen3ModelImpl::LoadStateDict(const std::map<std::string, at::Tensor>& weights, const std::string& where) {
  std::map<std::string, at::Tensor> params;
  for (const auto& item : named_parameters(/*recurse=*/true)) params.emplace(item.key(), item.value());
  return CopyInto(params, weights, where, cfg_.tie_word_embeddings ? "lm_head.weight" : "");
}

Status Qwen3ModelImpl::BindStateDict(const std::map<std::string, at::Tensor>& weights, const std::string& where) {
  std::map<std::string, at::Tensor> params;
  for (const auto& item : named_parameters(/*recurse=*/true)) params.emplace(item.key(), item.value());
  ECHELON_RETURN_IF_ERROR(CheckWeights(params, weights, where, cfg_.tie_word_embeddings ? "lm_head.weight" : ""));
  try {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : params) {
      at::Tensor w = weights.at(name);
      if (w.scalar_type() != p.scalar_type() || w.device() != p.device()) w = w.to(p.device(), p.scalar_type());
      p.set_data(w);
    }
  } catch (const c10::Error& e) {
    return Internal(where + ": binding weights failed: " + e.what_without_backtrace());
  }
  return Status::Ok();
}

void Qwen3ModelImpl::InitWeights(uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const bool is_norm = name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (IsLoraTensor(name)) {
      const bool is_a = name.compare(name.size() - 14, 14, ".lora_A.weight") == 0;
      const double bound = 1.0 / std::sqrt(static_cast<double>(item.value().size(1)));
      if (is_a) item.value().uniform_(-bound, bound, gen);
      else item.value().zero_();
    } else if (is_norm) {
      item.value().fill_(1.0);
    } else if (is_bias) {
      item.value().zero_();
    } else {
      item.value().normal_(0.0, 0.02, gen);
    }
  }
}

}  // namespace echelon::model
