#include "echelon/tokenizer/bpe.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "echelon/tokenizer/unicode.h"

namespace echelon::tokenizer {
namespace {

struct ByteAlphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // indexed by character; every character is below U+0144

  ByteAlphabet() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

constexpr size_t kMaxCachedBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;

Status BadField(const std::string& where, const std::string& what) {
  return InvalidArgument(where + ": " + what);
}

// Reads an optional boolean field; null counts as absent.
Status OptionalBool(const nlohmann::json& obj, const char* key, const std::string& where, bool* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return BadField(where, std::string(key) + " must be true or false, got " + it->dump());
  *out = it->get<bool>();
  return Status::Ok();
}

}  // namespace

char32_t ByteToChar(uint8_t b) { return Alphabet().to_char[b]; }

int CharToByte(char32_t c) { return c < Alphabet().to_byte.size() ? Alphabet().to_byte[c] : -1; }

std::string BytesToSymbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &out);
  return out;
}

Result<BpeModel> BpeModel::FromJson(const nlohmann::json& model, const std::string& where) {
  if (!model.is_object()) return BadField(where, "model must be an object, got " + std::string(model.type_name()));
  const std::string at = where + ": model";
  if (auto type = model.find("type"); type != model.end() && !type->is_null()) {
    if (!type->is_string()) return BadField(at, "type must be a string");
    if (type->get<std::string>() != "BPE") {
      return BadField(at, "type \"" + type->get<std::string>() + "\" is not supported (only BPE)");
    }
  }
  BpeModel m;

  auto vocab = model.find("vocab");
  if (vocab == model.end()) return BadField(where, "missing model.vocab");
  if (!vocab->is_object()) return BadField(where, "model.vocab must be an object of token: id, got " + std::string(vocab->type_name()));
  if (vocab->empty()) return BadField(where, "model.vocab is empty");
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const nlohmann::json& id = it.value();
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max() - 1) {
      return BadField(where, "model.vocab[\"" + it.key() + "\"] must be a non-negative integer id, got " + id.dump());
    }
    max_id = std::max(max_id, id.get<int64_t>());
  }
  m.id_to_token_.resize(max_id + 1);
  m.id_known_.assign(max_id + 1, false);
  m.vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    if (m.id_known_[id]) {
      return BadField(where, "model.vocab gives id " + std::to_string(id) + " to both \"" + m.id_to_token_[id] +
                                 "\" and \"" + it.key() + "\"");
    }
    m.id_known_[id] = true;
    m.id_to_token_[id] = it.key();
    m.vocab_.emplace(it.key(), id);
  }

  auto merges = model.find("merges");
  if (merges == model.end()) return BadField(where, "missing model.merges");
  if (!merges->is_array()) return BadField(where, "model.merges must be an array, got " + std::string(merges->type_name()));
  m.merges_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& e = (*merges)[i];
    const std::string name = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return BadField(where, name + " must be \"left right\" (two tokens, one space), got " + e.dump());
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return BadField(where, name + " must be \"left right\" or [\"left\", \"right\"], got " + e.dump());
    }
    auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), im = m.vocab_.find(a + b);
    if (ia == m.vocab_.end()) return BadField(where, name + " " + e.dump() + " names \"" + a + "\", which is not in model.vocab");
    if (ib == m.vocab_.end()) return BadField(where, name + " " + e.dump() + " names \"" + b + "\", which is not in model.vocab");
    if (im == m.vocab_.end()) {
      return BadField(where, name + " " + e.dump() + " makes \"" + a + b + "\", which is not in model.vocab");
    }
    // A pair listed twice keeps its last rank, as the reference's map does.
    m.merges_[PairKey(ia->second, ib->second)] = MergeInfo{static_cast<int32_t>(i), im->second};
  }

  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0) return BadField(at, "dropout " + d->dump() + " is not supported (only null or 0)");
  }
  bool byte_fallback = false;
  ECHELON_RETURN_IF_ERROR(OptionalBool(model, "byte_fallback", at, &byte_fallback));
  if (byte_fallback) return BadField(at, "byte_fallback true is not supported by a byte-level tokenizer");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return BadField(at, std::string(key) + " " + it->dump() + " is not supported (only null or \"\")");
    }
  }
  ECHELON_RETURN_IF_ERROR(OptionalBool(model, "ignore_merges", at, &m.ignore_merges_));
  ECHELON_RETURN_IF_ERROR(OptionalBool(model, "fuse_unk", at, &m.fuse_unk_));
  if (auto unk = model.find("unk_token"); unk != model.end() && !unk->is_null()) {
    if (!unk->is_string()) return BadField(at, "unk_token must be a string or null, got " + unk->dump());
    auto it = m.vocab_.find(unk->get<std::string>());
    if (it == m.vocab_.end()) return BadField(at, "unk_token " + unk->dump() + " is not in model.vocab");
    m.unk_id_ = it->second;
  }

  std::string symbol;
  for (int b = 0; b < 256; ++b) {
    symbol.clear();
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &symbol);
    auto it = m.vocab_.find(symbol);
    m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_end() || !id_known_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view bytes, std::vector<int32_t>* out) const {
  if (bytes.empty()) return;
  const bool cacheable = bytes.size() < kMaxCachedBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->entries.find(std::string(bytes));
    if (it != cache_->entries.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  bool whole = false;
  if (ignore_merges_) {
    auto it = vocab_.find(BytesToSymbols(bytes));
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) Merge(bytes, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->entries.size() < kMaxCacheEntries) cache_->entries.emplace(std::string(bytes), std::move(ids));
  }
}

void BpeModel::Merge(std::string_view bytes, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(bytes.size());
  auto push = [&syms](int32_t id) {
    const auto pos = static_cast<int32_t>(syms.size());
    syms.push_back({id, pos - 1, -1, true});
    if (pos > 0) syms[pos - 1].next = pos;
  };
  bool pending_unk = false;
  for (char c : bytes) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      if (pending_unk) push(unk_id_);
      pending_unk = false;
      push(id);
    } else if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) push(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) push(unk_id_);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t left) {
    const int32_t right = syms[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(syms[left].id, syms[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = syms[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Entries go stale when a neighbour merged since they were queued.
    auto it = merges_.find(PairKey(left.id, syms[left.next].id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    Symbol& right = syms[left.next];
    right.alive = false;
    left.id = top.merged_id;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol& s : syms) {
    if (s.alive) out->push_back(s.id);
  }
}

}  // namespace echelon::tokenizer
