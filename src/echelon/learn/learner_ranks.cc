#include "echelon/learn/learner_ranks.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <type_traits>

#include "echelon/common/fs.h"
#include "echelon/common/process.h"
#include "echelon/common/sha256.h"
#include "echelon/learn/run_checkpoint.h"
#include "echelon/model/safetensors.h"

namespace echelon::learn {
namespace {

using nlohmann::json;

// The options a worker takes from rank 0, listed once for both directions. The enums travel
// as ints and the device as "on CUDA or not" (each rank uses its own GPU); see below.
template <typename Options, typename Field>
void VisitOptions(Options& o, Field&& field) {
  field("clip_low", o.loss.clip_low);
  field("clip_high", o.loss.clip_high);
  field("clip_ratio_c", o.loss.clip_ratio_c);
  field("tis_cap", o.loss.tis_cap);
  field("decoupled_cap", o.loss.decoupled_cap);
  field("icepop_beta", o.loss.icepop_beta);
  field("m2po_tau", o.loss.m2po_tau);
  field("m2po_within_clip", o.loss.m2po_within_clip);
  field("kl_coef", o.loss.kl_coef);
  field("lr", o.lr);
  field("weight_decay", o.weight_decay);
  field("beta1", o.beta1);
  field("beta2", o.beta2);
  field("max_grad_norm", o.max_grad_norm);
  field("temperature", o.temperature);
  field("scale_by_std", o.scale_by_std);
  field("max_group_share", o.max_group_share);
  field("minibatches", o.minibatches);
  field("micro_batch_tokens", o.micro_batch_tokens);
  field("pack_sequences", o.pack_sequences);
  field("activation_checkpointing", o.activation_checkpointing);
  field("router_aux_coef", o.router_aux_coef);
  field("router_replay", o.router_replay);
  field("router_replay_trust", o.router_replay_trust);
  field("overlong_buffer", o.overlong.buffer);
  field("overlong_penalty", o.overlong.penalty);
  field("overlong_filter", o.overlong.filter);
  field("max_new_tokens", o.max_new_tokens);
  field("stop_ids", o.stop_ids);
}

json OptionsToJson(const LearnerOptions& o) {
  json j = {{"correction", static_cast<int>(o.loss.correction)},
            {"loss_aggregation", static_cast<int>(o.loss_aggregation)},
            {"ratio", static_cast<int>(o.loss.ratio)},
            {"precision", static_cast<int>(o.precision)},
            {"shard", static_cast<int>(o.shard)},
            {"cuda", at::Device(o.device).is_cuda()}};
  VisitOptions(o, [&](const char* key, const auto& value) { j[key] = value; });
  return j;
}

// A worker's options: rank 0's, on this rank's own GPU when rank 0 runs on CUDA.
LearnerOptions OptionsFromJson(const json& j, int local_rank) {
  LearnerOptions o;
  VisitOptions(o, [&](const char* key, auto& value) { value = j.at(key).get<std::decay_t<decltype(value)>>(); });
  o.loss.correction = static_cast<Correction>(j.at("correction").get<int>());
  o.loss_aggregation = static_cast<LossAggregation>(j.at("loss_aggregation").get<int>());
  o.loss.ratio = static_cast<RatioLevel>(j.at("ratio").get<int>());
  o.precision = static_cast<Precision>(j.at("precision").get<int>());
  o.shard = static_cast<Shard>(j.at("shard").get<int>());
  o.device = j.at("cuda").get<bool>() ? "cuda:" + std::to_string(local_rank) : "cpu";
  return o;
}

Status SendMessage(RankGroup& group, const json& message) {
  const std::vector<uint8_t> packed = json::to_msgpack(message);
  std::string bytes(packed.begin(), packed.end());
  return group.BroadcastBytes(&bytes, 0);
}

Result<json> ReceiveMessage(RankGroup& group) {
  std::string bytes;
  ECHELON_RETURN_IF_ERROR(group.BroadcastBytes(&bytes, 0));
  json j = json::from_msgpack(bytes, /*strict=*/true, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("op")) return DataLoss("learner rank: a malformed message");
  return j;
}

json Names(const std::map<std::string, at::Tensor>& m) {
  json out = json::array();
  for (const auto& [name, t] : m) out.push_back(name);
  return out;
}

// Tensors in a fixed order, received into tensors of the same shapes on the workers.
std::vector<at::Tensor> Ordered(const std::map<std::string, at::Tensor>& m) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : m) out.push_back(t.to(at::kCPU).contiguous());
  return out;
}

// Whether ranks of these options shard their parameters (no whole weights travel at set-up).
bool ShardsUnits(const LearnerOptions& o, int world) { return o.shard == Shard::kParams && world > 1; }

// The resident set when this process first asked (a worker asks as it becomes a rank).
double StartResidentSetMb() {
  static const double start = ResidentSetMb();
  return start;
}

}  // namespace

RankMemory TakeOwnMemory() {
  RankMemory m;
  m.start_mb = StartResidentSetMb();
  m.peak_mb = PeakResidentSetMb();
  ResetPeakResidentSet();
  m.now_mb = ResidentSetMb();
  return m;
}

Result<std::vector<RankMemory>> ExchangeRankMemory(RankGroup& group) {
  const RankMemory own = TakeOwnMemory();
  const at::Tensor mine = at::tensor({own.peak_mb, own.now_mb, own.start_mb}, at::kDouble);
  at::Tensor all = at::empty({3 * group.world()}, at::kDouble);
  ECHELON_RETURN_IF_ERROR(group.AllGather(mine, all));
  std::vector<RankMemory> out(static_cast<size_t>(group.world()));
  const double* v = all.data_ptr<double>();
  for (size_t r = 0; r < out.size(); ++r) out[r] = {v[3 * r], v[3 * r + 1], v[3 * r + 2]};
  return out;
}

json GroupsToJson(const std::vector<LearnerGroup>& groups) {
  json out = json::array();
  for (const LearnerGroup& g : groups) {
    json episodes = json::array();
    for (const data::Episode& e : g.episodes) {
      json turns = json::array();
      for (const data::Turn& t : e.turns) {
        turns.push_back({{"p", t.prompt_ids}, {"k", t.tokens}, {"l", t.logprobs}});
        if (!t.routes.empty())  // router replay: every rank forces the same routes
          turns.back()["r"] = {{"p", t.routes.positions}, {"l", t.routes.layers}, {"e", t.routes.experts}};
      }
      episodes.push_back({{"r", e.reward}, {"s", e.success}, {"t", turns}});
    }
    out.push_back({{"v", g.behavior_version}, {"e", episodes}});
  }
  return out;
}

Result<std::vector<LearnerGroup>> GroupsFromJson(const json& j) {
  std::vector<LearnerGroup> groups;
  try {
    for (const json& g : j) {
      LearnerGroup lg;
      lg.behavior_version = g.at("v");
      for (const json& e : g.at("e")) {
        data::Episode ep;
        ep.reward = e.at("r");
        ep.success = e.at("s");
        for (const json& t : e.at("t")) {
          ep.turns.push_back({t.at("p"), t.at("k"), t.at("l"), ""});
          if (t.contains("r")) {
            Routes& r = ep.turns.back().routes;
            t.at("r").at("p").get_to(r.positions);
            t.at("r").at("l").get_to(r.layers);
            t.at("r").at("e").get_to(r.experts);
          }
        }
        lg.episodes.push_back(std::move(ep));
      }
      groups.push_back(std::move(lg));
    }
  } catch (const json::exception& e) {
    return DataLoss(std::string("learner rank: malformed groups: ") + e.what());
  }
  return groups;
}

LearnerRanks::~LearnerRanks() { Stop(); }

Status LearnerRanks::Setup(Learner& learner, const std::map<std::string, at::Tensor>& optimizer,
                           const std::map<std::string, at::Tensor>& sharded_reference) {
  const std::map<std::string, at::Tensor> reference = learner.ReferenceState();  // whole: unsharded only
  ECHELON_RETURN_IF_ERROR(SendMessage(*group_, {{"op", "setup"},
                                                {"model", learner.model()->config().ToJson()},
                                                {"options", OptionsToJson(learner.options())},
                                                {"version", learner.version()},
                                                {"reference", !reference.empty()},
                                                {"optimizer", Names(optimizer)}}));
  // Sharded parameters: no whole weights or AdamW state travel; each rank's shards follow, unit
  // by unit (Learner::ShardsFromRankZero).
  const bool sharded = ShardsUnits(learner.options(), world());
  if (!sharded) {
    std::vector<at::Tensor> weights = Ordered(learner.model()->StateDict());
    for (at::Tensor& t : weights) t = t.to(at::kFloat);  // as the workers receive them (a LoRA base may be bf16)
    ECHELON_RETURN_IF_ERROR(group_->Broadcast(weights, 0));
  }
  if (!reference.empty()) {
    std::vector<at::Tensor> r = Ordered(reference);
    for (at::Tensor& t : r) t = t.to(at::kFloat);  // Gloo carries no bf16; the workers receive fp32
    ECHELON_RETURN_IF_ERROR(group_->Broadcast(r, 0));
  }
  if (sharded) return learner.ShardsFromRankZero(&optimizer, !optimizer.empty(), &sharded_reference);
  if (!optimizer.empty()) {
    std::vector<at::Tensor> o = Ordered(optimizer);
    ECHELON_RETURN_IF_ERROR(group_->Broadcast(o, 0));
  }
  return Status::Ok();
}

Status LearnerRanks::SendStep(const std::vector<LearnerGroup>& groups, double lr) {
  return SendMessage(*group_, {{"op", "step"}, {"lr", lr}, {"groups", GroupsToJson(groups)}});
}

Result<std::map<std::string, at::Tensor>> LearnerRanks::GatherOptimizerState(Learner& learner) {
  if (!learner.optimizer_state_sharded()) return learner.OptimizerState();
  ECHELON_RETURN_IF_ERROR(SendMessage(*group_, {{"op", "gather_optimizer"}}));
  return learner.GatherOptimizerState();
}

Result<std::vector<RankMemory>> LearnerRanks::TakeRankMemory() {
  ECHELON_RETURN_IF_ERROR(SendMessage(*group_, {{"op", "peak_rss"}}));
  return ExchangeRankMemory(*group_);
}

namespace {

// Rank 0's part of a gather every rank takes part in (`produce` writes it to a sink), written to
// `path` and hashed on the way. A file that cannot be opened still takes part, into nothing, so
// the workers are not left waiting in a collective.
Result<model::CheckpointFile> GatheredFile(const std::string& path, const std::string& what,
                                           const std::function<Status(const ByteSink*)>& produce) {
  Sha256Stream sha;
  uint64_t size = 0;
  bool gathered = false;
  const Status written = WriteFileAtomic(path, [&](const ByteSink& sink) {
    gathered = true;
    const ByteSink counted = [&](std::string_view bytes) {
      sha.Update(bytes);
      size += bytes.size();
      return sink(bytes);
    };
    return produce(&counted);
  });
  if (!gathered) {
    const ByteSink discard = [](std::string_view) { return Status::Ok(); };
    (void)produce(&discard);
  }
  ECHELON_RETURN_IF_ERROR(written.WithContext("gathering " + what));
  return model::CheckpointFile::Written(path, size, sha.Hex());
}

// The dtypes weights are gathered in (what a "gather_weights" message may ask for).
bool GatherableDtype(int64_t dtype) {
  return dtype == static_cast<int64_t>(at::kFloat) || dtype == static_cast<int64_t>(at::kBFloat16) ||
         dtype == static_cast<int64_t>(at::kHalf);
}

}  // namespace

Result<model::CheckpointFile> LearnerRanks::OptimizerFile(Learner& learner, const std::string& path) {
  if (!learner.parameters_sharded()) {
    using State = std::map<std::string, at::Tensor>;
    ECHELON_ASSIGN_OR_RETURN(State state, GatherOptimizerState(learner));
    ECHELON_ASSIGN_OR_RETURN(model::SafetensorsParts parts, model::SafetensorsLayout(state));
    return model::CheckpointFile(std::move(parts));
  }
  ECHELON_RETURN_IF_ERROR(SendMessage(*group_, {{"op", "gather_optimizer"}}));
  return GatheredFile(path, "the AdamW state", [&](const ByteSink* sink) { return learner.WriteOptimizerState(sink); });
}

Result<std::shared_ptr<const std::string>> LearnerRanks::WeightsBytes(Learner& learner, at::ScalarType dtype,
                                                                      const std::map<std::string, std::string>& metadata) {
  if (!learner.parameters_sharded()) return FailedPrecondition("WeightsBytes: the parameters are not sharded");
  if (!GatherableDtype(static_cast<int64_t>(dtype))) return InvalidArgument("WeightsBytes: weights gather in fp32, bf16 or fp16");
  ECHELON_RETURN_IF_ERROR(SendMessage(*group_, {{"op", "gather_weights"}, {"dtype", static_cast<int64_t>(dtype)}}));
  auto bytes = std::make_shared<std::string>();
  bytes->reserve(static_cast<size_t>(learner.model()->config().NumParameters() * c10::elementSize(dtype)) + (1 << 20));
  const ByteSink append = [&](std::string_view b) {
    bytes->append(b);
    return Status::Ok();
  };
  ECHELON_RETURN_IF_ERROR(learner.WriteWeights(&append, dtype, metadata).WithContext("gathering the weights"));
  return std::shared_ptr<const std::string>(std::move(bytes));
}

Result<model::CheckpointFile> LearnerRanks::WeightsFile(Learner& learner, const std::string& path, at::ScalarType dtype,
                                                        const std::map<std::string, std::string>& metadata,
                                                        std::pair<size_t, size_t> units) {
  if (!learner.parameters_sharded()) return FailedPrecondition("WeightsFile: the parameters are not sharded");
  if (!GatherableDtype(static_cast<int64_t>(dtype))) return InvalidArgument("WeightsFile: weights gather in fp32, bf16 or fp16");
  json message = {{"op", "gather_weights"}, {"dtype", static_cast<int64_t>(dtype)}};
  if (units.second != SIZE_MAX) message["units"] = {units.first, units.second};
  ECHELON_RETURN_IF_ERROR(SendMessage(*group_, message));
  return GatheredFile(path, "the weights",
                      [&](const ByteSink* sink) { return learner.WriteWeights(sink, dtype, metadata, units); });
}

Result<model::CheckpointFiles> LearnerRanks::WeightsFiles(Learner& learner, const std::string& ckpt_dir,
                                                          at::ScalarType dtype, uint64_t max_shard_bytes) {
  const std::vector<std::pair<std::vector<std::string>, uint64_t>> units = learner.WeightUnits(dtype);
  std::vector<uint64_t> sizes;
  std::vector<std::vector<std::string>> names;
  for (const auto& [unit_names, bytes] : units) {
    sizes.push_back(bytes);
    names.push_back(unit_names);
  }
  const std::vector<model::WeightsShard> shards = model::PlanWeightsShards(sizes, max_shard_bytes);
  model::CheckpointFiles files;
  for (const model::WeightsShard& shard : shards) {
    Result<model::CheckpointFile> file = WeightsFile(learner, GatheredPath(ckpt_dir, shard.file), dtype,
                                                     model::kWeightsMetadata, {shard.first, shard.end});
    if (!file.ok()) {
      std::error_code ec;
      for (const auto& [name, f] : files) std::filesystem::remove(f.written_path, ec);
      return file.status();
    }
    files[shard.file] = std::move(file).value();
  }
  if (shards.size() > 1) files[model::kWeightsIndexFile] = model::WeightsIndex(shards, names);
  return files;
}

void LearnerRanks::Stop() {
  if (stopped_) return;
  stopped_ = true;
  (void)SendMessage(*group_, {{"op", "stop"}});
}

Status RunRankWorker(RankGroup& group, std::ostream& progress) {
  StartResidentSetMb();
  ECHELON_ASSIGN_OR_RETURN(json setup, ReceiveMessage(group));
  if (setup["op"] != "setup") return DataLoss("learner rank: expected the set-up message first");
  ECHELON_ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfig::FromJson(setup["model"], "rank 0's model"));
  LearnerOptions options;
  int64_t version = 0;
  try {
    options = OptionsFromJson(setup.at("options"), group.local_rank());
    version = setup.at("version");
  } catch (const json::exception& e) {
    return DataLoss(std::string("learner rank: malformed set-up: ") + e.what());
  }
  ECHELON_RETURN_IF_ERROR(model::CheckDevice(options.device).WithContext("learner rank " + std::to_string(group.rank())));
  // Receive into tensors shaped like this rank's own. Sharded parameters: the model's weights are
  // never written (nor resident); the shards come unit by unit once the learner is built.
  const bool sharded = ShardsUnits(options, group.world());
  model::Qwen3Model model(config, model::Qwen3ModelImpl::Uninitialized{});
  if (!sharded) {  // straight into the model's own tensors; nothing else holds them
    std::vector<at::Tensor> w = Ordered(model->StateDict());
    ECHELON_RETURN_IF_ERROR(group.Broadcast(w, 0));
  }
  size_t i = 0;
  std::map<std::string, at::Tensor> reference;
  if (setup.value("reference", false)) {
    // Fresh tensors: StateDict's share the model's memory, and the reference would overwrite it.
    for (const auto& [name, t] : model->StateDict()) reference[name] = at::empty_like(t);
    std::vector<at::Tensor> r = Ordered(reference);
    ECHELON_RETURN_IF_ERROR(group.Broadcast(r, 0));
    i = 0;
    for (auto& [name, t] : reference) t = r[i++];
  }
  // No whole reference: the weights are it, or (sharded) its shards follow the weights'.
  if (options.loss.kl_coef > 0 && reference.empty() && !sharded) reference = model->StateDict();
  std::map<std::string, at::Tensor> optimizer;
  const json names = setup.value("optimizer", json::array());
  if (!names.empty() && !sharded) {
    // Rank 0's AdamW state by name: "<param>.exp_avg", ".exp_avg_sq" (parameter-shaped) and
    // ".step" (one int64).
    const std::map<std::string, at::Tensor> params = model->StateDict();
    for (const json& n : names) {
      const std::string name = n.get<std::string>();
      const std::string param = name.substr(0, name.rfind('.'));
      if (!params.count(param)) return DataLoss("learner rank: optimizer state for unknown parameter " + param);
      optimizer[name] = name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0
                            ? at::zeros({1}, at::kLong)
                            : at::zeros_like(params.at(param), at::TensorOptions().dtype(at::kFloat));
    }
    std::vector<at::Tensor> o = Ordered(optimizer);
    ECHELON_RETURN_IF_ERROR(group.Broadcast(o, 0));
    i = 0;
    for (auto& [name, t] : optimizer) t = o[i++];
  }
  // Only now: a learner with sharded parameters empties this rank's whole copy of the weights.
  Learner learner(model, options, &group);
  ECHELON_RETURN_IF_ERROR(learner.Restore(version, optimizer, reference));
  if (sharded) ECHELON_RETURN_IF_ERROR(learner.ShardsFromRankZero(nullptr, !names.empty()));
  optimizer.clear();  // inside the optimizer now
  reference.clear();
  model = model::Qwen3Model(nullptr);
  progress << "learner rank " << group.rank() << " of " << group.world() << " ready at version " << version
           << " (" << options.device
           << (options.shard == Shard::kOptimizer ? ", sharded optimizer"
               : options.shard == Shard::kParams  ? ", sharded parameters"
                                                  : "")
           << ")" << std::endl;
  while (true) {
    ECHELON_ASSIGN_OR_RETURN(json message, ReceiveMessage(group));
    if (message["op"] == "stop") return Status::Ok();
    if (message["op"] == "peak_rss") {
      ECHELON_RETURN_IF_ERROR(ExchangeRankMemory(group).status());
      continue;
    }
    if (message["op"] == "gather_optimizer") {
      ECHELON_RETURN_IF_ERROR(learner.parameters_sharded() ? learner.WriteOptimizerState(nullptr)
                                                           : learner.GatherOptimizerState().status());
      continue;
    }
    if (message["op"] == "gather_weights") {
      const auto dtype = message.find("dtype");
      if (dtype == message.end() || !dtype->is_number_integer() || !GatherableDtype(dtype->get<int64_t>()))
        return DataLoss("learner rank: a gather_weights message needs 'dtype' (fp32, bf16 or fp16)");
      // Units [first, end) of a shard of a checkpoint, or all of them.
      std::pair<size_t, size_t> units = {0, SIZE_MAX};
      if (const auto range = message.find("units"); range != message.end()) {
        if (!range->is_array() || range->size() != 2 || !(*range)[0].is_number_unsigned() ||
            !(*range)[1].is_number_unsigned() || (*range)[0].get<uint64_t>() > (*range)[1].get<uint64_t>())
          return DataLoss("learner rank: a gather_weights message's 'units' must be [first, end]");
        units = {(*range)[0].get<size_t>(), (*range)[1].get<size_t>()};
      }
      ECHELON_RETURN_IF_ERROR(
          learner.WriteWeights(nullptr, static_cast<at::ScalarType>(dtype->get<int64_t>()), {}, units));
      continue;
    }
    if (message["op"] != "step") return DataLoss("learner rank: unknown message " + message["op"].dump());
    ECHELON_ASSIGN_OR_RETURN(std::vector<LearnerGroup> groups, GroupsFromJson(message["groups"]));
    const auto lr = message.find("lr");
    if (lr == message.end() || !lr->is_number() || !(lr->get<double>() > 0))
      return DataLoss("learner rank: a step message needs a positive number 'lr'");
    learner.SetLearningRate(lr->get<double>());
    ECHELON_RETURN_IF_ERROR(learner.Step(groups).status());
  }
}

}  // namespace echelon::learn
