#include "echelon/learn/layer_units.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "echelon/model/safetensors.h"

namespace echelon::learn {
namespace {

// A layer run under LayerUnits: forward with gradients on (the kernels the replay takes) on a
// detached input, returning detached outputs, so the layer's graph is dropped and only its
// input kept; backward gathers the layer again, runs it with gradients and hands its
// parameters' gradients to the units.
struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                int64_t units, int64_t index, int64_t call) {
    auto* self = reinterpret_cast<LayerUnits*>(units);
    ctx->save_for_backward({x});
    ctx->saved_data["units"] = units;
    ctx->saved_data["index"] = index;
    ctx->saved_data["call"] = call;
    self->Gather(static_cast<size_t>(index));
    std::vector<at::Tensor> out;
    {
      // With gradients on, as the replay runs, so both take the same kernels (the fused CPU
      // inference ops apply only without); the graph is dropped with the detached outputs.
      at::AutoGradMode grad(true);
      out = self->Saved(call)(x.detach(), /*replay=*/false);
    }
    for (at::Tensor& t : out) t = t.detach();
    self->Release(static_cast<size_t>(index));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<LayerUnits*>(ctx->saved_data["units"].toInt());
    const size_t index = static_cast<size_t>(ctx->saved_data["index"].toInt());
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    self->Gather(index);
    std::vector<at::Tensor> out;
    {
      at::AutoGradMode grad(true);
      out = self->Saved(ctx->saved_data["call"].toInt())(x, /*replay=*/true);
    }
    // The parameters that train (with LoRA, the adapters alone); the frozen ones get none.
    const std::vector<at::Tensor>& params = self->UnitParameters(index);
    std::vector<at::Tensor> inputs = {x};
    std::vector<size_t> trained;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].requires_grad()) continue;
      inputs.push_back(params[i]);
      trained.push_back(i);
    }
    std::vector<at::Tensor> g = torch::autograd::grad(out, inputs, grads, /*retain_graph=*/false,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
    std::vector<at::Tensor> param_grads(params.size());
    for (size_t k = 0; k < trained.size(); ++k) param_grads[trained[k]] = g[k + 1];
    self->TakeGradients(index, param_grads);
    self->Release(index);
    return {g[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void Check(const Status& s) { TORCH_CHECK(s.ok(), s.message()); }

}  // namespace

std::vector<ParameterUnit> ParameterUnits(const model::Qwen3Model& m) {
  static const std::string kLayer = "model.layers.";
  std::vector<ParameterUnit> units(m->num_layers() + 1);
  for (const auto& item : m->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    size_t u = units.size() - 1;
    if (name.rfind(kLayer, 0) == 0) u = static_cast<size_t>(std::stoll(name.substr(kLayer.size())) - m->range().first);
    units[u].names.push_back(name);
    units[u].params.push_back(item.value());
  }
  return units;
}

void LayerUnits::TakeUnits() {
  for (ParameterUnit& p : ParameterUnits(compute_)) {
    units_.emplace_back();
    static_cast<ParameterUnit&>(units_.back()) = std::move(p);
  }
}

LayerUnits::LayerUnits(model::Qwen3Model compute)
    : compute_(std::move(compute)), reducer_(nullptr), shard_(false), dtype_(compute_->dtype()), device_(compute_->device()) {
  TakeUnits();
  compute_->SetLayerHook(this);
}

LayerUnits::LayerUnits(model::Qwen3Model compute, const model::Qwen3Model& master, GradientReducer* reducer,
                       at::ScalarType dtype, at::Device device)
    : compute_(std::move(compute)),
      reducer_(reducer),
      shard_(true),
      world_(reducer->world()),
      rank_(reducer->rank()),
      dtype_(dtype),
      device_(device) {
  TakeUnits();
  const std::vector<ParameterUnit> from = ParameterUnits(master);
  TORCH_CHECK(from.size() == units_.size(), "LayerUnits: the master model has another shape");
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    for (const at::Tensor& p : unit.params) {
      unit.shapes.push_back(p.sizes().vec());
      unit.numel += p.numel();
    }
    unit.padded = (unit.numel + world_ - 1) / world_ * world_;
    std::vector<at::Tensor> whole;
    for (const at::Tensor& p : from[u].params) whole.push_back(p.detach());
    unit.shard = Cut(u, whole).requires_grad_(true);
    for (const at::Tensor& t : whole) model::ReleaseMappedPages(t);  // a mapped checkpoint's, once cut
    Release(u);
  }
  compute_->SetLayerHook(this);
}

LayerUnits::~LayerUnits() { compute_->SetLayerHook(nullptr); }

std::vector<at::Tensor> LayerUnits::Shards() const {
  std::vector<at::Tensor> out;
  for (const Unit& unit : units_) out.push_back(unit.shard);
  return out;
}

at::Tensor LayerUnits::Flat(size_t u, const std::vector<at::Tensor>& whole) const {
  at::Tensor flat = at::zeros({units_[u].padded}, at::TensorOptions().dtype(at::kFloat).device(device_));
  int64_t offset = 0;
  for (const at::Tensor& t : whole) {
    flat.narrow(0, offset, t.numel()).copy_(t.flatten());
    offset += t.numel();
  }
  return flat;
}

at::Tensor LayerUnits::Cut(size_t u, const std::vector<at::Tensor>& whole) const {
  const Unit& unit = units_[u];
  return Flat(u, whole).narrow(0, rank_ * ShardLength(unit), ShardLength(unit)).clone();
}

Result<at::Tensor> LayerUnits::CutFromRankZero(size_t u, const std::vector<at::Tensor>& whole) {
  const Unit& unit = units_[u];
  if (!shard_) return FailedPrecondition("cutting shards of units that are not sharded");
  if (rank_ == 0 && whole.size() != unit.shapes.size())
    return InvalidArgument("CutFromRankZero: unit " + std::to_string(u) + " has " + std::to_string(unit.shapes.size()) +
                           " tensors, not " + std::to_string(whole.size()));
  std::vector<at::Tensor> flat = {
      rank_ == 0 ? Flat(u, whole) : at::empty({unit.padded}, at::TensorOptions().dtype(at::kFloat).device(device_))};
  ECHELON_RETURN_IF_ERROR(reducer_->Broadcast(flat, 0));
  return flat[0].narrow(0, rank_ * ShardLength(unit), ShardLength(unit)).clone();
}

Result<std::vector<at::Tensor>> LayerUnits::Join(size_t u, const at::Tensor& mine) {
  const Unit& unit = units_[u];
  if (!shard_) return FailedPrecondition("joining shards of units that are not sharded");
  at::Tensor full = at::empty({unit.padded}, mine.options());
  ECHELON_RETURN_IF_ERROR(reducer_->AllGather(mine, full));
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const std::vector<int64_t>& shape : unit.shapes) {
    at::Tensor t = full.narrow(0, offset, c10::multiply_integers(shape)).view(shape);
    offset += t.numel();
    out.push_back(t);
  }
  return out;
}

void LayerUnits::Gather(size_t u) {
  if (!shard_) return;
  Unit& unit = units_[u];
  at::Tensor full = at::empty({unit.padded}, at::TensorOptions().dtype(dtype_).device(device_));
  Check(reducer_->AllGather(unit.shard.detach().to(dtype_), full));
  live_ += full.nbytes() - unit.gathered;
  unit.gathered = full.nbytes();
  Note(0);
  int64_t offset = 0;
  for (at::Tensor& p : unit.params) {
    const int64_t n = c10::multiply_integers(unit.shapes[&p - unit.params.data()]);
    p.set_data(full.narrow(0, offset, n).view(unit.shapes[&p - unit.params.data()]));
    offset += n;
  }
}

void LayerUnits::Release(size_t u) {
  if (!shard_) return;
  live_ -= units_[u].gathered;
  units_[u].gathered = 0;
  for (at::Tensor& p : units_[u].params) {
    p.set_data(at::empty({0}, at::TensorOptions().dtype(dtype_).device(device_)));
    p.mutable_grad() = at::Tensor();
  }
}

void LayerUnits::ScatterGradients(size_t u, at::Tensor flat, int64_t also) {
  Unit& unit = units_[u];
  Note(flat.nbytes() + also);
  at::Tensor mine = at::empty({ShardLength(unit)}, flat.options());
  Check(reducer_->ReduceScatterSum(flat, mine));
  at::Tensor& grad = unit.shard.mutable_grad();
  if (grad.defined()) {
    grad.add_(mine);
  } else {
    grad = mine;
  }
}

void LayerUnits::TakeGradients(size_t u, const std::vector<at::Tensor>& grads) {
  Unit& unit = units_[u];
  if (!shard_) {  // checkpointing alone: the gradients accumulate as autograd would
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor& g = unit.params[i].mutable_grad();
      if (g.defined()) {
        g.add_(grads[i]);
      } else {
        g = grads[i];
      }
    }
    return;
  }
  at::Tensor flat = at::zeros({unit.padded}, at::TensorOptions().dtype(at::kFloat).device(device_));
  int64_t offset = 0, held = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t n = c10::multiply_integers(unit.shapes[i]);
    if (grads[i].defined()) {
      flat.narrow(0, offset, n).copy_(grads[i].flatten());
      held += grads[i].nbytes();
    }
    offset += n;
  }
  // The head's gradients, computed first, wait for EndMicroBatch meanwhile.
  for (const at::Tensor& p : units_.back().params)
    if (p.grad().defined()) held += p.grad().nbytes();
  ScatterGradients(u, flat, held);
}

std::vector<at::Tensor> LayerUnits::Run(size_t index, const at::Tensor& x, const LayerFn& layer) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) {  // no backward: gather, run, drop
    Gather(index);
    std::vector<at::Tensor> out = layer(x, false);
    Release(index);
    return out;
  }
  calls_.push_back(layer);
  return CheckpointedLayer::apply(x, reinterpret_cast<int64_t>(this), static_cast<int64_t>(index),
                                  static_cast<int64_t>(calls_.size() - 1));
}

Status LayerUnits::BeginMicroBatch() {
  calls_.clear();
  try {
    Gather(units_.size() - 1);
  } catch (const c10::Error& e) {
    return Internal(std::string("gathering the embedding and head: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

Status LayerUnits::EndMicroBatch(bool backward) {
  calls_.clear();
  const size_t outer = units_.size() - 1;
  if (!shard_) return Status::Ok();
  try {
    if (backward) {
      Unit& unit = units_[outer];
      at::Tensor flat = at::zeros({unit.padded}, at::TensorOptions().dtype(at::kFloat).device(device_));
      int64_t offset = 0, held = 0;
      for (const at::Tensor& p : unit.params) {
        if (p.grad().defined()) {
          flat.narrow(0, offset, p.numel()).copy_(p.grad().flatten());
          held += p.grad().nbytes();
        }
        offset += p.numel();
      }
      ScatterGradients(outer, flat, held);
    }
    Release(outer);
  } catch (const c10::Error& e) {
    return Internal(std::string("reduce-scattering the embedding and head: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

Status LayerUnits::IdleRound(bool backward) {
  if (!shard_) return Status::Ok();
  const size_t layers = units_.size() - 1;
  try {
    Gather(layers);
    for (size_t u = 0; u < layers; ++u) {
      Gather(u);
      Release(u);
    }
    if (backward) {
      for (size_t u = layers; u-- > 0;) {
        Gather(u);
        ScatterGradients(u, at::zeros({units_[u].padded}, at::TensorOptions().dtype(at::kFloat).device(device_)));
        Release(u);
      }
    }
  } catch (const c10::Error& e) {
    return Internal(std::string("an idle round of the sharded layers: ") + e.what_without_backtrace());
  }
  return EndMicroBatch(backward);
}

}  // namespace echelon::learn
