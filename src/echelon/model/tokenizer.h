// CharTokenizer: one token per character (bytes of the text, ASCII in practice), with three
// special tokens in front: <pad>=0, <bos>=1, <eos>=2. Stored in a checkpoint as a Hugging Face
// `tokenizer.json` that encodes to the same ids: a byte-level BPE without merges whose
// vocabulary is the characters (ids 3, 4, ...) and whose added special tokens are the three
// above, so `transformers`, vLLM and SGLang load a run's checkpoints with their tokenizer.
// FromJson also reads the older {"type": "char", "specials": [...], "chars": "..."}.
//
//   CharTokenizer tok = CharTokenizer::ForAlphabet("0123456789+-= ");
//   std::vector<int64_t> ids = tok.Encode("37+48=");   // no specials added
//
// Thread contract: immutable after construction; safe for concurrent use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::model {

class CharTokenizer {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kBos = 1;
  static constexpr int64_t kEos = 2;

  CharTokenizer() = default;
  // A character repeated in `chars` keeps its first id (FromJson rejects repeats).
  static CharTokenizer ForAlphabet(const std::string& chars);
  static Result<CharTokenizer> FromJson(const nlohmann::json& j, const std::string& where);
  nlohmann::json ToJson() const;

  int64_t vocab_size() const { return 3 + static_cast<int64_t>(chars_.size()); }
  const std::string& alphabet() const { return chars_; }  // the characters, in id order from 3
  // Fails on a character outside the alphabet, naming it and its position.
  Result<std::vector<int64_t>> Encode(const std::string& text) const;
  // Specials decode to nothing; ids outside the vocabulary decode to '?'.
  std::string Decode(const std::vector<int64_t>& ids) const;

 private:
  std::string chars_;
  std::array<int64_t, 256> index_{};  // byte -> id, -1 if absent
};

}  // namespace echelon::model
