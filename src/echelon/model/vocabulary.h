// Vocabulary: how a run turns text into token ids and back, whichever tokenizer its model has.
// It holds a codec (the character tokenizer of model/tokenizer.h or a Hugging Face byte-level
// BPE, tokenizer/tokenizer.h), the BOS id put before every prompt (none for Qwen), the ids that
// end a completion (the first one is appended after warm-start demonstrations), and the
// tokenizer files every checkpoint of the run carries, byte for byte as they came.
//
//   Vocabulary chars = Vocabulary::Characters("0123456789+-= ");       // built-in tasks
//   ECHELON_ASSIGN_OR_RETURN(Vocabulary v, Vocabulary::FromDir("models/qwen3", {151645}));
//   ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> ids, v.EncodePrompt("37+48="));
//   std::string answer = v.DecodeCompletion(sampled);   // stop id and special tokens dropped
//
// What goes before a prompt (the reference's post-processor, as `transformers` applies it): when
// tokenizer_config.json sets `add_bos_token`, its `bos_token` or nothing; otherwise the leading
// special tokens of tokenizer.json's TemplateProcessing post-processor (Llama 3's
// <|begin_of_text|>); nothing for Qwen2 / Qwen3. The character tokenizer: its <bos>.
//
// WithChat() makes prompts chat turns: each prompt text becomes one user message rendered
// with the model's chat template (tokenizer/chat_template.h) and the generation prompt, then
// encoded with no prefix (the template writes BOS itself), as apply_chat_template does.
//
// Thread contract: immutable after construction; copies share state; safe for concurrent use.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/model/generate.h"
#include "echelon/tokenizer/chat_template.h"

namespace echelon::model {

// Text <-> token ids for any tokenizer a model directory may carry.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Nothing is added (no BOS/EOS); special tokens written in the text are matched.
  virtual Result<std::vector<int64_t>> Encode(const std::string& text) const = 0;
  // Special tokens decode to their text unless `skip_special`. Fails on an id outside the
  // vocabulary.
  virtual Result<std::string> Decode(const std::vector<int64_t>& ids, bool skip_special = false) const = 0;
  // The id of a special/added token spelled exactly `text`, or -1.
  virtual int64_t SpecialTokenId(const std::string& text) const = 0;
  // One past the largest id the tokenizer knows.
  virtual int64_t id_end() const = 0;
};

// File name -> bytes (tokenizer.json, tokenizer_config.json, ...).
using TokenizerFiles = std::map<std::string, std::string>;

// A special token named in tokenizer_config.json (`key`: "bos_token", "eos_token",
// "pad_token"), written as a string or as {"content": ...}; nullopt when absent or neither.
std::optional<std::string> SpecialTokenText(const nlohmann::json& tokenizer_config, const std::string& key);

class Vocabulary {
 public:
  Vocabulary();  // the empty alphabet; for default construction of holders only
  // The character tokenizer over `alphabet`: BOS 1, stop 2, pad 0.
  static Vocabulary Characters(const std::string& alphabet);
  // From tokenizer files (tokenizer.json required; tokenizer_config.json and the other files a
  // Hugging Face directory keeps are carried along). A tokenizer.json that is an echelon
  // character tokenizer gives its fixed special ids; otherwise `stop_ids` (at least one) end
  // completions (none: they run to their token limit). Errors name `where` and the file.
  static Result<Vocabulary> FromFiles(TokenizerFiles files, std::vector<int64_t> stop_ids, const std::string& where);
  // Reads the tokenizer files of a model directory.
  static Result<Vocabulary> FromDir(const std::string& dir, std::vector<int64_t> stop_ids);
  // The names FromDir reads (whichever exist) and checkpoints carry: the tokenizer's files, the
  // chat template, and generation_config.json (its sampling defaults are kept; the ids in it
  // are rewritten from this vocabulary when a checkpoint is saved).
  static const std::vector<std::string>& FileNames();

  // Prompts rendered as one user turn of the chat template (tokenizer_config.json's
  // chat_template, else chat_template.jinja). Fails, naming the template, when there is none
  // or its family is not supported.
  Result<Vocabulary> WithChat(std::optional<bool> enable_thinking) const;
  bool chat() const { return chat_ != nullptr; }
  // The raw chat template the files carry ("" when none).
  const std::string& chat_template() const { return chat_template_; }
  // tokenizer_config.json's bos_token ("" when none), for templates that write it.
  const std::string& bos_text() const { return bos_text_; }

  // As handed to actors in the run spec: {"files": {...}, "stop_ids": [...], "chat": ...}.
  nlohmann::json ToJson() const;
  static Result<Vocabulary> FromJson(const nlohmann::json& j, const std::string& where);

  bool is_characters() const { return characters_; }
  const TextCodec& codec() const { return *codec_; }
  std::shared_ptr<const TextCodec> shared_codec() const { return codec_; }
  int64_t id_end() const { return codec_->id_end(); }
  const std::vector<int64_t>& prompt_prefix() const { return prefix_; }  // usually BOS or nothing
  int64_t bos() const { return prefix_.empty() ? -1 : prefix_.front(); }
  int64_t pad() const { return pad_; }  // -1: none
  const std::vector<int64_t>& stop_ids() const { return stop_ids_; }
  const TokenizerFiles& files() const { return *files_; }
  // The stop ids as config.json's "eos_token_id" spells them: an id, a list, or null.
  nlohmann::json eos_json() const;

  Result<std::vector<int64_t>> Encode(const std::string& text) const { return codec_->Encode(text); }
  // The prompt prefix followed by the text's ids; with chat, the rendered user turn's ids.
  Result<std::vector<int64_t>> EncodePrompt(const std::string& text) const { return EncodePrompt("", text); }
  // The same after a system message ("" none): with chat a system turn then the user turn;
  // without, the system text, "\n", then the user text.
  Result<std::vector<int64_t>> EncodePrompt(const std::string& system, const std::string& user) const;
  // The text of a sampled completion: a trailing stop id and special tokens dropped, ids the
  // tokenizer does not know (rows of a padded embedding) as U+FFFD.
  std::string DecodeCompletion(std::vector<int64_t> ids) const;
  // Generation stops at every stop id (at none when there are none).
  void SetStops(SamplingParams* sp) const;

 private:
  void InitCharacters(const std::string& alphabet);

  std::shared_ptr<const TextCodec> codec_;
  std::shared_ptr<const TokenizerFiles> files_;
  std::vector<int64_t> stop_ids_;
  std::vector<int64_t> prefix_;
  std::string chat_template_;
  std::string bos_text_;  // tokenizer_config.json's bos_token, for templates that write it
  std::shared_ptr<const tokenizer::ChatTemplate> chat_;
  tokenizer::ChatRenderOptions chat_options_;
  int64_t pad_ = -1;
  bool characters_ = false;
};

}  // namespace echelon::model
