#include "echelon/tokenizer/tokenizer.h"

#include <algorithm>
#include <bitset>
#include <filesystem>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "echelon/common/fs.h"
#include "echelon/tokenizer/bpe.h"
#include "echelon/tokenizer/split_pattern.h"
#include "echelon/tokenizer/unicode.h"

namespace echelon::tokenizer {
namespace {

using nlohmann::json;

// Finds added tokens in text: leftmost match first, the longest one at that position.
class TokenMatcher {
 public:
  TokenMatcher() : nodes_(1) {}

  void Add(std::string_view content, int32_t token) {
    if (content.empty()) return;
    first_.set(static_cast<uint8_t>(content[0]));
    int32_t node = 0;
    for (char c : content) {
      const auto b = static_cast<uint8_t>(c);
      int32_t child = Child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = token;  // the first of equal contents wins
  }

  bool empty() const { return nodes_.size() == 1; }

  bool Find(std::string_view text, size_t from, size_t* start, size_t* end, int32_t* token) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_.test(static_cast<uint8_t>(text[i]))) continue;
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < text.size(); ++j) {
        node = Child(node, static_cast<uint8_t>(text[j]));
        if (node < 0) break;
        if (nodes_[node].token >= 0) {
          best = nodes_[node].token;
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        *start = i;
        *end = best_end;
        *token = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;
  };
  int32_t Child(int32_t node, uint8_t b) const {
    for (const auto& [byte, child] : nodes_[node].children) {
      if (byte == b) return child;
    }
    return -1;
  }

  std::vector<Node> nodes_;
  std::bitset<256> first_;
};

Status Bad(const std::string& where, const std::string& what) { return InvalidArgument(where + ": " + what); }

// The "type" of a component object, or "" when it has none.
std::string TypeOf(const json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}


Status ReadBool(const json& obj, const char* key, const std::string& where, bool* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Bad(where, std::string(key) + " must be true or false, got " + it->dump());
  *out = it->get<bool>();
  return Status::Ok();
}

// Reads the content and flags of one added token (not its id).
Status ReadAddedToken(const json& j, const std::string& where, AddedToken* t) {
  if (!j.is_object()) return Bad(where, "must be an object, got " + j.dump());
  auto content = j.find("content");
  if (content == j.end() || !content->is_string()) return Bad(where, "needs a string \"content\"");
  t->content = content->get<std::string>();
  if (t->content.empty()) return Bad(where, "content is empty");
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "special", where, &t->special));
  t->normalized = !t->special;
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "normalized", where, &t->normalized));
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "single_word", where, &t->single_word));
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "lstrip", where, &t->lstrip));
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "rstrip", where, &t->rstrip));
  return Status::Ok();
}

}  // namespace

struct Tokenizer::Impl {
  BpeModel model;
  bool nfc = false;
  std::vector<SplitPattern> splits;  // the Split steps of the pre-tokenizer, in order
  bool prefix_space = false;         // ByteLevel add_prefix_space
  std::optional<SplitPattern> byte_level_split;  // ByteLevel use_regex
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, size_t> added_by_content;
  std::unordered_set<std::string> special_contents;
  TokenMatcher raw_matcher;         // added tokens with normalized=false
  TokenMatcher normalized_matcher;  // added tokens with normalized=true, contents normalized

  Status ParseNormalizer(const json& j, const std::string& where);
  Status ParsePreTokenizer(const json& j, const std::string& where);
  Status ParseByteLevel(const json& j, const std::string& where);
  Status AddToken(const AddedToken& t, const std::string& where);
  void BuildMatchers();

  // Cuts the added tokens `matcher` finds out of `text`; on_text gets the rest.
  template <typename OnText>
  void SplitAdded(std::string_view text, const TokenMatcher& matcher, std::vector<int32_t>* ids, OnText on_text) const;
  void EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const;
};

Status Tokenizer::Impl::ParseNormalizer(const json& j, const std::string& where) {
  if (j.is_null()) return Status::Ok();
  const std::string type = TypeOf(j);
  if (type == "NFC") {
    nfc = true;
    return Status::Ok();
  }
  if (type == "Sequence") {
    auto list = j.find("normalizers");
    if (list == j.end() || !list->is_array()) return Bad(where, "normalizer Sequence needs an array \"normalizers\"");
    for (const json& n : *list) ECHELON_RETURN_IF_ERROR(ParseNormalizer(n, where));
    return Status::Ok();
  }
  return Bad(where, "normalizer " + (type.empty() ? j.dump() : "type \"" + type + "\"") +
                        " is not supported (only NFC, a Sequence of NFC, or null)");
}

Status Tokenizer::Impl::ParseByteLevel(const json& j, const std::string& where) {
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "add_prefix_space", where + ": pre_tokenizer ByteLevel", &prefix_space));
  bool use_regex = true;
  ECHELON_RETURN_IF_ERROR(ReadBool(j, "use_regex", where + ": pre_tokenizer ByteLevel", &use_regex));
  if (use_regex) byte_level_split = SplitPattern::Gpt2();
  return Status::Ok();
}

Status Tokenizer::Impl::ParsePreTokenizer(const json& j, const std::string& where) {
  const std::string type = TypeOf(j);
  if (type == "ByteLevel") return ParseByteLevel(j, where);
  if (type != "Sequence") {
    return Bad(where, "pre_tokenizer " + (type.empty() ? j.dump() : "type \"" + type + "\"") +
                          " is not supported (expected ByteLevel, or a Sequence of Split steps ending in ByteLevel)");
  }
  auto list = j.find("pretokenizers");
  if (list == j.end() || !list->is_array() || list->empty()) {
    return Bad(where, "pre_tokenizer Sequence needs a non-empty array \"pretokenizers\"");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const json& step = (*list)[i];
    const std::string at = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
    const std::string step_type = TypeOf(step);
    const bool last = i + 1 == list->size();
    if (step_type == "ByteLevel" && last) return ParseByteLevel(step, where);
    if (step_type != "Split") {
      return Bad(where, at + " " + (step_type.empty() ? step.dump() : "type \"" + step_type + "\"") +
                            " is not supported (expected Split steps ending in one ByteLevel)");
    }
    auto pattern = step.find("pattern");
    if (pattern == step.end() || !pattern->is_object()) return Bad(where, at + " needs a \"pattern\" object");
    auto regex = pattern->find("Regex");
    if (regex == pattern->end() || !regex->is_string()) {
      return Bad(where, at + " pattern " + pattern->dump() + " is not supported (only {\"Regex\": ...})");
    }
    auto behavior = step.find("behavior");
    if (behavior == step.end() || *behavior != "Isolated") {
      return Bad(where, at + " behavior " + (behavior == step.end() ? std::string("(missing)") : behavior->dump()) +
                            " is not supported (only \"Isolated\")");
    }
    bool invert = false;
    ECHELON_RETURN_IF_ERROR(ReadBool(step, "invert", where + ": " + at, &invert));
    if (invert) return Bad(where, at + " invert true is not supported");
    Result<SplitPattern> p = SplitPattern::Parse(regex->get<std::string>());
    if (!p.ok()) return Bad(where, at + ": " + p.status().message());
    splits.push_back(std::move(p).value());
  }
  return Bad(where, "pre_tokenizer Sequence must end with a ByteLevel step");
}

Status Tokenizer::Impl::AddToken(const AddedToken& t, const std::string& where) {
  if (auto id = model.TokenToId(t.content); id && *id != t.id) {
    return Bad(where, "\"" + t.content + "\" has id " + std::to_string(t.id) + " but model.vocab gives it id " +
                          std::to_string(*id));
  }
  if (const std::string* other = model.IdToToken(t.id); other != nullptr && *other != t.content) {
    return Bad(where, "\"" + t.content + "\" has id " + std::to_string(t.id) + ", which model.vocab gives to \"" +
                          *other + "\"");
  }
  if (auto it = added_by_id.find(t.id); it != added_by_id.end()) {
    return Bad(where, "id " + std::to_string(t.id) + " is given to both \"" + added[it->second].content + "\" and \"" +
                          t.content + "\"");
  }
  if (auto it = added_by_content.find(t.content); it != added_by_content.end()) {
    return Bad(where, "\"" + t.content + "\" is listed twice (ids " + std::to_string(added[it->second].id) + " and " +
                          std::to_string(t.id) + ")");
  }
  added_by_id[t.id] = added.size();
  added_by_content[t.content] = added.size();
  added.push_back(t);
  return Status::Ok();
}

void Tokenizer::Impl::BuildMatchers() {
  special_contents.clear();
  // Special tokens first, as the reference orders its matching set.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& t = added[i];
      if (t.special != (pass == 0)) continue;
      if (t.special) special_contents.insert(t.content);
      if (t.normalized) {
        normalized_matcher.Add(nfc ? Nfc(t.content) : t.content, static_cast<int32_t>(i));
      } else {
        raw_matcher.Add(t.content, static_cast<int32_t>(i));
      }
    }
  }
}

template <typename OnText>
void Tokenizer::Impl::SplitAdded(std::string_view text, const TokenMatcher& matcher, std::vector<int32_t>* ids,
                                 OnText on_text) const {
  size_t done = 0;  // text before this is consumed
  size_t search = 0;
  size_t start, end;
  int32_t index;
  auto space_at = [&text](size_t i) {
    size_t k = i;
    return CharClassOf(NextCodePoint(text, &k)) & kSpace;
  };
  while (!matcher.empty() && matcher.Find(text, search, &start, &end, &index)) {
    search = end;
    const AddedToken& t = added[index];
    if (t.single_word) {
      size_t k = end;
      const bool word_before = start > 0 && IsWordChar(PrevCodePoint(text, start));
      const bool word_after = end < text.size() && IsWordChar(NextCodePoint(text, &k));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > done) {
        size_t p = s - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        if (!space_at(p)) break;
        s = p;
      }
      start = s;
    }
    if (t.rstrip) {
      while (end < text.size() && space_at(end)) NextCodePoint(text, &end);
      // The reference resumes matching at the token's own end, which can only differ for a
      // token that starts with whitespace (its pieces would then overlap); resume after.
      search = end;
    }
    if (done < start) on_text(text.substr(done, start - done));
    ids->push_back(t.id);
    done = end;
  }
  if (done < text.size()) on_text(text.substr(done));
}

void Tokenizer::Impl::EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const {
  std::vector<std::string_view> pieces{piece}, next;
  for (const SplitPattern& split : splits) {
    next.clear();
    for (std::string_view p : pieces) split.Split(p, &next);
    pieces.swap(next);
  }
  std::string prefixed;
  std::vector<std::string_view> words;
  for (std::string_view p : pieces) {
    if (prefix_space && (p.empty() || p[0] != ' ')) {
      prefixed = " ";
      prefixed += p;
      p = prefixed;
    }
    if (byte_level_split) {
      words.clear();
      byte_level_split->Split(p, &words);
      for (std::string_view w : words) model.Tokenize(w, ids);
    } else {
      model.Tokenize(p, ids);
    }
  }
}

Result<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  const std::string config_path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  std::string config;
  if (std::filesystem::exists(config_path)) {
    Result<std::string> c = ReadFile(config_path);
    if (!c.ok()) return c.status();
    config = std::move(c).value();
    if (config.empty()) return Bad(config_path, "file is empty");
  }
  return FromJsonText(text.value(), path, config, config_path);
}

Result<Tokenizer> Tokenizer::FromJsonText(const std::string& tokenizer_json, const std::string& tokenizer_name,
                                          const std::string& config_json, const std::string& config_name) {
  const std::string& where = tokenizer_name;
  ECHELON_ASSIGN_OR_RETURN(json j, ParseJson(tokenizer_json, where));
  if (!j.is_object()) return Bad(where, "must be a JSON object, got " + std::string(j.type_name()));
  auto impl = std::make_shared<Impl>();

  auto model = j.find("model");
  if (model == j.end()) return Bad(where, "missing model");
  ECHELON_ASSIGN_OR_RETURN(impl->model, BpeModel::FromJson(*model, where));

  auto normalizer = j.find("normalizer");
  if (normalizer != j.end()) ECHELON_RETURN_IF_ERROR(impl->ParseNormalizer(*normalizer, where));

  auto pre = j.find("pre_tokenizer");
  if (pre == j.end() || pre->is_null()) {
    return Bad(where, "pre_tokenizer is missing; a byte-level tokenizer needs ByteLevel");
  }
  ECHELON_RETURN_IF_ERROR(impl->ParsePreTokenizer(*pre, where));

  auto decoder = j.find("decoder");
  const std::string decoder_type = decoder == j.end() ? "" : TypeOf(*decoder);
  if (decoder_type != "ByteLevel") {
    return Bad(where, "decoder " + (decoder == j.end() ? std::string("(missing)") : decoder->dump()) +
                          " is not supported (only ByteLevel)");
  }

  auto added = j.find("added_tokens");
  if (added != j.end() && !added->is_null()) {
    if (!added->is_array()) return Bad(where, "added_tokens must be an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& e = (*added)[i];
      const std::string at = where + ": added_tokens[" + std::to_string(i) + "]";
      AddedToken t;
      ECHELON_RETURN_IF_ERROR(ReadAddedToken(e, at, &t));
      auto id = e.find("id");
      if (id == e.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
        return Bad(at, "needs a non-negative integer \"id\"");
      }
      t.id = static_cast<int32_t>(id->get<int64_t>());
      ECHELON_RETURN_IF_ERROR(impl->AddToken(t, at));
    }
  }

  if (!config_json.empty()) {
    ECHELON_ASSIGN_OR_RETURN(json c, ParseJson(config_json, config_name));
    if (!c.is_object()) return Bad(config_name, "must be a JSON object, got " + std::string(c.type_name()));
    auto decoder_map = c.find("added_tokens_decoder");
    if (decoder_map != c.end() && !decoder_map->is_null()) {
      if (!decoder_map->is_object()) return Bad(config_name, "added_tokens_decoder must be an object of \"id\": token");
      for (auto it = decoder_map->begin(); it != decoder_map->end(); ++it) {
        const std::string at = config_name + ": added_tokens_decoder[\"" + it.key() + "\"]";
        const std::string& key = it.key();
        if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos) {
          return Bad(at, "the key must be a token id");
        }
        AddedToken t;
        ECHELON_RETURN_IF_ERROR(ReadAddedToken(it.value(), at, &t));
        t.id = std::stoi(key);
        auto known = impl->added_by_id.find(t.id);
        if (known == impl->added_by_id.end()) {
          ECHELON_RETURN_IF_ERROR(impl->AddToken(t, at));
        } else if (impl->added[known->second].content != t.content) {
          return Bad(at, "content \"" + t.content + "\" differs from \"" + impl->added[known->second].content +
                             "\", which " + where + " gives id " + key);
        } else {
          impl->added[known->second] = t;
        }
      }
    }
  }
  impl->BuildMatchers();
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  return tok;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) return InvalidArgument("text is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  im.SplitAdded(text, im.raw_matcher, &ids, [&](std::string_view piece) {
    const std::string normalized = im.nfc ? Nfc(piece) : std::string(piece);
    im.SplitAdded(normalized, im.normalized_matcher, &ids, [&](std::string_view rest) { im.EncodePiece(rest, &ids); });
  });
  return ids;
}

Result<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    if (auto it = im.added_by_id.find(id); it != im.added_by_id.end()) {
      token = &im.added[it->second].content;
    } else {
      token = im.model.IdToToken(id);
    }
    if (token == nullptr) return InvalidArgument("id " + std::to_string(id) + " is not in the vocabulary");
    if (skip_special_tokens && im.special_contents.count(*token) > 0) continue;
    const size_t mark = bytes.size();
    bool in_alphabet = true;
    for (size_t i = 0; i < token->size() && in_alphabet;) {
      const int b = CharToByte(NextCodePoint(*token, &i));
      if (b < 0) {
        in_alphabet = false;
      } else {
        bytes.push_back(static_cast<char>(b));
      }
    }
    if (!in_alphabet) {
      bytes.resize(mark);
      bytes += *token;
    }
  }
  return DecodeUtf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) {
    return impl_->added[it->second].id;
  }
  return impl_->model.TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (const std::string* t = impl_->model.IdToToken(id)) return *t;
  return std::nullopt;
}

int32_t Tokenizer::id_end() const {
  int32_t end = impl_->model.id_end();
  for (const AddedToken& t : impl_->added) end = std::max(end, t.id + 1);
  return end;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

}  // namespace echelon::tokenizer
