// A checkpoint is a directory in the Hugging Face layout: `config.json`, `model.safetensors`,
// the vocabulary's tokenizer files (`tokenizer.json` + `tokenizer_config.json`, ...;
// model/vocabulary.h), `generation_config.json`,
// any extra files the caller adds (the trainer's state), and `checksums.json` (size and
// SHA-256 of every other file). It is written whole or not at all: files go to
// "<dir>.tmp-<pid>" and are fsync'd, checksums.json last, then the directory is renamed into
// place (an older one at the same path is replaced).
//
//   ECHELON_RETURN_IF_ERROR(SaveCheckpoint(dir, model, vocab));
//   ECHELON_ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(dir));
//
// Thread contract: free functions; the model must not be written by another thread meanwhile.
#pragma once

#include <map>
#include <string>

#include "echelon/common/status.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/tokenizer.h"
#include "echelon/model/vocabulary.h"

namespace echelon::model {

struct LoadedCheckpoint {
  ModelConfig config;
  Vocabulary vocab;
  Qwen3Model model{nullptr};
};

// One file of a checkpoint: its bytes, or a safetensors file written straight from its
// tensors' memory (no whole-file string: a checkpoint of the weights and AdamW state costs no
// second copy of them).
struct CheckpointFile {
  CheckpointFile() = default;
  CheckpointFile(std::string b) : bytes(std::move(b)) {}                      // NOLINT: implicit
  CheckpointFile(const char* b) : bytes(b) {}                                 // NOLINT: implicit
  CheckpointFile(SafetensorsParts p) : parts(std::move(p)), streamed(true) {}  // NOLINT: implicit
  // A file already written (as it was gathered, learn/learner_ranks.h), moved into the
  // checkpoint: its path on the same filesystem, its size and SHA-256 (hex).
  static CheckpointFile Written(std::string path, uint64_t size, std::string sha256);
  std::vector<std::string_view> Views() const;
  std::string bytes;
  SafetensorsParts parts;
  bool streamed = false;
  std::string written_path, written_sha256;
  uint64_t written_size = 0;
};
// File name -> contents, stored beside the weights and covered by checksums.json.
using CheckpointFiles = std::map<std::string, CheckpointFile>;
// The weights' file of a checkpoint (the storage dtype) and its safetensors metadata.
inline constexpr const char* kWeightsFile = "model.safetensors";
inline const std::map<std::string, std::string> kWeightsMetadata = {{"format", "pt"}};

// Hugging Face's sharded weights (save_pretrained's max_shard_size): the tensors in order over
// files of at most `max_bytes` of tensor data each (a tensor, or a unit of them, larger than
// that gets a file of its own), named model-0000i-of-0000n.safetensors, listed by
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}), which
// transformers, vLLM and model/hf_model.h follow. When everything fits one file it is
// kWeightsFile, with no index.
inline constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"
struct WeightsShard {
  std::string file;
  size_t first = 0, end = 0;  // the items [first, end) it holds
  uint64_t bytes = 0;
};
// The files of items of `sizes` bytes each, in order (items: tensors, or a learner's units).
std::vector<WeightsShard> PlanWeightsShards(const std::vector<uint64_t>& sizes, uint64_t max_bytes);
// The index of `shards`, whose items hold the tensors `names[i]`.
std::string WeightsIndex(const std::vector<WeightsShard>& shards, const std::vector<std::vector<std::string>>& names);

// config.json carries the vocabulary's stop ids as "eos_token_id"; generation_config.json its
// BOS, stop and pad ids. Refused when the tokenizer has more ids than the model has rows.
// `extra` may hold kWeightsFile (or kWeightsIndexFile and its shards) itself (weights gathered
// elsewhere): `model` then gives its config alone. Otherwise the model's weights are written in
// one file, or with `max_shard_bytes` > 0 split as Hugging Face's sharded weights (above).
Status SaveCheckpoint(const std::string& dir, const Qwen3Model& model, const Vocabulary& vocab,
                      const CheckpointFiles& extra = {}, uint64_t max_shard_bytes = 0);
// The same with the character tokenizer's vocabulary.
Status SaveCheckpoint(const std::string& dir, const Qwen3Model& model, const CharTokenizer& tokenizer,
                      const CheckpointFiles& extra = {});
// The writer underneath: `files` (plain names) plus checksums.json, whole or not at all.
Status WriteCheckpointDir(const std::string& dir, const CheckpointFiles& files);
// Checks every file listed in `dir`/checksums.json (present, same size, same SHA-256); the
// error names the file. With `required` false a directory without checksums.json passes
// (checkpoints from elsewhere); with it true that is an error too.
Status VerifyCheckpoint(const std::string& dir, bool required);
// Any directory LoadModelDir reads (model/hf_model.h) that has a tokenizer. Errors name the
// directory and file: checksum mismatches (when checksums.json exists), missing files, bad
// JSON, safetensors problems, missing or mismatched tensors, a tokenizer with more ids than
// config.json's vocab_size. `mapped`: as LoadModelDir's.
Result<LoadedCheckpoint> LoadCheckpoint(const std::string& dir, bool mapped = false);

}  // namespace echelon::model
