#include "echelon/model/tokenizer.h"

#include <cstdio>

#include "echelon/tokenizer/bpe.h"

namespace echelon::model {
namespace {

const char* const kSpecials[] = {"<pad>", "<bos>", "<eos>"};

std::string Printable(unsigned char c) {
  if (c >= 32 && c < 127) return std::string("'") + static_cast<char>(c) + "'";
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", c);
  return buf;
}

}  // namespace

CharTokenizer CharTokenizer::ForAlphabet(const std::string& chars) {
  CharTokenizer t;
  t.index_.fill(-1);
  for (unsigned char c : chars) {
    if (t.index_[c] >= 0) continue;  // a repeated character keeps its first id
    t.index_[c] = 3 + static_cast<int64_t>(t.chars_.size());
    t.chars_.push_back(static_cast<char>(c));
  }
  return t;
}

namespace {

// The Hugging Face form ToJson writes: the characters back from the vocabulary, or an error
// saying why this is not one of ours.
Result<std::string> CharsFromHfJson(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(where + ": not a character tokenizer (" + why + ")");
  };
  const nlohmann::json* model = j.contains("model") && j["model"].is_object() ? &j["model"] : nullptr;
  if (model == nullptr || model->value("type", "") != "BPE") return bad("model.type is not BPE");
  if (!model->contains("merges") || !(*model)["merges"].is_array() || !(*model)["merges"].empty())
    return bad("it has merges");
  if (!j.contains("added_tokens") || !j["added_tokens"].is_array() || j["added_tokens"].size() != 3) return bad("added_tokens");
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& t = j["added_tokens"][i];
    if (!t.is_object() || t.value("id", -1) != i || t.value("content", "") != kSpecials[i]) return bad("added_tokens");
  }
  if (!model->contains("vocab") || !(*model)["vocab"].is_object()) return bad("model.vocab");
  const nlohmann::json& vocab = (*model)["vocab"];
  std::string chars(vocab.size(), '\0');
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [symbol, id] : vocab.items()) {
    if (!id.is_number_integer()) return bad("vocab id of " + symbol);
    const int64_t k = id.get<int64_t>() - 3;
    if (k < 0 || k >= static_cast<int64_t>(vocab.size()) || seen[k]) return bad("vocab ids are not 3, 4, ...");
    int found = -1;
    for (int b = 0; b < 256 && found < 0; ++b)
      if (tokenizer::BytesToSymbols(std::string(1, static_cast<char>(b))) == symbol) found = b;
    if (found < 0) return bad("vocab entry \"" + symbol + "\" is not one byte");
    chars[k] = static_cast<char>(found);
    seen[k] = true;
  }
  return chars;
}

}  // namespace

Result<CharTokenizer> CharTokenizer::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": tokenizer must be a JSON object");
  if (!j.contains("type")) {
    ECHELON_ASSIGN_OR_RETURN(std::string chars, CharsFromHfJson(j, where));
    return ForAlphabet(chars);
  }
  if (j["type"] != "char") {
    return InvalidArgument(where + ": tokenizer \"type\" must be \"char\"");
  }
  const nlohmann::json specials = nlohmann::json(std::vector<std::string>(std::begin(kSpecials), std::end(kSpecials)));
  if (!j.contains("specials") || j["specials"] != specials) {
    return InvalidArgument(where + ": tokenizer \"specials\" must be " + specials.dump());
  }
  if (!j.contains("chars") || !j["chars"].is_string()) {
    return InvalidArgument(where + ": tokenizer \"chars\" must be a string");
  }
  const std::string chars = j["chars"].get<std::string>();
  CharTokenizer t = ForAlphabet(chars);
  if (t.chars_.size() != chars.size()) {
    return InvalidArgument(where + ": tokenizer \"chars\" has a repeated character");
  }
  return t;
}

nlohmann::json CharTokenizer::ToJson() const {
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", i},
                     {"content", kSpecials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t k = 0; k < chars_.size(); ++k) vocab[tokenizer::BytesToSymbols(chars_.substr(k, 1))] = 3 + k;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", nlohmann::json::array()}}}};
}

Result<std::vector<int64_t>> CharTokenizer::Encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // index_ is all zeros in a default-constructed tokenizer; 0 is never a character id.
    if (index_[c] < 3) {
      return InvalidArgument("character " + Printable(c) + " at position " + std::to_string(i) +
                             " is not in the tokenizer alphabet");
    }
    ids.push_back(index_[c]);
  }
  return ids;
}

std::string CharTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < 3) continue;
    out.push_back(id >= 3 && id < vocab_size() ? chars_[static_cast<size_t>(id - 3)] : '?');
  }
  return out;
}

}  // namespace echelon::model
