#include "echelon/model/vocabulary.h"

#include <algorithm>
#include <filesystem>

#include "echelon/common/fs.h"
#include "echelon/model/tokenizer.h"
#include "echelon/tokenizer/tokenizer.h"

namespace echelon::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CharCodec final : public TextCodec {
 public:
  explicit CharCodec(CharTokenizer tok) : tok_(std::move(tok)) {}
  Result<std::vector<int64_t>> Encode(const std::string& text) const override { return tok_.Encode(text); }
  Result<std::string> Decode(const std::vector<int64_t>& ids, bool /*skip_special*/) const override {
    for (int64_t id : ids)
      if (id < 0 || id >= tok_.vocab_size()) return InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary");
    return tok_.Decode(ids);  // the specials have no text
  }
  int64_t SpecialTokenId(const std::string& text) const override {
    if (text == "<pad>") return CharTokenizer::kPad;
    if (text == "<bos>") return CharTokenizer::kBos;
    if (text == "<eos>") return CharTokenizer::kEos;
    return -1;
  }
  int64_t id_end() const override { return tok_.vocab_size(); }

 private:
  CharTokenizer tok_;
};

class BpeCodec final : public TextCodec {
 public:
  explicit BpeCodec(tokenizer::Tokenizer tok) : tok_(std::move(tok)) {}
  Result<std::vector<int64_t>> Encode(const std::string& text) const override {
    ECHELON_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok_.Encode(text));
    return std::vector<int64_t>(ids.begin(), ids.end());
  }
  Result<std::string> Decode(const std::vector<int64_t>& ids, bool skip_special) const override {
    std::vector<int32_t> narrow;
    for (int64_t id : ids) {
      if (id < 0 || id >= tok_.id_end()) return InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary");
      narrow.push_back(static_cast<int32_t>(id));
    }
    return tok_.Decode(narrow, skip_special);
  }
  int64_t SpecialTokenId(const std::string& text) const override {
    for (const tokenizer::AddedToken& t : tok_.added_tokens())
      if (t.content == text) return t.id;
    return -1;
  }
  int64_t id_end() const override { return tok_.id_end(); }

 private:
  tokenizer::Tokenizer tok_;
};

}  // namespace

std::optional<std::string> SpecialTokenText(const json& tokenizer_config, const std::string& key) {
  if (!tokenizer_config.is_object() || !tokenizer_config.contains(key)) return std::nullopt;
  const json& v = tokenizer_config[key];
  const json text = v.is_object() ? v.value("content", json()) : v;
  if (!text.is_string()) return std::nullopt;
  return text.get<std::string>();
}

namespace {

// The ids a Hugging Face tokenizer puts in front of a text (see the header).
Result<std::vector<int64_t>> BpePromptPrefix(const json& tokenizer_json, const json& config_json,
                                             const TextCodec& codec, const std::string& tok_name,
                                             const std::string& config_name) {
  if (config_json.is_object() && config_json.contains("add_bos_token") && config_json["add_bos_token"].is_boolean()) {
    if (!config_json["add_bos_token"].get<bool>()) return std::vector<int64_t>{};
    const std::optional<std::string> text = SpecialTokenText(config_json, "bos_token");
    const int64_t id = text ? codec.SpecialTokenId(*text) : -1;
    if (id < 0)
      return InvalidArgument(config_name + ": add_bos_token is true but bos_token " +
                             config_json.value("bos_token", json()).dump() + " is not a token");
    return std::vector<int64_t>{id};
  }
  // TemplateProcessing, alone or inside a Sequence: its leading special tokens.
  std::vector<const json*> processors;
  const json* pp = tokenizer_json.is_object() && tokenizer_json.contains("post_processor")
                       ? &tokenizer_json["post_processor"]
                       : nullptr;
  if (pp != nullptr && pp->is_object()) {
    if (pp->value("type", "") == "Sequence" && pp->contains("processors") && (*pp)["processors"].is_array()) {
      for (const json& p : (*pp)["processors"]) processors.push_back(&p);
    } else {
      processors.push_back(pp);
    }
  }
  std::vector<int64_t> prefix;
  for (const json* p : processors) {
    if (!p->is_object() || p->value("type", "") != "TemplateProcessing" || !p->contains("single") ||
        !(*p)["single"].is_array())
      continue;
    for (const json& piece : (*p)["single"]) {
      if (!piece.is_object() || !piece.contains("SpecialToken") || !piece["SpecialToken"].is_object()) break;
      const std::string name = piece["SpecialToken"].value("id", "");
      const json specials = p->value("special_tokens", json::object());
      if (!specials.is_object() || !specials.contains(name) || !specials[name].is_object() ||
          !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        return InvalidArgument(tok_name + ": post_processor special token \"" + name + "\" has no ids");
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) return InvalidArgument(tok_name + ": post_processor ids must be integers");
        prefix.push_back(id.get<int64_t>());
      }
    }
  }
  return prefix;
}


}  // namespace

Vocabulary::Vocabulary() { InitCharacters(""); }

Vocabulary Vocabulary::Characters(const std::string& alphabet) {
  Vocabulary v;
  v.InitCharacters(alphabet);
  return v;
}

void Vocabulary::InitCharacters(const std::string& alphabet) {
  const CharTokenizer tok = CharTokenizer::ForAlphabet(alphabet);
  Vocabulary& v = *this;
  v.codec_ = std::make_shared<CharCodec>(tok);
  // What Hugging Face loaders read besides tokenizer.json: the class and the special tokens.
  v.files_ = std::make_shared<const TokenizerFiles>(TokenizerFiles{
      {"tokenizer.json", tok.ToJson().dump(2) + "\n"},
      {"tokenizer_config.json", json{{"tokenizer_class", "PreTrainedTokenizerFast"},
                                     {"pad_token", "<pad>"},
                                     {"bos_token", "<bos>"},
                                     {"eos_token", "<eos>"},
                                     {"add_bos_token", false},
                                     {"add_eos_token", false}}
                                        .dump(2) +
                                    "\n"}});
  v.stop_ids_ = {CharTokenizer::kEos};
  v.prefix_ = {CharTokenizer::kBos};
  v.bos_text_ = "<bos>";
  v.pad_ = CharTokenizer::kPad;
  v.characters_ = true;
}

const std::vector<std::string>& Vocabulary::FileNames() {
  static const std::vector<std::string> names = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                 "vocab.json",     "merges.txt",            "added_tokens.json",
                                                 "chat_template.jinja", "generation_config.json"};
  return names;
}

Result<Vocabulary> Vocabulary::FromFiles(TokenizerFiles files, std::vector<int64_t> stop_ids, const std::string& where) {
  auto tj = files.find("tokenizer.json");
  if (tj == files.end()) return NotFound(where + "/tokenizer.json is missing");
  const std::string tok_name = where + "/tokenizer.json";
  ECHELON_ASSIGN_OR_RETURN(json tok_json, ParseJson(tj->second, tok_name));
  if (Result<CharTokenizer> chars = CharTokenizer::FromJson(tok_json, tok_name); chars.ok()) {
    // Rebuilt from the alphabet, so the files are the ones Characters() writes.
    return Characters(chars->alphabet());
  }
  auto tc = files.find("tokenizer_config.json");
  const std::string config_text = tc == files.end() ? "" : tc->second;
  const std::string config_name = where + "/tokenizer_config.json";
  ECHELON_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok,
                           tokenizer::Tokenizer::FromJsonText(tj->second, tok_name, config_text, config_name));
  json config_json;
  if (!config_text.empty()) {
    ECHELON_ASSIGN_OR_RETURN(config_json, ParseJson(config_text, config_name));
  }
  Vocabulary v;
  v.characters_ = false;
  v.codec_ = std::make_shared<BpeCodec>(std::move(tok));
  for (int64_t id : stop_ids)
    if (id < 0) return InvalidArgument(where + ": stop token id " + std::to_string(id) + " is negative");
  v.stop_ids_ = std::move(stop_ids);
  ECHELON_ASSIGN_OR_RETURN(v.prefix_, BpePromptPrefix(tok_json, config_json, *v.codec_, tok_name, config_name));
  // The chat template: a string, or [{"name": "default", "template": ...}, ...].
  const json t = config_json.is_object() ? config_json.value("chat_template", json()) : json();
  if (t.is_string()) {
    v.chat_template_ = t.get<std::string>();
  } else if (t.is_array()) {
    for (const json& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        v.chat_template_ = e["template"].get<std::string>();
  }
  if (auto jinja = files.find("chat_template.jinja"); v.chat_template_.empty() && jinja != files.end())
    v.chat_template_ = jinja->second;
  if (const std::optional<std::string> bos = SpecialTokenText(config_json, "bos_token")) {
    v.bos_text_ = *bos;
  } else if (config_json.is_object() && !config_json.value("bos_token", json()).is_null()) {
    return InvalidArgument(config_name + ": bos_token must be a string or {\"content\": ...}");
  }
  const std::optional<std::string> pad = SpecialTokenText(config_json, "pad_token");
  v.pad_ = pad ? v.codec_->SpecialTokenId(*pad) : -1;
  v.files_ = std::make_shared<const TokenizerFiles>(std::move(files));
  return v;
}

Result<Vocabulary> Vocabulary::FromDir(const std::string& dir, std::vector<int64_t> stop_ids) {
  TokenizerFiles files;
  std::error_code ec;
  for (const std::string& name : FileNames()) {
    const fs::path p = fs::path(dir) / name;
    if (!fs::exists(p, ec)) continue;
    ECHELON_ASSIGN_OR_RETURN(files[name], ReadFile(p.string()));
  }
  return FromFiles(std::move(files), std::move(stop_ids), dir);
}

json Vocabulary::eos_json() const {
  if (stop_ids_.empty()) return nullptr;
  return stop_ids_.size() == 1 ? json(stop_ids_[0]) : json(stop_ids_);
}

Result<Vocabulary> Vocabulary::WithChat(std::optional<bool> enable_thinking) const {
  if (chat_template_.empty())
    return FailedPrecondition("the tokenizer has no chat template (tokenizer_config.json chat_template or chat_template.jinja)");
  ECHELON_ASSIGN_OR_RETURN(tokenizer::ChatTemplate t, tokenizer::ChatTemplate::FromRaw(chat_template_, bos_text_));
  Vocabulary v = *this;
  v.chat_ = std::make_shared<const tokenizer::ChatTemplate>(std::move(t));
  v.chat_options_.add_generation_prompt = true;
  v.chat_options_.enable_thinking = enable_thinking;
  return v;
}

json Vocabulary::ToJson() const {
  json j = {{"files", *files_}, {"stop_ids", stop_ids_}};
  if (chat_) {
    const std::optional<bool>& think = chat_options_.enable_thinking;
    j["chat"] = {{"enable_thinking", think ? json(*think) : json(nullptr)}};
  }
  return j;
}

Result<Vocabulary> Vocabulary::FromJson(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object() || !j.contains("stop_ids") ||
      !j["stop_ids"].is_array())
    return InvalidArgument(where + ": the vocabulary must be {\"files\": {name: text}, \"stop_ids\": [ids]}");
  TokenizerFiles files;
  for (const auto& [name, text] : j["files"].items()) {
    // The names become file names on an actor's disk (the openai-http backend writes them
    // beside each snapshot): only the tokenizer files a model directory has, never a path.
    const std::vector<std::string>& known = FileNames();
    if (std::find(known.begin(), known.end(), name) == known.end())
      return InvalidArgument(where + ": vocabulary file \"" + name + "\" is not a tokenizer file name (tokenizer.json, "
                             "tokenizer_config.json, ...)");
    if (!text.is_string()) return InvalidArgument(where + ": vocabulary file " + name + " is not a string");
    files[name] = text.get<std::string>();
  }
  std::vector<int64_t> stops;
  for (const json& id : j["stop_ids"]) {
    if (!id.is_number_integer()) return InvalidArgument(where + ": stop_ids must be integers");
    stops.push_back(id.get<int64_t>());
  }
  ECHELON_ASSIGN_OR_RETURN(Vocabulary v, FromFiles(std::move(files), std::move(stops), where));
  if (!j.contains("chat")) return v;
  const json think = j["chat"].is_object() ? j["chat"].value("enable_thinking", json()) : json();
  if (!think.is_null() && !think.is_boolean()) return InvalidArgument(where + ": chat.enable_thinking must be a boolean or null");
  return v.WithChat(think.is_null() ? std::nullopt : std::optional<bool>(think.get<bool>()));
}

Result<std::vector<int64_t>> Vocabulary::EncodePrompt(const std::string& system, const std::string& user) const {
  if (chat_) {
    std::vector<tokenizer::ChatMessage> messages;
    if (!system.empty()) messages.emplace_back("system", system);
    messages.emplace_back("user", user);
    ECHELON_ASSIGN_OR_RETURN(std::string rendered, chat_->Render(messages, chat_options_));
    return codec_->Encode(rendered);
  }
  ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> ids, codec_->Encode(system.empty() ? user : system + "\n" + user));
  ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  return ids;
}

std::string Vocabulary::DecodeCompletion(std::vector<int64_t> ids) const {
  if (!ids.empty() && std::find(stop_ids_.begin(), stop_ids_.end(), ids.back()) != stop_ids_.end()) ids.pop_back();
  if (Result<std::string> all = codec_->Decode(ids, /*skip_special=*/true); all.ok()) return std::move(all).value();
  // Some id has no token: decode the runs between such ids and mark each with U+FFFD.
  std::string out;
  std::vector<int64_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    Result<std::string> part = codec_->Decode(run, /*skip_special=*/true);
    out += part.ok() ? part.value() : "\xEF\xBF\xBD";
    run.clear();
  };
  for (int64_t id : ids) {
    if (codec_->Decode({id}, true).ok()) {
      run.push_back(id);
    } else {
      flush();
      out += "\xEF\xBF\xBD";
    }
  }
  flush();
  return out;
}

void Vocabulary::SetStops(SamplingParams* sp) const {
  sp->eos_token_id = stop_ids_.empty() ? -1 : stop_ids_.front();
  sp->stop_token_ids.assign(stop_ids_.begin() + (stop_ids_.empty() ? 0 : 1), stop_ids_.end());
}

}  // namespace echelon::model
