// Hugging Face byte-level BPE tokenizer (tokenizer.json as Qwen2, Qwen3 and Llama-3 ship it),
// encoding to the same ids as the reference `tokenizers` library.
//
//   Result<Tokenizer> tok = Tokenizer::Load("models/qwen3");   // tokenizer.json [+ tokenizer_config.json]
//   Result<std::vector<int32_t>> ids = tok->Encode("<|im_start|>user\nHi!");
//   Result<std::string> text = tok->Decode(ids.value());
//
// Encode, in the reference's order: (1) added tokens with normalized=false are cut out of the
// raw text; (2) each remaining piece is normalized (NFC or nothing) and added tokens with
// normalized=true are cut out of it; (3) each remaining piece is pre-tokenized (the Split
// patterns of split_pattern.h, then ByteLevel: optional prefix space, optional GPT-2 split)
// and (4) each pre-token goes through the BPE model (bpe.h). Added tokens match leftmost,
// longest first; single_word drops a match next to a word character, lstrip/rstrip make the
// token swallow the whitespace on its left/right. Nothing is added around the result (no
// BOS/EOS: the post-processor is not applied).
//
// Decode maps ids to tokens (added tokens to their content), drops special tokens when asked,
// turns byte-level characters back into bytes (a token with a character outside the
// alphabet contributes its own UTF-8) and reads the bytes as UTF-8, ill-formed parts as U+FFFD.
//
// tokenizer_config.json, when present, may carry `added_tokens_decoder` {"id": {content,
// special, lstrip, rstrip, single_word, normalized}}: its flags override tokenizer.json's and
// tokens it adds become added tokens. Every malformed file is refused with one error naming
// the file and the problem. Thread contract: immutable after loading (the BPE cache is
// internally locked); safe for concurrent use; copies share state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json.
  static Result<Tokenizer> Load(const std::string& dir);
  // From file contents; the names label errors. An empty `config_json` means no config file.
  static Result<Tokenizer> FromJsonText(const std::string& tokenizer_json, const std::string& tokenizer_name,
                                        const std::string& config_json = "", const std::string& config_name = "");

  // Fails only on text that is not well-formed UTF-8 (naming the byte offset).
  Result<std::vector<int32_t>> Encode(std::string_view text) const;
  // Fails on an id that is neither in the vocabulary nor an added token.
  Result<std::string> Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // One past the largest id of the vocabulary and the added tokens.
  int32_t id_end() const;
  const std::vector<AddedToken>& added_tokens() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace echelon::tokenizer
