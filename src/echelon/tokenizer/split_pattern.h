// The split regexes of byte-level BPE tokenizers (GPT-2, Qwen2/Qwen3, Llama-3), matched by hand.
//
//   Result<SplitPattern> p = SplitPattern::Parse(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|...)");
//   std::vector<std::string_view> pieces;
//   p->Split("I'm 42", &pieces);   // "I", "'m", " ", "4", "2"
//
// Parse splits the pattern at its top-level '|' and accepts it only when every alternative is
// one of the known forms below; anything else is refused with an error naming the pattern and
// the alternative. Matching follows the semantics of Oniguruma, the engine the reference uses:
// at each position the first alternative that matches wins (leftmost-first), quantifiers are
// greedy with backtracking, \s is White_Space, \p{L} and \p{N} are general categories, and the
// case-insensitive contractions also fold U+017F (long s) to 's'. Split behaviour is Isolated:
// every match is a piece, and so is any text between matches.
//
// Known alternatives:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)   's  't  're  've  'm  'll  'd
//   [^\r\n\p{L}\p{N}]?\p{L}+        ?\p{L}+
//   \p{N}   \p{N}{1,3}   ?\p{N}+
//    ?[^\s\p{L}\p{N}]+[\r\n]*       ?[^\s\p{L}\p{N}]+
//   \s*[\r\n]+   \s+(?!\S)   \s+
//
// Thread contract: immutable after Parse; safe for concurrent use.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::tokenizer {

class SplitPattern {
 public:
  static Result<SplitPattern> Parse(const std::string& regex);
  // The pattern ByteLevel uses when its own use_regex is on.
  static SplitPattern Gpt2();

  // Appends the pieces of `text` (well-formed UTF-8) to *pieces; they cover `text` exactly.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

  const std::string& regex() const { return regex_; }

 private:
  enum class Alt {
    kContractionsCaseless,    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    kLiteral,                 // 's 't 're 've 'm 'll 'd
    kOptNonWordThenLetters,   // [^\r\n\p{L}\p{N}]?\p{L}+
    kOptSpaceThenLetters,     //  ?\p{L}+
    kNumber,                  // \p{N}
    kNumbersUpTo3,            // \p{N}{1,3}
    kOptSpaceThenNumbers,     //  ?\p{N}+
    kOptSpaceThenOtherCrLf,   //  ?[^\s\p{L}\p{N}]+[\r\n]*
    kOptSpaceThenOther,       //  ?[^\s\p{L}\p{N}]+
    kSpacesThenCrLf,          // \s*[\r\n]+
    kSpacesNotBeforeNonSpace, // \s+(?!\S)
    kSpaces,                  // \s+
  };
  struct Alternative {
    Alt kind;
    std::u32string literal;  // kLiteral only
  };
  struct Text;  // code points and their classes

  size_t MatchAt(const Alternative& alt, const Text& t, size_t i) const;

  std::string regex_;
  std::vector<Alternative> alts_;
};

}  // namespace echelon::tokenizer
