// UTF-8 and the few Unicode properties the tokenizer needs, from ICU.
//
//   size_t bad;
//   if (!IsValidUtf8(text, &bad)) ...;                  // byte offset of the first ill-formed byte
//   uint8_t cls = CharClassOf(U'é');                    // kLetter
//   std::string s = Nfc("e\u0301");                     // "é"
//   std::string t = DecodeUtf8Lossy("\xe4\xb8");         // "\uFFFD"
//
// Property definitions follow the regex engines Hugging Face tokenizers use: \p{L} is the
// general categories Lu Ll Lt Lm Lo, \p{N} is Nd Nl No, \s is the White_Space property, and
// \w (added-token single_word checks) is Alphabetic, marks, Nd, Pc and Join_Control.
// Thread contract: free functions, no shared mutable state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace echelon::tokenizer {

enum CharClass : uint8_t {
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kSpace = 4,   // \s (White_Space)
};

uint8_t CharClassOf(char32_t c);
bool IsWordChar(char32_t c);

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
// On failure *bad_offset (if given) is the offset of the first byte of the bad sequence.
bool IsValidUtf8(std::string_view s, size_t* bad_offset = nullptr);

// Decodes the code point starting at s[*i] of well-formed UTF-8 and advances *i past it.
char32_t NextCodePoint(std::string_view s, size_t* i);
// Decodes the code point ending just before s[end] of well-formed UTF-8.
char32_t PrevCodePoint(std::string_view s, size_t end);
void AppendUtf8(char32_t c, std::string* out);

// Bytes to text; each maximal ill-formed subpart becomes one U+FFFD (Unicode's recommended
// practice, which Rust's String::from_utf8_lossy and the WHATWG decoder both follow).
std::string DecodeUtf8Lossy(std::string_view bytes);

// Unicode NFC of well-formed UTF-8.
std::string Nfc(std::string_view s);

}  // namespace echelon::tokenizer
