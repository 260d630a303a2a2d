// Byte-level BPE model: the `model` object of a Hugging Face tokenizer.json of type BPE.
//
//   Result<BpeModel> m = BpeModel::FromJson(j["model"], "dir/tokenizer.json");
//   std::vector<int32_t> ids;
//   m->Tokenize("hello", &ids);       // one pre-token, raw bytes (byte-level mapping inside)
//
// Each byte of a pre-token maps to one printable character (the GPT-2 byte alphabet: bytes
// that are printable Latin-1 map to themselves, the other 68 to U+0100..U+0143 in order); the
// pre-token starts as one symbol per byte and the adjacent pair with the lowest merge rank is
// merged (leftmost first on ties) until no pair has a merge. With ignore_merges a pre-token
// that is itself in the vocabulary is emitted as that one token. A byte whose character is not
// in the vocabulary becomes unk_token if there is one (fused when fuse_unk) and is dropped
// otherwise. Results for pre-tokens under 256 bytes are cached.
//
// Thread contract: immutable after FromJson except the cache, which a mutex guards; safe for
// concurrent use.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::tokenizer {

// The byte-level alphabet.
char32_t ByteToChar(uint8_t b);
// The byte a character of the alphabet stands for, or -1.
int CharToByte(char32_t c);
// Each byte of `bytes` replaced by its alphabet character, as UTF-8.
std::string BytesToSymbols(std::string_view bytes);

class BpeModel {
 public:
  // `where` (the file name) prefixes every error.
  static Result<BpeModel> FromJson(const nlohmann::json& model, const std::string& where);

  void Tokenize(std::string_view bytes, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when the id is not in the vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id.
  int32_t id_end() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t merged_id;
  };
  struct Cache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> entries;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void Merge(std::string_view bytes, std::vector<int32_t>* out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_known_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of each byte's alphabet character, or -1
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
};

}  // namespace echelon::tokenizer
