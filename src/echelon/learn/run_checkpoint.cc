#include "echelon/learn/run_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>

#include "echelon/common/fs.h"
#include "echelon/common/sha256.h"
#include "echelon/model/safetensors.h"

namespace echelon::learn {
namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
// The fp32 master weights, when the model's storage dtype (model.safetensors) is narrower:
// a resumed run continues from the exact weights, not from their bf16 rounding.
constexpr const char* kMasterFile = "master_weights.safetensors";

nlohmann::json CountsToJson(const sched::DispatchCounts& c) {
  return {{"handed_out", c.handed_out}, {"consumed", c.consumed},       {"dropped_stale", c.dropped_stale},
          {"filtered", c.filtered},     {"reissued", c.reissued},       {"outstanding", c.outstanding},
          {"pending", c.pending},       {"refused", c.refused},         {"awaiting_reissue", c.awaiting_reissue},
          {"predicted_late", c.predicted_late},     {"tokens_consumed", c.tokens_consumed},
          {"tokens_stale", c.tokens_stale},         {"tokens_filtered", c.tokens_filtered},
          {"tokens_preempted", c.tokens_preempted}, {"tokens_refused", c.tokens_refused},
          {"resumed", c.resumed},                   {"tokens_carried", c.tokens_carried}};
}

// Reads typed fields of one JSON object, remembering the first problem.
class Reader {
 public:
  Reader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) Fail("", "an object");
  }
  template <typename T>
  T Get(const std::string& key) {
    if (!status_.ok()) return T{};
    auto it = j_.find(key);
    if (it == j_.end()) {
      status_ = DataLoss(where_ + ": missing field \"" + key + "\"");
      return T{};
    }
    try {
      return it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      Fail(key, "a value of the right type");
      return T{};
    }
  }
  // A field added after checkpoints were first written: `fallback` when absent.
  template <typename T>
  T GetOr(const std::string& key, T fallback) {
    return j_.contains(key) ? Get<T>(key) : fallback;
  }
  const nlohmann::json& Sub(const std::string& key) {
    static const nlohmann::json kEmpty = nlohmann::json::object();
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_object()) {
      if (status_.ok()) Fail(key, "an object");
      return kEmpty;
    }
    return *it;
  }
  const Status& status() const { return status_; }

 private:
  void Fail(const std::string& key, const std::string& what) {
    if (status_.ok()) status_ = DataLoss(where_ + ": field \"" + key + "\" must be " + what);
  }
  const nlohmann::json& j_;
  std::string where_;
  Status status_;
};

// "step-<digits>" -> digits, else -1.
int64_t StepNumber(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 24) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

// Resumable checkpoints under `ckpt_dir`, newest first.
std::vector<std::pair<int64_t, fs::path>> ListRunCheckpoints(const fs::path& ckpt_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ckpt_dir, ec)) {
    const int64_t n = StepNumber(entry.path().filename().string());
    if (n >= 0 && entry.is_directory(ec) && fs::exists(entry.path() / kStateFile, ec)) out.emplace_back(n, entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// Whether `name` is a temporary ("<name>.tmp-<pid>[-...]") of this process.
bool OwnTemporary(const std::string& name) {
  const std::string pid = std::to_string(::getpid());
  const size_t at = name.find(".tmp-");
  if (at == std::string::npos || name.compare(at + 5, pid.size(), pid) != 0) return false;
  const size_t end = at + 5 + pid.size();
  return end == name.size() || name[end] == '-';
}

// Keeps the newest `keep` whole checkpoints and removes every older step-N directory (also one
// without its state file: nothing resumes from it) and the temporaries that crashed writes and
// removals left. A directory is renamed to a temporary before it is removed, so a crash half-way
// through a removal leaves a temporary that the next prune removes, not a husk named step-N.
void Prune(const fs::path& ckpt_dir, int64_t keep) {
  std::error_code ec;
  const std::vector<std::pair<int64_t, fs::path>> whole = ListRunCheckpoints(ckpt_dir);
  const size_t kept = std::min(whole.size(), static_cast<size_t>(std::max<int64_t>(keep, 1)));
  if (kept > 0) {
    const int64_t oldest_kept = whole[kept - 1].first;
    for (const auto& entry : fs::directory_iterator(ckpt_dir, ec)) {
      const int64_t n = StepNumber(entry.path().filename().string());
      if (n < 0 || n >= oldest_kept || !entry.is_directory(ec)) continue;
      const fs::path doomed = entry.path().string() + ".tmp-" + std::to_string(::getpid()) + "-pruned";
      fs::rename(entry.path(), doomed, ec);
      if (!ec) fs::remove_all(doomed, ec);
    }
  }
  for (const auto& entry : fs::directory_iterator(ckpt_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos && !OwnTemporary(name)) fs::remove_all(entry.path(), ec);
  }
}

}  // namespace

nlohmann::json RunStateToJson(const RunState& s) {
  return {{"format", "echelon-run-state-1"},
          {"version", s.version},
          {"wall_seconds", s.wall_seconds},
          {"rl_wall_seconds", s.rl_wall_seconds},
          {"busy_seconds", s.busy_seconds},
          {"consumed_tokens", s.consumed_tokens},
          {"metrics_bytes", s.metrics_bytes},
          {"samples_bytes", s.samples_bytes},
          // null: not measured (eval.heldout false)
          {"warmstart_accuracy", std::isnan(s.warmstart_accuracy) ? nlohmann::json() : nlohmann::json(s.warmstart_accuracy)},
          {"heldout_n", s.heldout_n},
          {"resumes", s.resumes},
          {"dispatcher",
           {{"version", s.dispatcher.version},
            {"next_group", s.dispatcher.next_group},
            {"next_lease", s.dispatcher.next_lease},
            {"counts", CountsToJson(s.dispatcher.counts)},
            {"unsettled", s.dispatcher.unsettled},
            {"drawn", s.dispatcher.drawn}}},
          {"refusals", s.refusals},
          {"accepted_tokens", s.accepted_tokens},
          {"actor_groups", s.actor_groups},
          {"actor_forged", s.actor_forged},
          {"rng_state", s.rng_state_hex},
          {"staleness_control", s.staleness_control}};
}

Result<RunState> RunStateFromJson(const nlohmann::json& j, const std::string& where) {
  RunState s;
  Reader r(j, where);
  if (r.Get<std::string>("format") != "echelon-run-state-1" && r.status().ok())
    return DataLoss(where + ": unknown format " + j["format"].dump() + " (expected \"echelon-run-state-1\")");
  s.version = r.Get<int64_t>("version");
  s.wall_seconds = r.Get<double>("wall_seconds");
  s.rl_wall_seconds = r.Get<double>("rl_wall_seconds");
  s.busy_seconds = r.Get<double>("busy_seconds");
  s.consumed_tokens = r.Get<int64_t>("consumed_tokens");
  s.metrics_bytes = r.Get<uint64_t>("metrics_bytes");
  s.samples_bytes = r.GetOr<uint64_t>("samples_bytes", 0);
  s.warmstart_accuracy = j.contains("warmstart_accuracy") && j["warmstart_accuracy"].is_null()
                             ? std::numeric_limits<double>::quiet_NaN()
                             : r.Get<double>("warmstart_accuracy");
  s.heldout_n = r.Get<int64_t>("heldout_n");
  s.resumes = r.Get<int64_t>("resumes");
  s.refusals = r.Get<std::map<std::string, int64_t>>("refusals");
  s.accepted_tokens = r.Get<int64_t>("accepted_tokens");
  s.actor_groups = r.Get<std::map<std::string, int64_t>>("actor_groups");
  if (j.contains("actor_forged")) s.actor_forged = r.Get<std::map<std::string, int64_t>>("actor_forged");
  s.rng_state_hex = r.Get<std::string>("rng_state");
  if (j.contains("staleness_control")) s.staleness_control = j["staleness_control"];  // checked by its owner
  Reader d(r.Sub("dispatcher"), where + " dispatcher");
  s.dispatcher.version = d.Get<int64_t>("version");
  s.dispatcher.next_group = d.Get<uint64_t>("next_group");
  s.dispatcher.next_lease = d.Get<uint64_t>("next_lease");
  s.dispatcher.unsettled = d.Get<std::vector<uint64_t>>("unsettled");
  s.dispatcher.drawn = d.GetOr<std::vector<uint64_t>>("drawn", {});
  Reader c(d.Sub("counts"), where + " dispatcher.counts");
  sched::DispatchCounts& k = s.dispatcher.counts;
  k.handed_out = c.Get<uint64_t>("handed_out");
  k.consumed = c.Get<uint64_t>("consumed");
  k.dropped_stale = c.Get<uint64_t>("dropped_stale");
  k.filtered = c.GetOr<uint64_t>("filtered", 0);
  k.reissued = c.Get<uint64_t>("reissued");
  k.outstanding = c.Get<uint64_t>("outstanding");
  k.pending = c.Get<uint64_t>("pending");
  k.refused = c.Get<uint64_t>("refused");
  k.awaiting_reissue = c.Get<uint64_t>("awaiting_reissue");
  // Checkpoints from before deadline-aware dispatch lack these.
  k.predicted_late = c.GetOr<uint64_t>("predicted_late", 0);
  k.tokens_consumed = c.GetOr<uint64_t>("tokens_consumed", 0);
  k.tokens_stale = c.GetOr<uint64_t>("tokens_stale", 0);
  k.tokens_filtered = c.GetOr<uint64_t>("tokens_filtered", 0);
  k.tokens_preempted = c.GetOr<uint64_t>("tokens_preempted", 0);
  k.tokens_refused = c.GetOr<uint64_t>("tokens_refused", 0);
  k.resumed = c.GetOr<uint64_t>("resumed", 0);  // and, from before resumable groups, these
  k.tokens_carried = c.GetOr<uint64_t>("tokens_carried", 0);
  for (const Reader* each : {&r, &d, &c}) ECHELON_RETURN_IF_ERROR(each->status());
  if (s.version < 0 || s.dispatcher.version != s.version)
    return DataLoss(where + ": learner version " + std::to_string(s.version) + " and dispatcher version " +
                    std::to_string(s.dispatcher.version) + " disagree");
  return s;
}

std::string CaptureRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor state = gen.get_state();
  return ToHex(std::string_view(static_cast<const char*>(state.data_ptr()), state.numel()));
}

Status RestoreRngState(const std::string& hex) {
  if (hex.empty() || hex.size() % 2 != 0) return DataLoss("RNG state is not a hex string of whole bytes");
  at::Tensor state = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  uint8_t* out = state.data_ptr<uint8_t>();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const std::string byte = hex.substr(i, 2);
    if (byte.find_first_not_of("0123456789abcdef") != std::string::npos) return DataLoss("RNG state is not hex");
    out[i / 2] = static_cast<uint8_t>(std::stoi(byte, nullptr, 16));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(state);
  } catch (const c10::Error& e) {
    return DataLoss(std::string("RNG state refused: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

Status SaveRunCheckpoint(const std::string& ckpt_dir, learn::Learner& learner, const model::Vocabulary& vocab,
                         const RunState& state, int64_t keep, model::CheckpointFiles gathered) {
  struct RemoveWritten {  // gathered files not moved into the checkpoint (a failed save)
    const model::CheckpointFiles& files;
    ~RemoveWritten() {
      std::error_code ec;
      for (const auto& [name, file] : files)
        if (!file.written_path.empty()) fs::remove(file.written_path, ec);
    }
  } remove_written{gathered};
  model::CheckpointFiles extra = gathered;
  if (!extra.count(kOptimizerFile)) {
    ECHELON_ASSIGN_OR_RETURN(extra[kOptimizerFile], model::SafetensorsLayout(learner.OptimizerState()));
  }
  extra[kStateFile] = RunStateToJson(state).dump(1) + "\n";
  const bool master = model::StorageDtype(learner.model()->config()) != at::kFloat;
  if (learner.parameters_sharded() && (!extra.count(model::kWeightsFile) || (master && !extra.count(kMasterFile))))
    return FailedPrecondition("a checkpoint of sharded parameters needs their weights gathered (GatherCheckpointFiles)");
  if (master && !extra.count(kMasterFile)) {
    std::map<std::string, at::Tensor> fp32;
    for (const auto& [name, t] : learner.model()->StateDict()) fp32[name] = t.to(at::kCPU, at::kFloat);
    ECHELON_ASSIGN_OR_RETURN(extra[kMasterFile], model::SafetensorsLayout(fp32));
  }
  const fs::path dir = fs::path(ckpt_dir) / ("step-" + std::to_string(state.version));
  ECHELON_RETURN_IF_ERROR(model::SaveCheckpoint(dir.string(), learner.model(), vocab, extra));
  Prune(ckpt_dir, keep);
  return Status::Ok();
}

std::string GatheredPath(const std::string& ckpt_dir, const std::string& file) {
  return (fs::path(ckpt_dir) / (file + ".tmp-" + std::to_string(::getpid()) + "-gathered")).string();
}

Result<model::CheckpointFiles> GatherCheckpointFiles(LearnerRanks& ranks, Learner& learner, const std::string& ckpt_dir) {
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  model::CheckpointFiles files;
  // Each file gathered to its temporary; on a failure those already written are removed.
  const auto gather = [&](const std::string& name,
                          const std::function<Result<model::CheckpointFile>(const std::string&)>& make) -> Status {
    Result<model::CheckpointFile> file = make(GatheredPath(ckpt_dir, name));
    if (!file.ok()) {
      for (const auto& [done, f] : files) fs::remove(f.written_path, ec);
      return file.status();
    }
    files[name] = std::move(file).value();
    return Status::Ok();
  };
  ECHELON_RETURN_IF_ERROR(gather(kOptimizerFile, [&](const std::string& path) { return ranks.OptimizerFile(learner, path); }));
  if (!learner.parameters_sharded()) return files;
  const at::ScalarType storage = model::StorageDtype(learner.model()->config());
  ECHELON_RETURN_IF_ERROR(gather(model::kWeightsFile, [&](const std::string& path) {
    return ranks.WeightsFile(learner, path, storage, model::kWeightsMetadata);
  }));
  if (storage != at::kFloat)
    ECHELON_RETURN_IF_ERROR(
        gather(kMasterFile, [&](const std::string& path) { return ranks.WeightsFile(learner, path, at::kFloat); }));
  return files;
}

Result<ResumePoint> LoadNewestRunCheckpoint(const std::string& ckpt_dir, std::vector<std::string>* skipped, bool mapped) {
  const auto read = [mapped](const std::string& path) {
    return mapped ? model::MapSafetensors(path) : model::ReadSafetensors(path);
  };
  for (const auto& [n, dir] : ListRunCheckpoints(ckpt_dir)) {
    auto skip = [&, dir = dir](const Status& why) { skipped->push_back(dir.string() + ": " + why.message()); };
    Status verified = model::VerifyCheckpoint(dir.string(), /*required=*/true);
    if (!verified.ok()) {
      skip(verified);
      continue;
    }
    Result<model::LoadedCheckpoint> ck = model::LoadCheckpoint(dir.string(), mapped);
    if (!ck.ok()) {
      skip(ck.status());
      continue;
    }
    const std::string state_path = (dir / kStateFile).string();
    Result<std::string> text = ReadFile(state_path);
    nlohmann::json j = text.ok() ? nlohmann::json::parse(text.value(), nullptr, false) : nlohmann::json();
    if (!text.ok() || j.is_discarded()) {
      skip(DataLoss(state_path + " is not valid JSON"));
      continue;
    }
    Result<RunState> st = RunStateFromJson(j, state_path);
    if (!st.ok() || st->version != n) {
      skip(st.ok() ? DataLoss(state_path + " says version " + std::to_string(st->version)) : st.status());
      continue;
    }
    Result<model::SafetensorsFile> opt = read((dir / kOptimizerFile).string());
    if (!opt.ok()) {
      skip(opt.status());
      continue;
    }
    if (fs::exists(dir / kMasterFile)) {
      Result<model::SafetensorsFile> master = read((dir / kMasterFile).string());
      Status loaded = master.status();
      if (master.ok() && mapped) {  // the fp32 master's views become the weights
        ck->model = model::Qwen3Model(ck->config, model::Qwen3ModelImpl::Uninitialized{});
        loaded = ck->model->BindStateDict(master->tensors, (dir / kMasterFile).string());
      } else if (master.ok()) {
        loaded = ck->model->LoadStateDict(master->tensors, (dir / kMasterFile).string());
      }
      if (!loaded.ok()) {
        skip(loaded);
        continue;
      }
    }
    ResumePoint p;
    p.dir = dir.string();
    p.state = std::move(st).value();
    p.checkpoint = std::move(ck).value();
    p.optimizer = std::move(opt->tensors);
    return p;
  }
  return NotFound("no whole resumable checkpoint (step-N with " + std::string(kStateFile) + ") under " + ckpt_dir);
}

}  // namespace echelon::learn
