#include "echelon/tokenizer/split_pattern.h"

#include <utility>

#include "echelon/tokenizer/unicode.h"

namespace echelon::tokenizer {
namespace {

// Splits a regex at its top-level '|' (outside groups and character classes).
std::vector<std::string> TopLevelAlternatives(const std::string& re, bool* balanced) {
  std::vector<std::string> alts(1);
  int depth = 0;
  bool in_class = false;
  *balanced = true;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      alts.back() += re.substr(i, 2);
      ++i;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      if (--depth < 0) *balanced = false;
    } else if (c == '|' && depth == 0) {
      alts.emplace_back();
      continue;
    }
    alts.back() += c;
  }
  if (depth != 0 || in_class) *balanced = false;
  return alts;
}

bool IsCrLf(char32_t c) { return c == U'\r' || c == U'\n'; }

char32_t AsciiLower(char32_t c) { return (c >= U'A' && c <= U'Z') ? c + 32 : c; }

}  // namespace

struct SplitPattern::Text {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<size_t> offset;  // byte offset of each code point, plus the end

  explicit Text(std::string_view s) {
    cp.reserve(s.size());
    cls.reserve(s.size());
    offset.reserve(s.size() + 1);
    for (size_t i = 0; i < s.size();) {
      offset.push_back(i);
      const char32_t c = NextCodePoint(s, &i);
      cp.push_back(c);
      cls.push_back(CharClassOf(c));
    }
    offset.push_back(s.size());
  }
  size_t size() const { return cp.size(); }
  bool Letter(size_t i) const { return i < cp.size() && (cls[i] & kLetter); }
  bool Number(size_t i) const { return i < cp.size() && (cls[i] & kNumber); }
  bool Space(size_t i) const { return i < cp.size() && (cls[i] & kSpace); }
  // [^\s\p{L}\p{N}]
  bool Other(size_t i) const { return i < cp.size() && cls[i] == 0; }
  // End of the run of positions from i satisfying pred.
  template <typename Pred>
  size_t RunEnd(size_t i, Pred pred) const {
    while (i < cp.size() && pred(i)) ++i;
    return i;
  }
};

Result<SplitPattern> SplitPattern::Parse(const std::string& regex) {
  static const std::vector<std::pair<std::string, Alt>> kKnown = {
      {"(?i:'s|'t|'re|'ve|'m|'ll|'d)", Alt::kContractionsCaseless},
      {R"([^\r\n\p{L}\p{N}]?\p{L}+)", Alt::kOptNonWordThenLetters},
      {R"( ?\p{L}+)", Alt::kOptSpaceThenLetters},
      {R"(\p{N})", Alt::kNumber},
      {R"(\p{N}{1,3})", Alt::kNumbersUpTo3},
      {R"( ?\p{N}+)", Alt::kOptSpaceThenNumbers},
      {R"( ?[^\s\p{L}\p{N}]+[\r\n]*)", Alt::kOptSpaceThenOtherCrLf},
      {R"( ?[^\s\p{L}\p{N}]+)", Alt::kOptSpaceThenOther},
      {R"(\s*[\r\n]+)", Alt::kSpacesThenCrLf},
      {R"(\s+(?!\S))", Alt::kSpacesNotBeforeNonSpace},
      {R"(\s+)", Alt::kSpaces},
  };
  static const std::vector<std::string> kLiterals = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  auto refuse = [&regex](const std::string& why) {
    return InvalidArgument("Split pattern \"" + regex + "\" is not supported (" + why +
                           "; known: the GPT-2, Qwen2/Qwen3 and Llama-3 split patterns)");
  };
  bool balanced = true;
  const std::vector<std::string> parts = TopLevelAlternatives(regex, &balanced);
  if (!balanced) return refuse("unbalanced parentheses or brackets");
  SplitPattern p;
  p.regex_ = regex;
  for (const std::string& part : parts) {
    bool found = false;
    for (const auto& [text, kind] : kKnown) {
      if (part == text) {
        p.alts_.push_back({kind, {}});
        found = true;
        break;
      }
    }
    for (const std::string& lit : kLiterals) {
      if (!found && part == lit) {
        p.alts_.push_back({Alt::kLiteral, std::u32string(lit.begin(), lit.end())});
        found = true;
      }
    }
    if (!found) return refuse("alternative \"" + part + "\" is not one of the known forms");
  }
  return p;
}

SplitPattern SplitPattern::Gpt2() {
  Result<SplitPattern> p = Parse(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  return std::move(p).value();
}

size_t SplitPattern::MatchAt(const Alternative& alt, const Text& t, size_t i) const {
  const size_t n = t.size();
  auto letter = [&t](size_t k) { return t.Letter(k); };
  auto number = [&t](size_t k) { return t.Number(k); };
  auto space = [&t](size_t k) { return t.Space(k); };
  auto other = [&t](size_t k) { return t.Other(k); };
  switch (alt.kind) {
    case Alt::kContractionsCaseless: {
      if (t.cp[i] != U'\'' || i + 1 >= n) return 0;
      const char32_t a = AsciiLower(t.cp[i + 1]);
      // Unicode simple case folding maps U+017F LATIN SMALL LETTER LONG S to 's'.
      if (a == U's' || a == U'\u017F' || a == U't' || a == U'm' || a == U'd') return 2;
      if (i + 2 >= n) return 0;
      const char32_t b = AsciiLower(t.cp[i + 2]);
      if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
      return 0;
    }
    case Alt::kLiteral: {
      if (i + alt.literal.size() > n) return 0;
      for (size_t k = 0; k < alt.literal.size(); ++k) {
        if (t.cp[i + k] != alt.literal[k]) return 0;
      }
      return alt.literal.size();
    }
    case Alt::kOptNonWordThenLetters: {
      if (t.Letter(i)) return t.RunEnd(i, letter) - i;
      // The optional class excludes letters, numbers and CR/LF; a letter must follow it.
      if (!t.Number(i) && !IsCrLf(t.cp[i]) && t.Letter(i + 1)) return t.RunEnd(i + 1, letter) - i;
      return 0;
    }
    case Alt::kOptSpaceThenLetters: {
      if (t.cp[i] == U' ' && t.Letter(i + 1)) return t.RunEnd(i + 1, letter) - i;
      if (t.Letter(i)) return t.RunEnd(i, letter) - i;
      return 0;
    }
    case Alt::kNumber:
      return t.Number(i) ? 1 : 0;
    case Alt::kNumbersUpTo3: {
      const size_t end = t.RunEnd(i, number);
      return std::min<size_t>(end - i, 3);
    }
    case Alt::kOptSpaceThenNumbers: {
      if (t.cp[i] == U' ' && t.Number(i + 1)) return t.RunEnd(i + 1, number) - i;
      if (t.Number(i)) return t.RunEnd(i, number) - i;
      return 0;
    }
    case Alt::kOptSpaceThenOtherCrLf:
    case Alt::kOptSpaceThenOther: {
      size_t end;
      if (t.cp[i] == U' ' && t.Other(i + 1)) {
        end = t.RunEnd(i + 1, other);
      } else if (t.Other(i)) {
        end = t.RunEnd(i, other);
      } else {
        return 0;
      }
      if (alt.kind == Alt::kOptSpaceThenOtherCrLf) end = t.RunEnd(end, [&t](size_t k) { return IsCrLf(t.cp[k]); });
      return end - i;
    }
    case Alt::kSpacesThenCrLf: {
      // \s* backs off until [\r\n]+ can match: the match ends after the last CR or LF of the
      // whitespace run.
      const size_t end = t.RunEnd(i, space);
      for (size_t k = end; k > i; --k) {
        if (IsCrLf(t.cp[k - 1])) return k - i;
      }
      return 0;
    }
    case Alt::kSpacesNotBeforeNonSpace: {
      const size_t end = t.RunEnd(i, space);
      if (end == i) return 0;
      if (end == n) return end - i;
      return end - 1 - i;  // leave the last space to the non-space that follows (0 if none left)
    }
    case Alt::kSpaces:
      return t.RunEnd(i, space) - i;
  }
  return 0;
}

void SplitPattern::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  const Text t(text);
  const size_t n = t.size();
  auto emit = [&](size_t from, size_t to) {
    pieces->push_back(text.substr(t.offset[from], t.offset[to] - t.offset[from]));
  };
  size_t gap_start = 0;
  size_t i = 0;
  while (i < n) {
    size_t len = 0;
    for (const Alternative& alt : alts_) {
      len = MatchAt(alt, t, i);
      if (len > 0) break;
    }
    if (len == 0) {
      ++i;
      continue;
    }
    if (gap_start < i) emit(gap_start, i);
    emit(i, i + len);
    i += len;
    gap_start = i;
  }
  if (gap_start < n) emit(gap_start, n);
}

}  // namespace echelon::tokenizer
