#include "echelon/model/tokenizer.h"

#include <cstdio>

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

Result<CharTokenizer> CharTokenizer::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": tokenizer must be a JSON object");
  if (!j.contains("type") || j["type"] != "char") {
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
  return {{"type", "char"},
          {"specials", std::vector<std::string>(std::begin(kSpecials), std::end(kSpecials))},
          {"chars", chars_}};
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
