// SafeRegex: regular expressions over untrusted text that cannot overflow the stack and run in
// time linear in the text. A Pike VM (a Thompson NFA simulation that carries submatches) runs
// the compiled pattern over the text once; it never backtracks and never recurses while
// matching, so a completion of a million characters costs a million steps of at most the
// program's size, and memory is O(program size x groups) however long the text is.
//
//   ECHELON_ASSIGN_OR_RETURN(SafeRegex re, SafeRegex::Compile("answer: (\\d+)", "task option regex"));
//   bool whole = re.FullMatch(text);                       // std::regex_match
//   std::optional<SafeRegex::Match> last = re.LastMatch(text);  // last of std::sregex_iterator
//
// Syntax: the ECMAScript subset std::regex reads, over bytes: literals, `.` (any byte but \n and
// \r), \d \D \w \W \s \S \b \B \t \n \r \f \v \0 \xHH \uHHHH (HHHH below 0x80) and escaped
// punctuation, classes [...] with ranges, negation and those escapes, ^ and $ (text start and
// end only), capturing (...) and non-capturing (?:...) groups, |, and * + ? {n} {n,} {n,m}, each
// greedy or lazy (*? ...). Compile refuses, naming the construct and its offset: backreferences,
// lookahead and lookbehind, named groups, POSIX classes [[:alpha:]], \c, unknown letter escapes,
// a quantifier with nothing to repeat or after another quantifier, and anything else unknown.
// Limits: a pattern of at most 4096 bytes, groups nested at most 200 deep, a counted repetition
// of at most 1000, at most 100,000 instructions once repetitions are expanded, and at most 3
// repetitions or optional parts that can match empty inside one repetition that can match empty,
// itself included: (((a*)*)*)* compiles, ((((a*)*)*)*)* does not (see below).
//
// Which match, and which submatch, is std::regex's (libstdc++, ECMAScript), differential-tested
// against it: leftmost, then the first path in backtracking priority order (alternatives left to
// right, greedy before lazy); a group inside a repetition keeps the value of the last iteration
// that set it. For a repetition whose body can match empty libstdc++ does not follow the
// ECMAScript standard (which rejects an empty iteration): it lets a path enter the body at most
// twice at one text position, so `(|a)*` first matches empty at 0 and `(a|)*` on "aa" ends with
// group 1 empty at 2. SafeRegex reproduces that by counting those entries per position in its
// state; the combinations of counts are why such repetitions may not nest more than 3 deep.
// Deliberate differences: SafeRegex refuses what std::regex reads oddly or not at all in a
// Pike VM (\cX read as X, \q, a** and a{2}{3}, \u0141 read as 'A', POSIX classes, lookahead,
// backreferences), and accepts [\x00-\xff] and [a-\]] that libstdc++ rejects.
//
// Thread contract: immutable after Compile; FullMatch and LastMatch keep their scratch space on
// the call and may run concurrently on one SafeRegex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::data {

class SafeRegex {
 public:
  static constexpr size_t kMaxPatternBytes = 4096;
  static constexpr int kMaxNesting = 200;
  static constexpr int kMaxRepeat = 1000;
  static constexpr size_t kMaxInstructions = 100000;

  struct Match {
    size_t begin = 0, end = 0;  // the whole match is text[begin, end)
    // groups[i] is group i+1's span [first, second), nullopt when it took no part in the match.
    std::vector<std::optional<std::pair<size_t, size_t>>> groups;
  };

  // Errors name `where` (e.g. "task option regex") and what is wrong at which byte offset of
  // the pattern.
  static Result<SafeRegex> Compile(std::string_view pattern, const std::string& where);

  // The whole text matches (std::regex_match).
  bool FullMatch(std::string_view text) const;

  // The last of the non-overlapping matches std::sregex_iterator visits left to right; nullopt
  // when there is none. After an empty match the iterator first looks for a non-empty match at
  // the same position (then, as libstdc++ does before its first full search, with ^ holding and
  // \b seeing no byte before that position), then searches from the next byte. One pass over
  // the text, however many matches.
  std::optional<Match> LastMatch(std::string_view text) const;

  // The number of capturing groups.
  int groups() const { return groups_; }

  // Implementation types, for the compiler and the matcher in safe_regex.cc; not an interface.
  enum class Op : uint8_t {
    kByte,          // consume one byte equal to `arg`
    kSet,           // consume one byte in sets_[arg]
    kMatch,         // the pattern matched
    kJmp,           // continue at x
    kSplit,         // continue at x, then (lower priority) at y
    kSave,          // capture slot `arg` = the current position
    kAssert,        // zero-width test `arg` (Assertion below)
    kCountedSplit,  // a repeat node counting its body's entries per position (digit weight `arg`)
  };
  enum Assertion : int { kTextBegin, kTextEnd, kWordBoundary, kNotWordBoundary };
  struct Inst {
    Op op;
    int32_t arg = 0;
    int32_t x = 0, y = 0;
    bool greedy = true;          // kCountedSplit: x (the body) before y (what follows)
    bool leaves_region = false;  // kCountedSplit: y is outside its counted region
  };
  struct ByteSet {
    uint64_t bits[4] = {0, 0, 0, 0};
    bool Has(unsigned char c) const { return (bits[c >> 6] >> (c & 63)) & 1; }
    void Add(unsigned char c) { bits[c >> 6] |= uint64_t{1} << (c & 63); }
  };

 private:
  friend class SafeRegexCompiler;
  friend class SafeRegexMatcher;

  std::vector<Inst> prog_;
  std::vector<ByteSet> sets_;
  // The matcher's state is (pc, code), code the repeat counts of pc's counted region (see the
  // .cc); state_base_[pc] is the index of (pc, 0), and states are numbered densely.
  std::vector<uint32_t> state_base_;
  uint32_t num_states_ = 0;
  int groups_ = 0;
};

}  // namespace echelon::data
