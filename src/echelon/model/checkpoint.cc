#include "echelon/model/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "echelon/common/fs.h"
#include "echelon/common/sha256.h"
#include "echelon/model/safetensors.h"

namespace echelon::model {
namespace {

namespace fs = std::filesystem;

// "ckpt/" and "ckpt" name the same directory; the temporary sibling needs the bare name.
fs::path CleanDir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}


constexpr const char* kChecksums = "checksums.json";

Status WriteFiles(const fs::path& tmp, const CheckpointFiles& files) {
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a leftover from a crashed save by a process with our pid
  if (!fs::create_directories(tmp, ec)) return Internal("cannot create " + tmp.string() + ": " + ec.message());
  // Crash tests: ECHELON_FAULT_KILL_IN_CHECKPOINT=TEXT kills this process half-way through
  // writing a checkpoint whose temporary path contains TEXT (as a power cut would).
  const char* fault = std::getenv("ECHELON_FAULT_KILL_IN_CHECKPOINT");
  const bool die_half_way = fault != nullptr && *fault != '\0' && tmp.string().find(fault) != std::string::npos;
  nlohmann::json sums = nlohmann::json::object();
  for (const auto& [name, file] : files) {
    if (die_half_way && sums.size() == files.size() / 2) ::kill(::getpid(), SIGKILL);
    if (name == kChecksums || name.empty() || name.find('/') != std::string::npos)
      return InvalidArgument("checkpoint file name '" + name + "' is reserved or not a plain name");
    if (!file.written_path.empty()) {
      if (std::rename(file.written_path.c_str(), (tmp / name).c_str()) != 0)
        return Internal("moving " + file.written_path + " into " + tmp.string() + " failed: " + std::strerror(errno));
      sums[name] = {{"bytes", file.written_size}, {"sha256", file.written_sha256}};
      continue;
    }
    const std::vector<std::string_view> views = file.Views();
    ECHELON_RETURN_IF_ERROR(WriteFileAtomic((tmp / name).string(), views));
    uint64_t size = 0;
    for (std::string_view v : views) size += v.size();
    sums[name] = {{"bytes", size}, {"sha256", Sha256Hex(views)}};
  }
  // Written last: a directory whose checksums.json is whole has every other file whole.
  ECHELON_RETURN_IF_ERROR(WriteFileAtomic((tmp / kChecksums).string(), nlohmann::json{{"files", sums}}.dump(1) + "\n"));
  return SyncDir(tmp.string());
}

// Moves the finished temporary directory to `dir`. An existing checkpoint there is swapped
// out atomically (RENAME_EXCHANGE), so a reader sees the old or the new one, never neither.
Status Publish(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
      return Internal("rename " + tmp.string() + " -> " + dir.string() + " failed: " + std::strerror(errno));
    }
    return Status::Ok();
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    // Filesystems without RENAME_EXCHANGE: move the old one aside first (brief window).
    const fs::path old = dir.string() + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    if (std::rename(dir.c_str(), old.c_str()) != 0 || std::rename(tmp.c_str(), dir.c_str()) != 0) {
      return Internal("replacing " + dir.string() + " failed: " + std::strerror(errno));
    }
    fs::remove_all(old, ec);
    return Status::Ok();
  }
  fs::remove_all(tmp, ec);  // now holds the previous checkpoint
  return Status::Ok();
}


}  // namespace

CheckpointFile CheckpointFile::Written(std::string path, uint64_t size, std::string sha256) {
  CheckpointFile f;
  f.written_path = std::move(path);
  f.written_size = size;
  f.written_sha256 = std::move(sha256);
  return f;
}

std::vector<std::string_view> CheckpointFile::Views() const {
  return streamed ? parts.Views() : std::vector<std::string_view>{bytes};
}

std::vector<WeightsShard> PlanWeightsShards(const std::vector<uint64_t>& sizes, uint64_t max_bytes) {
  std::vector<WeightsShard> shards;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (shards.empty() || (shards.back().bytes > 0 && shards.back().bytes + sizes[i] > max_bytes))
      shards.push_back({"", i, i, 0});
    shards.back().end = i + 1;
    shards.back().bytes += sizes[i];
  }
  if (shards.empty()) shards.push_back({"", 0, 0, 0});
  if (shards.size() == 1) {
    shards[0].file = kWeightsFile;
  } else {
    const auto number = [](size_t n) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "%05zu", n);
      return std::string(buf);
    };
    for (size_t k = 0; k < shards.size(); ++k)
      shards[k].file = "model-" + number(k + 1) + "-of-" + number(shards.size()) + ".safetensors";
  }
  return shards;
}

std::string WeightsIndex(const std::vector<WeightsShard>& shards, const std::vector<std::vector<std::string>>& names) {
  nlohmann::json map = nlohmann::json::object();
  uint64_t total = 0;
  for (const WeightsShard& s : shards) {
    total += s.bytes;
    for (size_t i = s.first; i < s.end; ++i)
      for (const std::string& name : names[i]) map[name] = s.file;
  }
  return nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n";
}

Status SaveCheckpoint(const std::string& dir, const Qwen3Model& model, const Vocabulary& vocab,
                      const CheckpointFiles& extra, uint64_t max_shard_bytes) {
  const ModelConfig& cfg = model->config();
  if (vocab.id_end() > cfg.vocab_size)
    return InvalidArgument("saving " + CleanDir(dir).string() + ": the tokenizer has " + std::to_string(vocab.id_end()) +
                           " ids but the model's vocab_size is " + std::to_string(cfg.vocab_size));
  CheckpointFiles files = extra;
  nlohmann::json config = cfg.ToJson();
  if (!vocab.stop_ids().empty()) config["eos_token_id"] = vocab.eos_json();
  files["config.json"] = config.dump(2) + "\n";
  if (!files.count(kWeightsFile) && !files.count(kWeightsIndexFile)) {
    const std::map<std::string, at::Tensor> weights = model->StorageStateDict();
    std::vector<uint64_t> sizes;
    std::vector<std::vector<std::string>> names;
    for (const auto& [name, t] : weights) {
      sizes.push_back(static_cast<uint64_t>(t.nbytes()));
      names.push_back({name});
    }
    const std::vector<WeightsShard> shards =
        PlanWeightsShards(sizes, max_shard_bytes > 0 ? max_shard_bytes : std::numeric_limits<uint64_t>::max());
    auto it = weights.begin();
    for (const WeightsShard& shard : shards) {
      std::map<std::string, at::Tensor> part;
      for (size_t i = shard.first; i < shard.end; ++i, ++it) part.insert(*it);
      ECHELON_ASSIGN_OR_RETURN(files[shard.file], SafetensorsLayout(part, kWeightsMetadata));
    }
    if (shards.size() > 1) files[kWeightsIndexFile] = WeightsIndex(shards, names);
  }
  for (const auto& [name, bytes] : vocab.files()) files[name] = CheckpointFile(bytes);
  // The ids generation starts and stops at, for Hugging Face generate() and the engines, over
  // the source model's generation defaults (temperature, top_p, ...) when it had any.
  nlohmann::json gen = nlohmann::json::object();
  if (auto src = vocab.files().find("generation_config.json"); src != vocab.files().end()) {
    nlohmann::json j = nlohmann::json::parse(src->second, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) gen = std::move(j);
  }
  if (vocab.bos() >= 0) gen["bos_token_id"] = vocab.bos();
  if (!vocab.stop_ids().empty()) gen["eos_token_id"] = vocab.eos_json();
  if (vocab.pad() >= 0) gen["pad_token_id"] = vocab.pad();
  files["generation_config.json"] = gen.dump(2) + "\n";
  return WriteCheckpointDir(dir, files);
}

Status SaveCheckpoint(const std::string& dir, const Qwen3Model& model, const CharTokenizer& tokenizer,
                      const CheckpointFiles& extra) {
  return SaveCheckpoint(dir, model, Vocabulary::Characters(tokenizer.alphabet()), extra);
}

Status WriteCheckpointDir(const std::string& dir, const CheckpointFiles& files) {
  const fs::path final_dir = CleanDir(dir);
  std::error_code ec;
  if (final_dir.has_parent_path()) fs::create_directories(final_dir.parent_path(), ec);
  const fs::path tmp = final_dir.string() + ".tmp-" + std::to_string(::getpid());
  Status st = WriteFiles(tmp, files);
  if (st.ok()) st = Publish(tmp, final_dir);
  if (!st.ok()) {
    fs::remove_all(tmp, ec);
    return st.WithContext("saving checkpoint " + final_dir.string());
  }
  return SyncDir(final_dir.has_parent_path() ? final_dir.parent_path().string() : ".");
}

Status VerifyCheckpoint(const std::string& dir, bool required) {
  const fs::path d = CleanDir(dir);
  std::error_code ec;
  if (!fs::is_directory(d, ec)) return NotFound("checkpoint directory " + d.string() + " does not exist");
  const fs::path sums_path = d / kChecksums;
  if (!fs::exists(sums_path, ec)) {
    if (!required) return Status::Ok();
    return DataLoss(sums_path.string() + " is missing (the checkpoint was not finished)");
  }
  ECHELON_ASSIGN_OR_RETURN(nlohmann::json sums, ReadJsonFile(sums_path.string()));
  if (!sums.is_object() || !sums.contains("files") || !sums["files"].is_object() || sums["files"].empty())
    return DataLoss(sums_path.string() + ": expected {\"files\": {name: {bytes, sha256}}}");
  for (const auto& [name, entry] : sums["files"].items()) {
    const fs::path file = d / name;
    if (name.find('/') != std::string::npos || !entry.is_object() || !entry.contains("bytes") ||
        !entry["bytes"].is_number_unsigned() || !entry.contains("sha256") || !entry["sha256"].is_string())
      return DataLoss(sums_path.string() + ": malformed entry for '" + name + "'");
    uint64_t size = 0;
    Result<std::string> sha = Sha256HexOfFile(file.string(), &size);  // read in pieces: no whole-file copy
    if (!sha.ok()) return DataLoss(file.string() + " is listed in checksums.json but cannot be read");
    if (size != entry["bytes"].get<uint64_t>())
      return DataLoss(file.string() + " has " + std::to_string(size) + " bytes, checksums.json says " +
                      std::to_string(entry["bytes"].get<uint64_t>()) + " (truncated or overwritten)");
    if (sha.value() != entry["sha256"].get<std::string>())
      return DataLoss(file.string() + ": SHA-256 differs from checksums.json (corrupt)");
  }
  return Status::Ok();
}

}  // namespace echelon::model
