#include "echelon/learn/learner.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "echelon/learn/layer_units.h"
#include "echelon/model/safetensors.h"
#include "echelon/learn/packing.h"
#include "echelon/model/token_logprobs.h"

namespace echelon::learn {

// Right-padded training batch on the CPU: input = seq[:-1], target = seq[1:]; completion tokens
// of a turn sit at target positions [prompt_len - 1, prompt_len - 1 + len).
struct TrainingBatch {
  at::Tensor input, target, mask, behav, adv;
  std::vector<size_t> row_group;  // which group each row came from
  std::vector<int64_t> row_len;   // input positions of each row (prompt + completion - 1)
  std::vector<const Routes*> row_routes;  // each row's turn's routes (router replay), nullptr: none
};

namespace {

// `trained[g][e]` false: episode e of group g is in the batch (its rows computed) but carries no
// loss (rl.overlong.filter on a truncated completion).
TrainingBatch BuildBatch(const std::vector<LearnerGroup>& groups, const std::vector<std::vector<double>>& advantages,
                         const std::vector<std::vector<bool>>& trained) {
  struct Row {
    const data::Turn* turn;
    double adv;
    size_t group;
    bool trained;
  };
  std::vector<Row> rows;
  int64_t max_len = 0;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t e = 0; e < groups[g].episodes.size(); ++e)
      for (const data::Turn& t : groups[g].episodes[e].turns) {
        if (t.tokens.empty()) continue;
        rows.push_back({&t, advantages[g][e], g, trained[g][e]});
        max_len = std::max<int64_t>(max_len, t.prompt_ids.size() + t.tokens.size() - 1);
      }
  const int64_t n = rows.size();
  TrainingBatch b;
  b.input = at::zeros({n, max_len}, at::kLong);
  b.target = at::zeros({n, max_len}, at::kLong);
  b.mask = at::zeros({n, max_len}, at::kFloat);
  b.behav = at::zeros({n, max_len}, at::kFloat);
  b.adv = at::empty({n}, at::kFloat);
  auto in = b.input.accessor<int64_t, 2>();
  auto tg = b.target.accessor<int64_t, 2>();
  auto mk = b.mask.accessor<float, 2>();
  auto bh = b.behav.accessor<float, 2>();
  auto ad = b.adv.accessor<float, 1>();
  for (int64_t r = 0; r < n; ++r) {
    const data::Turn& t = *rows[r].turn;
    std::vector<int64_t> seq(t.prompt_ids);
    seq.insert(seq.end(), t.tokens.begin(), t.tokens.end());
    for (size_t j = 0; j + 1 < seq.size(); ++j) {
      in[r][j] = seq[j];
      tg[r][j] = seq[j + 1];
    }
    const size_t start = t.prompt_ids.size() - 1;
    for (size_t k = 0; k < t.tokens.size(); ++k) {
      mk[r][start + k] = rows[r].trained ? 1.0f : 0.0f;
      bh[r][start + k] = t.logprobs[k];
    }
    ad[r] = static_cast<float>(rows[r].adv);
    b.row_group.push_back(rows[r].group);
    b.row_len.push_back(static_cast<int64_t>(seq.size()) - 1);
    b.row_routes.push_back(t.routes.empty() ? nullptr : &t.routes);
  }
  return b;
}

}  // namespace

Result<Shard> ParseShard(const std::string& name) {
  if (name == "none") return Shard::kNone;
  if (name == "optimizer") return Shard::kOptimizer;
  if (name == "params") return Shard::kParams;
  return InvalidArgument("unknown shard mode \"" + name + "\" (none, optimizer or params)");
}

Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return InvalidArgument("unknown precision \"" + name + "\" (fp32 or bf16)");
}

namespace {

// A copy of `source`'s weights on `device` in `dtype`, without gradients.
model::Qwen3Model FrozenCopy(const model::Qwen3Model& source, at::Device device, at::ScalarType dtype) {
  // Cast before anything is written: no fp32 copy of the whole model on the way.
  model::Qwen3Model copy(source->config(), model::Qwen3ModelImpl::Uninitialized{});
  copy->to(device, dtype);
  (void)copy->LoadStateDict(source->StateDict(), "copy");
  for (auto& p : copy->parameters()) p.requires_grad_(false);
  return copy;
}

// The parameters an update moves, by name in named order: every one, or with LoRA
// (config().lora) the adapter tensors alone.
std::vector<std::pair<std::string, at::Tensor>> Trained(const model::Qwen3Model& m) {
  const bool lora = m->config().lora.on();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m->named_parameters(/*recurse=*/true))
    if (!lora || model::IsLoraTensor(item.key())) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<at::Tensor> TrainedTensors(const model::Qwen3Model& m) {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : Trained(m)) out.push_back(t);
  return out;
}

// A CPU tensor's bytes (contiguous).
std::string_view BytesOf(const at::Tensor& t) { return {static_cast<const char*>(t.data_ptr()), t.nbytes()}; }

// AdamW's state of `param`, or nullptr before its first step.
const torch::optim::AdamWParamState* StateOf(const torch::optim::AdamW& optimizer, const at::Tensor& param) {
  auto it = optimizer.state().find(c10::guts::to_string(param.unsafeGetTensorImpl()));
  return it == optimizer.state().end() ? nullptr : static_cast<const torch::optim::AdamWParamState*>(it->second.get());
}

}  // namespace

Learner::Learner(model::Qwen3Model model, const LearnerOptions& options, GradientReducer* reducer)
    : model_(std::move(model)), compute_(nullptr), options_(options), reducer_(reducer), device_(options.device) {
  const bool several = reducer_ != nullptr && reducer_->world() > 1;
  const at::ScalarType compute_dtype = options.precision == Precision::kBf16 ? at::kBFloat16 : at::kFloat;
  const bool lora = model_->config().lora.on();
  TORCH_CHECK(!lora || options.shard != Shard::kParams, "Learner: LoRA adapters do not take learner.shard: params");
  for (const auto& [name, t] : Trained(model_)) shapes_.emplace_back(name, t.sizes().vec());
  // With LoRA the base weights stay as they are: no gradient, no optimizer state.
  if (lora)
    for (const auto& item : model_->named_parameters(/*recurse=*/true))
      if (!model::IsLoraTensor(item.key())) item.value().requires_grad_(false);
  sharded_ = options.shard == Shard::kOptimizer && several;
  units_sharded_ = options.shard == Shard::kParams && several;
  std::vector<at::Tensor> stepped;
  if (units_sharded_) {
    // Rank 0's whole fp32 weights stay in host memory until ShardsFromRankZero has sent every
    // unit; the device holds shards.
    model_->to(at::kCPU, at::kFloat);
    compute_ = model::Qwen3Model(model_->config(), model::Qwen3ModelImpl::Uninitialized{});  // emptied at once
    units_ = std::make_unique<LayerUnits>(compute_, model_, reducer_, compute_dtype, device_);
    if (options.loss.kl_coef > 0) {  // the KL reference sharded as the weights are, frozen
      reference_ = model::Qwen3Model(model_->config(), model::Qwen3ModelImpl::Uninitialized{});
      reference_units_ = std::make_unique<LayerUnits>(reference_, model_, reducer_, compute_dtype, device_);
      for (at::Tensor shard : reference_units_->Shards()) shard.requires_grad_(false);
    }
    if (reducer_->rank() != 0)
      for (at::Tensor& p : model_->parameters()) p.set_data(at::empty({0}, at::kFloat));
    stepped = units_->Shards();
  } else {
    if (lora && compute_dtype != at::kFloat) {
      // The frozen base straight to the device in the compute dtype (never whole there in fp32);
      // the adapters as they are, fp32: their own master weights (the model casts them as it
      // computes).
      at::NoGradGuard no_grad;
      for (const auto& item : model_->named_parameters(/*recurse=*/true))
        item.value().set_data(item.value().to(device_, model::IsLoraTensor(item.key()) ? at::kFloat : compute_dtype));
      compute_ = model_;
    } else {
      model_->to(device_, at::kFloat);
      if (compute_dtype == at::kFloat) {
        compute_ = model_;
      } else {
        compute_ = FrozenCopy(model_, device_, compute_dtype);
        for (at::Tensor& p : TrainedTensors(compute_)) p.requires_grad_(true);
      }
    }
    if (options.activation_checkpointing) units_ = std::make_unique<LayerUnits>(compute_);
    // LoRA's reference is the compute model with its adapters off (AccumulateGradients).
    if (options.loss.kl_coef > 0 && !lora) reference_ = FrozenCopy(model_, device_, compute_dtype);
    const std::vector<at::Tensor> params = TrainedTensors(model_);
    for (size_t i = 0; i < params.size(); ++i)
      if (Owns(i)) stepped.push_back(params[i]);
  }
  torch::optim::AdamWOptions o(options.lr);
  o.betas({options.beta1, options.beta2});
  o.weight_decay(options.weight_decay);
  optimizer_ = std::make_unique<torch::optim::AdamW>(stepped, o);
}

void Learner::SetLearningRate(double lr) {
  options_.lr = lr;
  for (torch::optim::OptimizerParamGroup& group : optimizer_->param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

int Learner::Owner(size_t index) const { return sharded_ ? static_cast<int>(index % reducer_->world()) : -1; }
bool Learner::Owns(size_t index) const { return !sharded_ || Owner(index) == reducer_->rank(); }

Status Learner::ShareStepped() {
  const std::vector<at::Tensor> params = TrainedTensors(model_);
  for (int owner = 0; owner < reducer_->world(); ++owner) {
    std::vector<at::Tensor> mine;
    for (size_t i = 0; i < params.size(); ++i)
      if (Owner(i) == owner) mine.push_back(params[i].detach().flatten());
    if (mine.empty()) continue;
    std::vector<at::Tensor> flat = {at::cat(mine)};
    ECHELON_RETURN_IF_ERROR(reducer_->Broadcast(flat, owner));
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (Owner(i) != owner) continue;
      params[i].copy_(flat[0].narrow(0, offset, params[i].numel()).view_as(params[i]));
      offset += params[i].numel();
    }
  }
  return Status::Ok();
}

Result<std::map<std::string, at::Tensor>> Learner::GatherOptimizerState() {
  if (units_sharded_) {
    std::map<std::string, at::Tensor> all;
    ECHELON_RETURN_IF_ERROR(JoinOptimizerUnits(
        [&](size_t u, int64_t step, const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v) {
          for (size_t k = 0; k < m.size(); ++k) {  // in host memory: the whole state would not fit the device
            const std::string& name = units_->UnitNames(u)[k];
            all[name + ".exp_avg"] = m[k].to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
            all[name + ".exp_avg_sq"] = v[k].to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
            all[name + ".step"] = at::full({1}, step, at::kLong);
          }
          return Status::Ok();
        }));
    return all;
  }
  if (!sharded_) return OptimizerState();
  const std::map<std::string, at::Tensor> mine = OptimizerState();
  const auto named = Trained(model_);
  std::map<std::string, at::Tensor> all;
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].first;
    const at::Tensor& p = named[i].second;
    // [step, exp_avg..., exp_avg_sq...] from the owner; step 0: no state yet.
    at::Tensor buf = at::zeros({1 + 2 * p.numel()}, p.options().dtype(at::kFloat));
    if (Owns(i) && mine.count(name + ".exp_avg")) {
      buf[0] = static_cast<float>(mine.at(name + ".step").item<int64_t>());
      buf.narrow(0, 1, p.numel()).copy_(mine.at(name + ".exp_avg").flatten());
      buf.narrow(0, 1 + p.numel(), p.numel()).copy_(mine.at(name + ".exp_avg_sq").flatten());
    }
    std::vector<at::Tensor> t = {buf};
    ECHELON_RETURN_IF_ERROR(reducer_->Broadcast(t, Owner(i)));
    const int64_t step = static_cast<int64_t>(t[0][0].item<float>());
    if (step == 0) {  // never stepped, as OptimizerState says it
      if (version_ > 0) all[name + ".step"] = at::zeros({1}, at::kLong);
      continue;
    }
    all[name + ".step"] = at::full({1}, step, at::kLong);
    all[name + ".exp_avg"] = t[0].narrow(0, 1, p.numel()).view_as(p).clone();
    all[name + ".exp_avg_sq"] = t[0].narrow(0, 1 + p.numel(), p.numel()).view_as(p).clone();
  }
  return all;
}

Status Learner::JoinOptimizerUnits(
    const std::function<Status(size_t, int64_t, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&)>&
        visit) {
  if (!units_sharded_) return FailedPrecondition("JoinOptimizerUnits: the parameters are not sharded");
  // Every rank steps every unit together, so the step counts agree without asking.
  const std::vector<at::Tensor> shards = units_->Shards();
  for (size_t u = 0; u < shards.size(); ++u) {
    const torch::optim::AdamWParamState* s = StateOf(*optimizer_, shards[u]);
    if (s == nullptr) continue;
    ECHELON_ASSIGN_OR_RETURN(const std::vector<at::Tensor> m, units_->Join(u, s->exp_avg()));
    ECHELON_ASSIGN_OR_RETURN(const std::vector<at::Tensor> v, units_->Join(u, s->exp_avg_sq()));
    if (reducer_->rank() == 0) ECHELON_RETURN_IF_ERROR(visit(u, s->step(), m, v));
  }
  return Status::Ok();
}

Status Learner::WriteOptimizerState(const ByteSink* sink) {
  if (!units_sharded_) return FailedPrecondition("WriteOptimizerState: the parameters are not sharded");
  const bool root = reducer_->rank() == 0;
  if (root && sink == nullptr) return InvalidArgument("WriteOptimizerState: rank 0 needs a sink");
  Status written = Status::Ok();
  const auto write = [&](std::string_view bytes) {
    if (written.ok()) written = (*sink)(bytes);
  };
  if (root) {
    // The header first, from the shapes: each unit's moments, then its step counts, in unit order.
    std::vector<model::SafetensorsEntry> entries;
    const std::vector<at::Tensor> shards = units_->Shards();
    std::map<std::string, std::vector<int64_t>> shape_of(shapes_.begin(), shapes_.end());
    for (size_t u = 0; u < shards.size(); ++u) {
      if (StateOf(*optimizer_, shards[u]) == nullptr) continue;
      const std::vector<std::string>& names = units_->UnitNames(u);
      for (const char* which : {".exp_avg", ".exp_avg_sq"})
        for (const std::string& name : names) entries.push_back({name + which, at::kFloat, shape_of.at(name)});
      for (const std::string& name : names) entries.push_back({name + ".step", at::kLong, {1}});
    }
    Result<std::string> header = model::SafetensorsHeader(entries);
    if (!header.ok()) written = header.status();
    else write(header.value());
  }
  ECHELON_RETURN_IF_ERROR(JoinOptimizerUnits(
      [&](size_t u, int64_t step, const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v) {
        for (const std::vector<at::Tensor>* moments : {&m, &v})
          for (const at::Tensor& t : *moments) write(BytesOf(t.to(at::kCPU, at::kFloat).contiguous()));
        const at::Tensor count = at::full({1}, step, at::kLong);
        for (size_t k = 0; k < m.size(); ++k) write(BytesOf(count));
        return Status::Ok();
      }));
  return written;
}

Status Learner::WriteWeights(const ByteSink* sink, at::ScalarType dtype,
                             const std::map<std::string, std::string>& metadata, std::pair<size_t, size_t> units) {
  if (!units_sharded_) return FailedPrecondition("WriteWeights: the parameters are not sharded");
  const bool root = reducer_->rank() == 0;
  if (root && sink == nullptr) return InvalidArgument("WriteWeights: rank 0 needs a sink");
  const size_t first = units.first, end = std::min(units.second, units_->num_units());
  if (first > end) return InvalidArgument("WriteWeights: units " + std::to_string(first) + " to " + std::to_string(end));
  Status written = Status::Ok();
  const auto write = [&](std::string_view bytes) {
    if (written.ok()) written = (*sink)(bytes);
  };
  if (root) {  // the header first, from the shapes, the tensors in unit order
    std::vector<model::SafetensorsEntry> entries;
    std::map<std::string, std::vector<int64_t>> shape_of(shapes_.begin(), shapes_.end());
    for (size_t u = first; u < end; ++u)
      for (const std::string& name : units_->UnitNames(u)) entries.push_back({name, dtype, shape_of.at(name)});
    Result<std::string> header = model::SafetensorsHeader(entries, metadata);
    if (!header.ok()) written = header.status();
    else write(header.value());
  }
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> shards = units_->Shards();
  for (size_t u = first; u < end; ++u) {
    // In `dtype` already: a bf16 snapshot's units travel at half the bytes (the same rounding).
    ECHELON_ASSIGN_OR_RETURN(const std::vector<at::Tensor> whole, units_->Join(u, shards[u].detach().to(dtype)));
    if (root)
      for (const at::Tensor& t : whole) write(BytesOf(t.to(at::kCPU, dtype).contiguous()));
  }
  return written;
}

std::vector<std::pair<std::vector<std::string>, uint64_t>> Learner::WeightUnits(at::ScalarType dtype) const {
  std::vector<std::pair<std::vector<std::string>, uint64_t>> out;
  if (!units_sharded_) return out;
  std::map<std::string, std::vector<int64_t>> shape_of(shapes_.begin(), shapes_.end());
  for (size_t u = 0; u < units_->num_units(); ++u) {
    uint64_t bytes = 0;
    for (const std::string& name : units_->UnitNames(u)) {
      uint64_t n = c10::elementSize(dtype);
      for (int64_t d : shape_of.at(name)) n *= static_cast<uint64_t>(d);
      bytes += n;
    }
    out.emplace_back(units_->UnitNames(u), bytes);
  }
  return out;
}

int64_t Learner::OptimizerStateBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : OptimizerState()) bytes += t.nbytes();
  if (units_sharded_)
    for (const at::Tensor& shard : units_->Shards())
      if (const torch::optim::AdamWParamState* s = StateOf(*optimizer_, shard))
        bytes += s->exp_avg().nbytes() + s->exp_avg_sq().nbytes() + static_cast<int64_t>(sizeof(int64_t));
  return bytes;
}

int64_t Learner::TrainingStateBytes() const {
  int64_t bytes = OptimizerStateBytes();
  const auto add = [&](const std::vector<at::Tensor>& tensors) {
    for (const at::Tensor& t : tensors) bytes += t.nbytes() + (t.grad().defined() ? t.grad().nbytes() : 0);
  };
  if (units_sharded_) {
    add(units_->Shards());
    add(compute_->parameters());  // empty between updates
    return bytes;
  }
  add(model_->parameters());
  if (compute_.get() != model_.get()) add(compute_->parameters());
  return bytes;
}

int64_t Learner::PeakTrainingStateBytes() const {
  return TrainingStateBytes() + (units_sharded_ ? units_->peak_transient_bytes() : 0);
}

Learner::~Learner() = default;

std::map<std::string, at::Tensor> Learner::ReferenceState() const {
  return reference_ && !reference_units_ ? reference_->StateDict() : std::map<std::string, at::Tensor>();
}

std::map<std::string, at::Tensor> Learner::OptimizerState() const {
  std::map<std::string, at::Tensor> out;
  if (units_sharded_) return out;  // shards, not parameters: GatherOptimizerState
  const auto trained = Trained(model_);
  for (size_t i = 0; i < trained.size(); ++i) {
    const auto& [name, param] = trained[i];
    const torch::optim::AdamWParamState* s = StateOf(*optimizer_, param);
    if (s == nullptr) {
      // Never stepped (no gradient yet: an expert no token has reached) after an update: a
      // step count of 0 alone, so a resume knows the parameter is this model's.
      if (Owns(i) && version_ > 0) out[name + ".step"] = at::zeros({1}, at::kLong);
      continue;
    }
    out[name + ".exp_avg"] = s->exp_avg().detach();
    out[name + ".exp_avg_sq"] = s->exp_avg_sq().detach();
    out[name + ".step"] = at::full({1}, s->step(), at::kLong);
  }
  return out;
}

Status Learner::ShardsFromRankZero(const std::map<std::string, at::Tensor>* optimizer_state, bool with_optimizer,
                                   const std::map<std::string, at::Tensor>* reference) {
  if (!units_sharded_) return FailedPrecondition("ShardsFromRankZero: the parameters are not sharded");
  const bool root = reducer_->rank() == 0;
  if (root && with_optimizer && optimizer_state == nullptr)
    return InvalidArgument("ShardsFromRankZero: rank 0 needs the optimizer state it sends");
  at::NoGradGuard no_grad;
  const std::vector<ParameterUnit> master = root ? ParameterUnits(model_) : std::vector<ParameterUnit>();
  const std::vector<at::Tensor> shards = units_->Shards();
  // Rank 0's state by unit (Restore checked it is whole); elsewhere nothing.
  const auto state_of = [&](size_t u, const char* which) {
    std::vector<at::Tensor> out;
    if (root)
      for (const std::string& name : units_->UnitNames(u)) out.push_back(optimizer_state->at(name + which));
    return out;
  };
  const bool whole_reference = root && reference != nullptr && !reference->empty();
  for (size_t u = 0; u < shards.size(); ++u) {
    // Rank 0 releases each whole tensor once its unit is sent (a mapped checkpoint's pages).
    const auto cut = [&](LayerUnits& units, const std::vector<at::Tensor>& whole) -> Result<at::Tensor> {
      Result<at::Tensor> mine = units.CutFromRankZero(u, whole);
      for (const at::Tensor& t : whole) model::ReleaseMappedPages(t);
      return mine;
    };
    ECHELON_ASSIGN_OR_RETURN(const at::Tensor w, cut(*units_, root ? master[u].params : std::vector<at::Tensor>()));
    shards[u].detach().copy_(w);
    if (reference_units_) {
      std::vector<at::Tensor> whole;  // rank 0's: the reference it was given, else the weights
      if (whole_reference)
        for (const std::string& name : units_->UnitNames(u)) whole.push_back(reference->at(name));
      else if (root)
        whole = master[u].params;
      ECHELON_ASSIGN_OR_RETURN(const at::Tensor r, cut(*reference_units_, whole));
      reference_units_->Shards()[u].detach().copy_(r);
    }
    if (!with_optimizer) continue;
    ECHELON_ASSIGN_OR_RETURN(at::Tensor m, cut(*units_, state_of(u, ".exp_avg")));
    ECHELON_ASSIGN_OR_RETURN(at::Tensor v, cut(*units_, state_of(u, ".exp_avg_sq")));
    std::vector<at::Tensor> step = {root ? optimizer_state->at(units_->UnitNames(u).front() + ".step").to(at::kLong)
                                         : at::zeros({1}, at::kLong)};
    ECHELON_RETURN_IF_ERROR(reducer_->Broadcast(step, 0));
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step[0].item<int64_t>());
    s->exp_avg(std::move(m));
    s->exp_avg_sq(std::move(v));
    optimizer_->state()[c10::guts::to_string(shards[u].unsafeGetTensorImpl())] = std::move(s);
  }
  // Every rank has its shards now: rank 0's whole weights are no longer needed (its weights
  // are gathered unit by unit when wanted: WriteWeights).
  if (root)
    for (at::Tensor& p : model_->parameters()) p.set_data(at::empty({0}, at::kFloat));
  return Status::Ok();
}

Status Learner::Restore(int64_t version, const std::map<std::string, at::Tensor>& optimizer_state,
                        const std::map<std::string, at::Tensor>& reference_weights) {
  if (version < 0) return InvalidArgument("restoring a negative policy version " + std::to_string(version));
  // Check everything before changing anything.
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::AdamWParamState>>> restored;
  size_t used = 0, covered = 0;
  const std::vector<at::Tensor> params = TrainedTensors(model_);
  for (size_t i = 0; i < shapes_.size(); ++i) {
    const auto& [name, shape] = shapes_[i];
    auto step = optimizer_state.find(name + ".step");
    if (step == optimizer_state.end()) continue;
    auto m = optimizer_state.find(name + ".exp_avg");
    auto v = optimizer_state.find(name + ".exp_avg_sq");
    if (m == optimizer_state.end() && v == optimizer_state.end() && step->second.numel() == 1 &&
        step->second.scalar_type() == at::kLong && step->second.item<int64_t>() == 0) {
      // Never stepped (OptimizerState): no moments to restore.
      if (units_sharded_) return DataLoss("optimizer state of " + name + " is empty, but its unit steps as a whole");
      used += 1;
      ++covered;
      continue;
    }
    if (m == optimizer_state.end() || v == optimizer_state.end())
      return DataLoss("optimizer state of " + name + " is incomplete (exp_avg and exp_avg_sq are both needed)");
    if (m->second.sizes().vec() != shape || v->second.sizes().vec() != shape)
      return DataLoss("optimizer state of " + name + " has the wrong shape");
    if (step->second.numel() != 1 || step->second.scalar_type() != at::kLong)
      return DataLoss("optimizer step count of " + name + " must be one int64");
    used += 3;
    ++covered;
    if (units_sharded_ || !Owns(i)) continue;  // shards below; another rank's share
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step->second.item<int64_t>());
    s->exp_avg(m->second.to(device_, at::kFloat).clone());
    s->exp_avg_sq(v->second.to(device_, at::kFloat).clone());
    restored.emplace_back(params[i], std::move(s));
  }
  if (used != optimizer_state.size())
    return DataLoss("optimizer state holds " + std::to_string(optimizer_state.size() - used) +
                    " tensors that name no parameter of this model");
  if (covered > 0 && covered != shapes_.size())
    return DataLoss("optimizer state covers " + std::to_string(covered) + " of " + std::to_string(shapes_.size()) +
                    " parameters");
  if (units_sharded_ && covered > 0) {
    // This rank's part of each unit's state, cut as its weights are; one step count per unit.
    const std::vector<at::Tensor> shards = units_->Shards();
    for (size_t u = 0; u < shards.size(); ++u) {
      const std::vector<std::string>& names = units_->UnitNames(u);
      std::vector<at::Tensor> m, v;
      const int64_t step = optimizer_state.at(names.front() + ".step").item<int64_t>();
      for (const std::string& name : names) {
        if (optimizer_state.at(name + ".step").item<int64_t>() != step)
          return DataLoss("optimizer step counts differ within the unit of " + name + " (" + names.front() +
                          " has " + std::to_string(step) + "): sharded parameters step a unit together");
        m.push_back(optimizer_state.at(name + ".exp_avg"));
        v.push_back(optimizer_state.at(name + ".exp_avg_sq"));
      }
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step);
      s->exp_avg(units_->Cut(u, m));
      s->exp_avg_sq(units_->Cut(u, v));
      for (const std::vector<at::Tensor>* moments : {&m, &v})
        for (const at::Tensor& t : *moments) model::ReleaseMappedPages(t);  // a mapped checkpoint's, once cut
      restored.emplace_back(shards[u], std::move(s));
    }
  }
  std::vector<std::vector<at::Tensor>> reference_units;  // sharded: each unit's whole reference tensors
  if (reference_units_ && !reference_weights.empty()) {
    std::map<std::string, std::vector<int64_t>> shape_of(shapes_.begin(), shapes_.end());
    for (size_t u = 0; u < reference_units_->num_units(); ++u) {
      reference_units.emplace_back();
      for (const std::string& name : reference_units_->UnitNames(u)) {
        auto it = reference_weights.find(name);
        if (it == reference_weights.end()) return DataLoss("reference policy: " + name + " is missing");
        if (it->second.sizes().vec() != shape_of.at(name))
          return DataLoss("reference policy: " + name + " has the wrong shape");
        reference_units.back().push_back(it->second);
      }
    }
    if (shapes_.size() != reference_weights.size())
      return DataLoss("reference policy: " + std::to_string(reference_weights.size() - shapes_.size()) +
                      " tensors name no parameter of this model");
  } else if (reference_ && !reference_units_) {
    ECHELON_RETURN_IF_ERROR(reference_->LoadStateDict(reference_weights, "reference policy"));
  }
  {
    at::NoGradGuard no_grad;
    for (size_t u = 0; u < reference_units.size(); ++u) {
      reference_units_->Shards()[u].copy_(reference_units_->Cut(u, reference_units[u]));
      for (const at::Tensor& t : reference_units[u]) model::ReleaseMappedPages(t);
    }
  }
  auto& state = optimizer_->state();
  state.clear();
  for (auto& [param, s] : restored) state[c10::guts::to_string(param.unsafeGetTensorImpl())] = std::move(s);
  version_ = version;
  return Status::Ok();
}

namespace {

// pi_prox (the start-of-update log-probs, on the CPU, shaped like the batch) against the
// behaviour log-probs: the mean |gap| overall and per group, and each group's importance sums
// (with the tokens `options`' correction drops).
void StartOfUpdateStats(const at::Tensor& start_logp, const PolicyLossOptions& options,
                        const TrainingBatch& b, size_t num_groups, StepStats* stats) {
  const at::Tensor denom = at::clamp_min(b.mask.sum(), 1.0);
  const at::Tensor gap = (start_logp - b.behav).abs() * b.mask;
  stats->logprob_gap = gap.sum().div(denom).item<double>();
  // Per group: a worker whose log-probs disagree with the learner's stands out here.
  const at::Tensor row_gap_t = gap.sum(1), row_tokens_t = b.mask.sum(1);
  auto row_gap = row_gap_t.accessor<float, 1>();
  auto row_tokens = row_tokens_t.accessor<float, 1>();
  std::vector<double> gap_sum(num_groups, 0.0), token_sum(num_groups, 0.0);
  for (size_t r = 0; r < b.row_group.size(); ++r) {
    gap_sum[b.row_group[r]] += row_gap[r];
    token_sum[b.row_group[r]] += row_tokens[r];
  }
  for (size_t g = 0; g < num_groups; ++g)
    stats->group_logprob_gap.push_back(token_sum[g] > 0 ? gap_sum[g] / token_sum[g] : 0.0);
  const at::Tensor log_w = start_logp - b.behav;
  const std::vector<ImportanceSums> rows = RowImportanceSums(log_w, b.mask, DroppedTokens(log_w, options));
  stats->group_importance.assign(num_groups, {});
  for (size_t r = 0; r < rows.size(); ++r) stats->group_importance[b.row_group[r]].Add(rows[r]);
}

// Rows of the batch split into `parts` runs of whole groups (rows of a group are adjacent).
std::vector<at::Tensor> MinibatchRows(const TrainingBatch& b, size_t num_groups, int64_t parts) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(parts));
  for (size_t r = 0; r < b.row_group.size(); ++r)
    rows[b.row_group[r] * static_cast<size_t>(parts) / num_groups].push_back(static_cast<int64_t>(r));
  std::vector<at::Tensor> out;
  for (const auto& part : rows)
    if (!part.empty()) out.push_back(at::tensor(part, at::kLong));
  return out;
}

}  // namespace

// A minibatch's statistics, weighted by each micro-batch's share of its tokens (so they sum to
// the whole minibatch's token means), and the start-of-update log-probs of its rows.
struct Learner::Minibatch {
  double loss = 0, clip_frac = 0, kl = 0, behav_weight_mean = 0, router_aux_loss = 0, entropy = 0;
  double clip_frac_low = 0, clip_frac_high = 0, clip_frac_dual = 0;
  double max_token_weight = 0;  // this rank's (the ranks sum, not max, what they share)
  double group_share_max = 0;   // of the whole minibatch's loss (every rank computes the same shares)
  ImportanceHealth health;
  int64_t computed_positions = 0, sequence_positions = 0;  // of this rank's gradient forwards
  at::Tensor start_logp;  // [rows, T] on the CPU; undefined when pi_prox was computed up front
  std::vector<StepStats::RouteCounts> group_routes;  // router replay's outcomes per group (summed over ranks)
};

std::vector<at::Tensor> Learner::MicroBatches(const TrainingBatch& b, const at::Tensor& rows) const {
  const size_t world = reducer_ != nullptr ? static_cast<size_t>(reducer_->world()) : 1;
  // One forward/backward on one rank: the rows as they are (padded: the update of earlier
  // releases, to the bit).
  if (options_.micro_batch_tokens <= 0 && world == 1) return {rows};
  std::vector<int64_t> order(rows.data_ptr<int64_t>(), rows.data_ptr<int64_t>() + rows.numel());
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return b.row_len[x] > b.row_len[y]; });
  // Units of work, each `width` positions wide: padded, the rows longest first (a part is padded
  // to its first row); packed, the rows in bins as wide as the longest row, nearly full.
  // Packing that saves too few rows is not worth its extra work (PackingPays): padded units.
  std::vector<std::vector<size_t>> bins;
  if (options_.pack_sequences && !order.empty()) {
    std::vector<int64_t> lengths;
    for (int64_t r : order) lengths.push_back(b.row_len[r]);
    bins = PackFirstFitDecreasing(lengths, lengths.front());
  }
  std::vector<std::vector<int64_t>> units;
  std::vector<int64_t> width;
  if (!bins.empty() && PackingPays(order.size(), bins.size())) {
    for (const std::vector<size_t>& bin : bins) {
      units.emplace_back();
      for (size_t i : bin) units.back().push_back(order[i]);
      width.push_back(b.row_len[order.front()]);
    }
  } else {
    for (int64_t r : order) {
      units.push_back({r});
      width.push_back(b.row_len[r]);
    }
  }
  // A part of k units costs k x its first unit's width; a unit wider than the budget goes alone.
  const int64_t budget = options_.micro_batch_tokens > 0 ? options_.micro_batch_tokens : INT64_MAX;
  std::vector<std::vector<int64_t>> parts;
  int64_t part_units = 0, part_width = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (parts.empty() || (part_units + 1) * part_width > budget) {
      parts.emplace_back();
      part_units = 0;
      part_width = width[u];
    }
    parts.back().insert(parts.back().end(), units[u].begin(), units[u].end());
    ++part_units;
  }
  // Every rank needs a share: at least `world` parts when there are enough rows.
  if (parts.size() < world && order.size() >= world) {
    parts.assign(world, {});
    for (size_t i = 0; i < order.size(); ++i) parts[i * world / order.size()].push_back(order[i]);
  }
  std::vector<at::Tensor> out;
  for (const auto& p : parts) out.push_back(at::tensor(p, at::kLong));
  return out;
}

// Router replay in one forward: the tape the model is given and, per layer, the batch row of
// each forced entry (to count its outcome against its group).
struct Learner::RouteReplay {
  model::RouteTape tape;
  std::vector<std::vector<size_t>> entry_row;
  std::vector<StepStats::RouteCounts>* counts = nullptr;  // per group; nullptr: not counted

  // The tape of `rows`' routes, each at flat_of(i, position) for row i of `rows`.
  void Build(const model::Qwen3Model& m, const TrainingBatch& b, const int64_t* rows, int64_t n, double trust,
             const std::function<int64_t(size_t, int64_t)>& flat_of) {
    std::vector<const Routes*> routes;
    for (int64_t i = 0; i < n; ++i) routes.push_back(b.row_routes[static_cast<size_t>(rows[i])]);
    tape = model::ForcingTape(routes, m->config().num_hidden_layers, trust, flat_of, &entry_row);
    for (auto& layer : entry_row)
      for (size_t& i : layer) i = static_cast<size_t>(rows[i]);
  }
  // After the forward (the tape stays for the backward's recomputation): the outcomes counted.
  void Count(const TrainingBatch& b) {
    if (counts == nullptr) return;
    for (size_t l = 0; l < tape.outcome.size(); ++l) {
      if (!tape.outcome[l].defined()) continue;
      const int8_t* o = tape.outcome[l].data_ptr<int8_t>();
      for (size_t j = 0; j < entry_row[l].size(); ++j) {
        StepStats::RouteCounts& c = (*counts)[b.row_group[entry_row[l][j]]];
        ++(o[j] == model::RouteTape::kSame ? c.same : o[j] == model::RouteTape::kApplied ? c.applied : c.refused);
      }
    }
  }
};

at::Tensor Learner::LogProbs(model::Qwen3Model& m, const TrainingBatch& b, const at::Tensor& rows, int64_t len,
                             int64_t* computed, at::Tensor* entropy, RouteReplay* replay) {
  const int64_t n = rows.numel();
  const int64_t* row = rows.data_ptr<int64_t>();
  if (!options_.router_replay || !m->config().moe()) replay = nullptr;
  // forward()'s hidden states, with the rows' routes forced at flat_of(i, position) when replaying.
  const auto hidden_of = [&](const std::function<int64_t(size_t, int64_t)>& flat_of,
                             const std::function<at::Tensor()>& forward) {
    if (replay == nullptr) return forward();
    replay->Build(m, b, row, n, options_.router_replay_trust, flat_of);
    const model::RouteTapeScope armed(m, &replay->tape);
    at::Tensor hidden = forward();
    replay->Count(b);
    return hidden;
  };
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) lengths[i] = b.row_len[row[i]];
  std::vector<std::vector<size_t>> packed;
  if (options_.pack_sequences) packed = PackFirstFitDecreasing(lengths, len);
  if (packed.empty() || !PackingPays(static_cast<size_t>(n), packed.size())) {
    if (computed != nullptr) *computed += n * len;
    const at::Tensor input = b.input.index_select(0, rows).narrow(1, 0, len).to(device_);
    const at::Tensor target = b.target.index_select(0, rows).narrow(1, 0, len).to(device_);
    const at::Tensor positions = at::arange(len, input.options()).unsqueeze(0).expand_as(input);
    const at::Tensor hidden = hidden_of([&](size_t i, int64_t p) { return static_cast<int64_t>(i) * len + p; },
                                        [&] { return m->Hidden(input, positions, at::Tensor()); });
    return model::TokenLogProbs(hidden, m->head(), target, options_.temperature, entropy);
  }
  // The rows back to back in packed rows of width `len`; the log-probs come back to the padded
  // layout [rows, len] (zero past a row's length) through one gather.
  const int64_t bins = static_cast<int64_t>(packed.size());
  if (computed != nullptr) *computed += bins * len;
  at::Tensor ids = at::zeros({bins, len}, at::kLong), target = at::zeros({bins, len}, at::kLong);
  at::Tensor positions = at::zeros({bins, len}, at::kLong), segments = at::full({bins, len}, -1, at::kLong);
  at::Tensor from = at::zeros({n, len}, at::kLong), real = at::zeros({n, len}, at::kBool);
  auto in = b.input.accessor<int64_t, 2>(), tg = b.target.accessor<int64_t, 2>();
  auto id = ids.accessor<int64_t, 2>(), tp = target.accessor<int64_t, 2>(), ps = positions.accessor<int64_t, 2>();
  auto sg = segments.accessor<int64_t, 2>(), fr = from.accessor<int64_t, 2>();
  auto rl = real.accessor<bool, 2>();
  for (int64_t k = 0; k < bins; ++k) {
    int64_t offset = 0;
    for (size_t i : packed[k]) {
      for (int64_t j = 0; j < lengths[i]; ++j) {
        id[k][offset + j] = in[row[i]][j];
        tp[k][offset + j] = tg[row[i]][j];
        ps[k][offset + j] = j;
        sg[k][offset + j] = static_cast<int64_t>(i);
        fr[i][j] = k * len + offset + j;
        rl[i][j] = true;
      }
      offset += lengths[i];
    }
  }
  at::Tensor packed_entropy;
  const at::Tensor hidden =
      hidden_of([&](size_t i, int64_t p) { return fr[static_cast<int64_t>(i)][p]; },
                [&] { return m->Hidden(ids.to(device_), positions.to(device_), segments.to(device_)); });
  const at::Tensor logp = model::TokenLogProbs(hidden, m->head(), target.to(device_), options_.temperature,
                                               entropy != nullptr ? &packed_entropy : nullptr);
  // Back to the padded layout [rows, len] (zero past a row's length) through one gather.
  const at::Tensor index = from.flatten().to(device_), padding = real.to(device_).logical_not();
  if (entropy != nullptr)
    *entropy = packed_entropy.flatten().index_select(0, index).view({n, len}).masked_fill(padding, 0.0);
  return logp.flatten().index_select(0, index).view({n, len}).masked_fill(padding, 0.0);
}

namespace {

int64_t Width(const TrainingBatch& b, const at::Tensor& rows) {
  int64_t len = 0;
  for (int64_t i = 0; i < rows.numel(); ++i) len = std::max(len, b.row_len[rows.data_ptr<int64_t>()[i]]);
  return len;
}

// `rows` of a [N, T] CPU tensor, the first `len` columns, on `device`.
at::Tensor Rows(const at::Tensor& t, const at::Tensor& rows, int64_t len, at::Device device) {
  return t.index_select(0, rows).narrow(1, 0, len).to(device);
}

}  // namespace

Status Learner::ForEachMine(size_t n, LayerUnits* units, bool backward, const std::function<Status(size_t)>& round) {
  const size_t world = reducer_ != nullptr ? static_cast<size_t>(reducer_->world()) : 1;
  const size_t rank = reducer_ != nullptr ? static_cast<size_t>(reducer_->rank()) : 0;
  for (size_t first = 0; first < n; first += world) {
    if (first + rank < n) {
      ECHELON_RETURN_IF_ERROR(round(first + rank));
    } else if (units_sharded_) {
      ECHELON_RETURN_IF_ERROR(units->IdleRound(backward));
    }
  }
  return Status::Ok();
}

Status Learner::AccumulateGradients(const TrainingBatch& b, const at::Tensor& rows, const at::Tensor& prox,
                                    const at::Tensor& ref, double m2po_bound, Minibatch* mb) {
  const double tokens = b.mask.index_select(0, rows).sum().item<double>();
  // Each token's share of this minibatch's loss (rl.loss_aggregation), over all its rows, so the
  // micro-batches' losses add up to the minibatch's however it is cut.
  at::Tensor shares = at::zeros_like(b.mask);
  std::vector<int64_t> groups;
  const auto row_index = rows.accessor<int64_t, 1>();
  for (int64_t i = 0; i < rows.size(0); ++i) groups.push_back(static_cast<int64_t>(b.row_group[row_index[i]]));
  const at::Tensor capped = CapGroupShares(
      TokenShares(b.mask.index_select(0, rows), options_.loss_aggregation, options_.max_new_tokens), groups,
      options_.max_group_share);
  shares.index_put_({rows}, capped);
  mb->group_share_max = LargestGroupShare(capped, groups);
  if (!prox.defined()) mb->start_logp = at::zeros_like(b.mask);
  compute_->zero_grad();
  if (units_sharded_)
    for (at::Tensor shard : units_->Shards()) shard.mutable_grad() = at::Tensor();
  const std::vector<at::Tensor> micro = MicroBatches(b, rows);
  return ForEachMine(micro.size(), units_.get(), /*backward=*/true, [&](size_t i) -> Status {
    const at::Tensor& u = micro[i];
    if (units_) ECHELON_RETURN_IF_ERROR(units_->BeginMicroBatch());
    const int64_t len = Width(b, u);
    PolicyLossInputs in;
    const bool aux = options_.router_aux_coef > 0 && compute_->config().moe();
    compute_->RecordRouting(aux);
    at::Tensor entropy;
    RouteReplay replay;  // lives through the backward pass below
    replay.counts = &mb->group_routes;
    in.logp = LogProbs(compute_, b, u, len, &mb->computed_positions, &entropy, &replay);
    compute_->RecordRouting(false);
    for (int64_t k = 0; k < u.numel(); ++k) mb->sequence_positions += b.row_len[u.data_ptr<int64_t>()[k]];
    in.behav_logp = Rows(b.behav, u, len, device_);
    in.mask = Rows(b.mask, u, len, device_);
    in.advantages = b.adv.index_select(0, u).to(device_);
    in.token_share = Rows(shares, u, len, device_);
    in.m2po_bound = m2po_bound;
    if (prox.defined()) in.prox_logp = Rows(prox, u, len, device_);
    if (ref.defined()) in.ref_logp = Rows(ref, u, len, device_);
    const PolicyLossOutput out = PolicyLoss(in, options_.loss);
    // The loss is this micro-batch's part of the minibatch's (token shares); its token means
    // (statistics, the router's loss) count by its share of the minibatch's tokens.
    const double w = in.mask.sum().item<double>() / std::max(tokens, 1.0);
    at::Tensor loss = out.loss;
    if (aux) {
      const at::Tensor balance = compute_->TakeRouterAuxLoss();
      loss = loss + options_.router_aux_coef * w * balance.to(loss.scalar_type());
      mb->router_aux_loss += w * balance.item<double>();
    }
    loss.backward();
    if (units_) ECHELON_RETURN_IF_ERROR(units_->EndMicroBatch(/*backward=*/true));
    mb->loss += out.loss.item<double>();
    mb->entropy += w * ((entropy * in.mask).sum() / at::clamp_min(in.mask.sum(), 1.0)).item<double>();
    mb->clip_frac += w * out.clip_frac;
    mb->clip_frac_low += w * out.clip_frac_low;
    mb->clip_frac_high += w * out.clip_frac_high;
    mb->clip_frac_dual += w * out.clip_frac_dual;
    mb->kl += w * out.kl;
    mb->behav_weight_mean += w * out.behav_weight_mean;
    mb->max_token_weight = std::max(mb->max_token_weight, out.max_token_weight);
    mb->health.Add(out.health, w);
    if (mb->start_logp.defined())
      mb->start_logp.index_put_({u, at::indexing::Slice(0, len)}, in.logp.detach().to(at::kCPU));
    return Status::Ok();
  });
}

Result<double> Learner::ApplyGradients(Minibatch* mb) {
  std::vector<at::Tensor> master = TrainedTensors(model_), compute = TrainedTensors(compute_);
  if (reducer_ != nullptr && reducer_->world() > 1) {
    // One flat fp32 vector: every gradient, the statistics, the start log-probs.
    // (Sharded parameters: the gradients were reduce-scattered layer by layer already.)
    std::vector<at::Tensor> parts;
    const at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat).device(device_);
    if (!units_sharded_)
      for (const at::Tensor& p : compute)
        parts.push_back(p.grad().defined() ? p.grad().flatten().to(at::kFloat) : at::zeros({p.numel()}, floats));
    const ImportanceHealth& h = mb->health;
    parts.push_back(at::tensor({mb->loss, mb->clip_frac, mb->kl, mb->behav_weight_mean, h.weight_mean, h.weight_m2,
                                h.logratio_m2, h.masked_frac, mb->router_aux_loss, mb->entropy, mb->clip_frac_low,
                                mb->clip_frac_high, mb->clip_frac_dual},
                               at::kDouble)
                        .to(device_, at::kFloat));
    if (mb->start_logp.defined()) parts.push_back(mb->start_logp.flatten().to(device_));
    std::vector<double> routes;
    for (const StepStats::RouteCounts& c : mb->group_routes)
      routes.insert(routes.end(), {double(c.same), double(c.applied), double(c.refused)});
    if (!routes.empty()) parts.push_back(at::tensor(routes, at::kDouble).to(device_, at::kFloat));
    at::Tensor flat = at::cat(parts);
    parts.clear();
    ECHELON_RETURN_IF_ERROR(reducer_->AllReduceSum(flat));
    int64_t offset = 0;
    if (!units_sharded_) {
      // The master's gradients become views of the sum (each replaced gradient freed): the
      // exchange costs one more set of gradients at its peak, not two.
      for (at::Tensor& p : master) {
        p.mutable_grad() = flat.narrow(0, offset, p.numel()).view_as(p);
        offset += p.numel();
      }
    }
    const at::Tensor stats = flat.narrow(0, offset, 13).to(at::kCPU, at::kDouble);
    offset += 13;
    mb->loss = stats[0].item<double>();
    mb->clip_frac = stats[1].item<double>();
    mb->kl = stats[2].item<double>();
    mb->behav_weight_mean = stats[3].item<double>();
    mb->health = {stats[4].item<double>(), stats[5].item<double>(), stats[6].item<double>(), stats[7].item<double>()};
    mb->router_aux_loss = stats[8].item<double>();
    mb->entropy = stats[9].item<double>();
    mb->clip_frac_low = stats[10].item<double>();
    mb->clip_frac_high = stats[11].item<double>();
    mb->clip_frac_dual = stats[12].item<double>();
    if (mb->start_logp.defined()) {
      mb->start_logp = flat.narrow(0, offset, mb->start_logp.numel()).view_as(mb->start_logp).to(at::kCPU);
      offset += mb->start_logp.numel();
    }
    if (!routes.empty()) {
      const at::Tensor summed = flat.narrow(0, offset, static_cast<int64_t>(routes.size())).to(at::kCPU, at::kLong);
      const int64_t* c = summed.data_ptr<int64_t>();
      for (size_t g = 0; g < mb->group_routes.size(); ++g)
        mb->group_routes[g] = {c[3 * g], c[3 * g + 1], c[3 * g + 2]};
    }
  } else if (compute_.get() != model_.get()) {
    for (size_t i = 0; i < master.size(); ++i)
      if (compute[i].grad().defined()) master[i].mutable_grad() = compute[i].grad().to(at::kFloat);
  }
  if (units_sharded_) return StepShards(mb->loss);
  const double norm = torch::nn::utils::clip_grad_norm_(master, options_.max_grad_norm);
  // A non-finite loss or gradient (a ratio overflowing on hostile behaviour log-probs, a
  // numerical blow-up) would write NaN weights that every actor then receives: no step. Every
  // rank sees the same summed values, so all of them skip together.
  if (!std::isfinite(norm) || !std::isfinite(mb->loss)) return std::numeric_limits<double>::quiet_NaN();
  optimizer_->step();
  if (sharded_) ECHELON_RETURN_IF_ERROR(ShareStepped());
  if (compute_.get() != model_.get()) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < master.size(); ++i) compute[i].copy_(master[i]);
  }
  return norm;
}

Result<double> Learner::StepShards(double loss) {
  // clip_grad_norm_'s arithmetic over the shards: the squared norms summed over the ranks.
  const std::vector<at::Tensor> shards = units_->Shards();
  at::Tensor squares = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (const at::Tensor& shard : shards) squares += shard.grad().pow(2).sum();
  ECHELON_RETURN_IF_ERROR(reducer_->AllReduceSum(squares));
  const at::Tensor norm = squares.sqrt();
  const double value = norm.item<double>();
  if (!std::isfinite(value) || !std::isfinite(loss)) return std::numeric_limits<double>::quiet_NaN();
  const at::Tensor coef = at::clamp(options_.max_grad_norm / (norm + 1e-6), c10::nullopt, 1.0);
  for (const at::Tensor& shard : shards) shard.grad().mul_(coef);
  optimizer_->step();
  return value;
}

Result<at::Tensor> Learner::StartLogProbs(const TrainingBatch& b, bool reference) {
  at::NoGradGuard no_grad;
  // The KL reference: its frozen copy (sharded or whole), or LoRA's base (the adapters off).
  model::Qwen3Model& m = reference && reference_ ? reference_ : compute_;
  LayerUnits* units = reference ? reference_units_.get() : units_.get();
  std::optional<model::AdaptersOffScope> base;
  if (reference && !reference_) base.emplace(compute_);
  at::Tensor out = at::zeros_like(b.mask);
  const at::Tensor all = at::arange(b.mask.size(0), at::kLong);
  const std::vector<at::Tensor> micro = MicroBatches(b, all);
  ECHELON_RETURN_IF_ERROR(ForEachMine(micro.size(), units, /*backward=*/false, [&](size_t i) -> Status {
    const int64_t len = Width(b, micro[i]);
    if (units) ECHELON_RETURN_IF_ERROR(units->BeginMicroBatch());
    RouteReplay replay;  // the policy's forwards replay routes; the reference routes by itself
    out.index_put_({micro[i], at::indexing::Slice(0, len)},
                   LogProbs(m, b, micro[i], len, nullptr, nullptr, reference ? nullptr : &replay).to(at::kCPU));
    if (units) return units->EndMicroBatch(/*backward=*/false);
    return Status::Ok();
  }));
  if (reducer_ != nullptr && reducer_->world() > 1) {
    at::Tensor flat = out.flatten().to(device_);
    ECHELON_RETURN_IF_ERROR(reducer_->AllReduceSum(flat));
    out = flat.view_as(out).to(at::kCPU);
  }
  return out;
}

Result<StepStats> Learner::Step(const std::vector<LearnerGroup>& groups) {
  StepStats stats;
  std::vector<std::vector<double>> advantages;
  std::vector<std::vector<bool>> trained;
  for (const LearnerGroup& g : groups) {
    std::vector<double> rewards, shaped;
    trained.emplace_back();
    for (const data::Episode& e : g.episodes) {
      // The longest turn's length, and whether a turn was cut at the limit (rl.overlong).
      int64_t longest = 0;
      bool cut = false;
      for (const data::Turn& t : e.turns) {
        longest = std::max<int64_t>(longest, static_cast<int64_t>(t.tokens.size()));
        cut = cut || Truncated(t.tokens, options_.max_new_tokens, options_.stop_ids);
      }
      rewards.push_back(e.reward);
      shaped.push_back(e.reward + OverlongPenalty(longest, options_.max_new_tokens, options_.overlong));
      trained.back().push_back(!(cut && options_.overlong.filter));
      stats.truncated += cut ? 1 : 0;
      ++stats.episodes;
    }
    advantages.push_back(GroupAdvantages(shaped, options_.scale_by_std));
    bool spread = false;
    for (double r : rewards) spread = spread || r != rewards.front();
    stats.zero_spread_groups += spread ? 0 : 1;
  }
  const TrainingBatch b = BuildBatch(groups, advantages, trained);
  if (b.input.size(0) == 0) return InvalidArgument("learner step with no completion tokens");
  (void)compute_->TakeRouterLoad();  // what evaluation routed since the last update
  stats.tokens = static_cast<int64_t>(b.mask.sum().item<double>());
  compute_->train();
  // With one optimizer step per update pi_prox is the forward pass itself; with several
  // (minibatches of whole groups) it is the policy at the start of the update, so from the
  // second minibatch on the clipped ratio against it is a trust region (and decoupled / tis
  // weigh by pi_prox / pi_behav as AReaL does).
  const int64_t parts = std::min<int64_t>(options_.minibatches, static_cast<int64_t>(groups.size()));
  const std::vector<at::Tensor> minibatches = parts <= 1 ? std::vector<at::Tensor>{at::arange(b.input.size(0), at::kLong)}
                                                         : MinibatchRows(b, groups.size(), parts);
  stats.behav_weight_mean = 0;  // averaged over the minibatches below
  // M2PO's clip bound is a statistic of the whole batch, so it needs pi_prox of every row before
  // the first backward: one no-grad forward up front, as several minibatches take anyway.
  const bool m2po = options_.loss.correction == Correction::kM2po;
  try {
    at::Tensor prox, ref;
    if (options_.loss.kl_coef > 0) {
      ECHELON_ASSIGN_OR_RETURN(ref, StartLogProbs(b, /*reference=*/true));
    }
    double m2po_bound = std::numeric_limits<double>::quiet_NaN();
    if (parts > 1 || m2po) {
      ECHELON_ASSIGN_OR_RETURN(prox, StartLogProbs(b, /*reference=*/false));
    }
    if (m2po) m2po_bound = M2poBound(prox - b.behav, b.adv, b.mask, options_.loss);
    if (prox.defined()) StartOfUpdateStats(prox, options_.loss, b, groups.size(), &stats);
    if (options_.router_replay) stats.group_routes.assign(groups.size(), {});
    for (const at::Tensor& rows : minibatches) {
      Minibatch mb;
      mb.group_routes.assign(stats.group_routes.size(), {});
      ECHELON_RETURN_IF_ERROR(AccumulateGradients(b, rows, prox, ref, m2po_bound, &mb));
      stats.computed_positions += mb.computed_positions;
      stats.sequence_positions += mb.sequence_positions;
      ECHELON_ASSIGN_OR_RETURN(const double norm, ApplyGradients(&mb));
      for (size_t g = 0; g < mb.group_routes.size(); ++g) {
        stats.group_routes[g].same += mb.group_routes[g].same;
        stats.group_routes[g].applied += mb.group_routes[g].applied;
        stats.group_routes[g].refused += mb.group_routes[g].refused;
      }
      if (!prox.defined()) StartOfUpdateStats(mb.start_logp, options_.loss, b, groups.size(), &stats);
      if (std::isnan(norm)) {
        ++stats.skipped_nonfinite;
        const auto r = rows.accessor<int64_t, 1>();
        for (int64_t i = 0; i < rows.size(0); ++i) stats.nonfinite_groups.push_back(b.row_group[r[i]]);
        continue;
      }
      stats.grad_norm += norm;
      stats.loss += mb.loss;
      stats.clip_frac += mb.clip_frac;
      stats.clip_frac_low += mb.clip_frac_low;
      stats.clip_frac_high += mb.clip_frac_high;
      stats.clip_frac_dual += mb.clip_frac_dual;
      stats.kl += mb.kl;
      stats.behav_weight_mean += mb.behav_weight_mean;
      stats.max_token_weight = std::max(stats.max_token_weight, mb.max_token_weight);
      stats.group_share_max = std::max(stats.group_share_max, mb.group_share_max);
      stats.router_aux_loss += mb.router_aux_loss;
      stats.entropy += mb.entropy;
      stats.health.Add(mb.health, 1.0);
    }
  } catch (const c10::Error& e) {  // LibTorch's errors (out of memory, a device failure) end here
    return Internal(std::string("learner update failed: ") + e.what_without_backtrace());
  }
  std::sort(stats.nonfinite_groups.begin(), stats.nonfinite_groups.end());
  stats.nonfinite_groups.erase(std::unique(stats.nonfinite_groups.begin(), stats.nonfinite_groups.end()),
                               stats.nonfinite_groups.end());
  if (stats.skipped_nonfinite > 0)
    spdlog::warn("learner: {} of {} optimizer steps skipped: non-finite loss or gradient (weights unchanged by them)",
                 stats.skipped_nonfinite, minibatches.size());
  const double n = std::max<double>(1.0, static_cast<double>(minibatches.size()) - stats.skipped_nonfinite);
  stats.grad_norm /= n;
  stats.loss /= n;
  stats.clip_frac /= n;
  stats.clip_frac_low /= n;
  stats.clip_frac_high /= n;
  stats.clip_frac_dual /= n;
  stats.kl /= n;
  stats.behav_weight_mean /= n;
  stats.router_aux_loss /= n;
  stats.entropy /= n;
  stats.health = [&] {
    ImportanceHealth mean;
    mean.Add(stats.health, 1.0 / n);
    return mean;
  }();
  const at::Tensor load = compute_->TakeRouterLoad();
  for (int64_t layer = 0; layer < load.size(0); ++layer) {
    const at::Tensor row = load[layer].contiguous();
    stats.router_load.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  ++version_;
  return stats;
}

}  // namespace echelon::learn
