#include "echelon/data/safe_regex.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace echelon::data {
namespace {

std::string Show(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

SafeRegex MustCompile(std::string_view pattern) {
  Result<SafeRegex> re = SafeRegex::Compile(pattern, "test");
  EXPECT_TRUE(re.ok()) << Show(pattern) << ": " << re.status().message();
  if (!re.ok()) return SafeRegex::Compile("", "test").value();
  return std::move(re).value();
}

// What the reward code reads: whether the whole text matches, and the span of the last match of
// a std::sregex_iterator walk and of its group 1.
struct Outcome {
  bool full = false;
  bool found = false;
  size_t begin = 0, end = 0;
  bool g1 = false;
  size_t g1_begin = 0, g1_end = 0;

  bool operator==(const Outcome& o) const {
    return full == o.full && found == o.found && (!found || (begin == o.begin && end == o.end)) && g1 == o.g1 &&
           (!g1 || (g1_begin == o.g1_begin && g1_end == o.g1_end));
  }
  std::string Describe() const {
    std::string s = std::string("full=") + (full ? "yes" : "no") + " last=";
    if (!found) return s + "none";
    s += "[" + std::to_string(begin) + "," + std::to_string(end) + ")";
    s += g1 ? " g1=[" + std::to_string(g1_begin) + "," + std::to_string(g1_end) + ")" : " g1=unset";
    return s;
  }
};

Outcome RunStd(const std::regex& re, const std::string& text) {
  Outcome o;
  o.full = std::regex_match(text, re);
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    o.found = true;
    o.begin = static_cast<size_t>(it->position(0));
    o.end = o.begin + static_cast<size_t>(it->length(0));
    o.g1 = it->size() > 1 && (*it)[1].matched;
    if (o.g1) {
      o.g1_begin = static_cast<size_t>((*it)[1].first - text.begin());
      o.g1_end = static_cast<size_t>((*it)[1].second - text.begin());
    }
  }
  return o;
}

Outcome RunSafe(const SafeRegex& re, const std::string& text) {
  Outcome o;
  o.full = re.FullMatch(text);
  std::optional<SafeRegex::Match> m = re.LastMatch(text);
  if (!m) return o;
  o.found = true;
  o.begin = m->begin;
  o.end = m->end;
  if (!m->groups.empty() && m->groups[0]) {
    o.g1 = true;
    o.g1_begin = m->groups[0]->first;
    o.g1_end = m->groups[0]->second;
  }
  return o;
}

// A random pattern over a small alphabet, with what the differential test needs to know of it.
struct Generated {
  std::string text;
  bool nullable = false;    // can match the empty string
  bool empty_loop = false;  // some repetition's body can match empty
  int nesting = 0;          // repetitions nested inside one another
};

class PatternGen {
 public:
  explicit PatternGen(uint32_t seed) : rng_(seed) {}

  Generated Alternation(int depth) {
    Generated g = Sequence(depth);
    while (depth < 3 && Chance(0.25)) {
      Generated h = Sequence(depth);
      g.text += "|" + h.text;
      g.nullable = g.nullable || h.nullable;
      Merge(&g, h);
    }
    return g;
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  static void Merge(Generated* g, const Generated& h) {
    g->empty_loop = g->empty_loop || h.empty_loop;
    g->nesting = std::max(g->nesting, h.nesting);
  }

  Generated Sequence(int depth) {
    Generated g;
    g.nullable = true;
    const int terms = Pick(depth == 0 ? 5 : 4);
    for (int k = 0; k < terms; ++k) {
      Generated t = Term(depth);
      g.text += t.text;
      g.nullable = g.nullable && t.nullable;
      Merge(&g, t);
    }
    return g;
  }

  Generated Term(int depth) {
    if (Chance(0.08)) {
      static const char* kAssertions[] = {"^", "$", "\\b", "\\B"};
      return {kAssertions[Pick(4)], true, false, 0};
    }
    Generated g = Atom(depth);
    if (!Chance(0.45)) return g;
    static const char* kQuantifiers[] = {"*",   "+",     "?",     "*?",   "+?",    "??",
                                         "{2}", "{0,2}", "{1,2}", "{2,}", "{1,}?", "{0,1}?"};
    const std::string q = kQuantifiers[Pick(12)];
    const bool unbounded = q.find_first_of("*+") != std::string::npos || q.find(",}") != std::string::npos;
    const bool optional = q[0] == '*' || q[0] == '?' || q.find("{0") == 0;
    g.empty_loop = g.empty_loop || (g.nullable && (unbounded || q.find(',') != std::string::npos || q == "{2}"));
    g.nesting += 1;
    g.nullable = g.nullable || optional;
    g.text += q;
    return g;
  }

  Generated Atom(int depth) {
    const int r = Pick(20);
    if (r < 5) return {"a", false, false, 0};
    if (r < 8) return {"b", false, false, 0};
    if (r < 9) return {"c", false, false, 0};
    if (r < 10) return {".", false, false, 0};
    if (r < 11) {
      static const char* kClasses[] = {"[ab]", "[^a]", "\\w", "\\s", "[a-c]", "\\W", "[]", "[^]"};
      return {kClasses[Pick(8)], false, false, 0};
    }
    if (depth >= 3) return {"a", false, false, 0};
    Generated inner = Alternation(depth + 1);
    inner.text = (Chance(0.6) ? "(" : "(?:") + inner.text + ")";
    return inner;
  }

  std::mt19937 rng_;
};

std::string RandomText(std::mt19937& rng, const std::string& alphabet, size_t max_len) {
  const size_t len = std::uniform_int_distribution<size_t>(0, max_len)(rng);
  std::string s;
  for (size_t k = 0; k < len; ++k) s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
  return s;
}

// Hand-written patterns covering every construct; `true` marks a repetition whose body can match
// empty, where libstdc++'s way of stopping such a loop decides which match and submatch win.
const std::vector<std::pair<std::string, bool>>& HandWritten() {
  static const std::vector<std::pair<std::string, bool>> kPatterns = {
      {"a", false}, {"abc", false}, {"", false}, {"a|b", false}, {"a|ab", false}, {"ab|a", false},
      {"(a|ab)(c|bcd)", false}, {"(a|ab)(c|bcd)(d*)", false}, {".", false}, {"a.c", false}, {"..", false},
      {"[abc]", false}, {"[^abc]", false}, {"[a-c]+", false}, {"[a-]", false}, {"[-a]", false},
      {"[a-b-c]", false}, {"[]", false}, {"[^]", false}, {"[^]*", false}, {"[\\]a]", false}, {"[\\-a]+", false},
      {"[\\b]", false}, {"[\\d\\s]+", false}, {"[^\\w]", false}, {"[\\x61-\\x63]", false}, {"\\d+", false},
      {"\\D", false}, {"\\w+", false}, {"\\W+", false}, {"\\s", false}, {"\\S+", false}, {"\\bab", false},
      {"a\\b", false}, {"\\Ba", false}, {"\\b", false}, {"\\B", false}, {"\\b\\w+\\b", false}, {"^a", false},
      {"a$", false}, {"^$", false}, {"^", false}, {"$", false}, {"^a|b$", false}, {"a^b", false},
      {"a*", false}, {"a+", false}, {"a?", false}, {"a*?", false}, {"a+?", false}, {"a??", false},
      {"a{2}", false}, {"a{2,}", false}, {"a{1,3}", false}, {"a{1,3}?", false}, {"a{0}", false},
      {"a{0,1}", false}, {"a{2,}?", false}, {"(a)", false}, {"(a)(b)", false}, {"(?:ab)+", false},
      {"(a|b)*", false}, {"(a|b)*?", false}, {"(a|b)*c", false}, {"(a|b)+?c", false}, {"((a)|b)+", false},
      {"(a+)+", false}, {"(?:a|b)*c", false}, {"([ab]*)c", false}, {"(a*?)(a*)", false}, {"(a+?)b", false},
      {"(a*)b", false}, {"(a|b)*?b", false}, {"(a)|b", false}, {"x(a)?", false}, {"(a){2}", false},
      {"(a){0}", false}, {"(a{1,2}){2}", false}, {"(\\w+)\\s(\\w+)", false}, {"(.*)c", false},
      {"(.*?)c", false}, {"(?:a*b|a)", false}, {"(a*b|a)", false}, {"\\t", false}, {"\\n", false},
      {"\\x61", false}, {"\\u0061", false}, {"\\.", false}, {"\\*", false}, {"\\-", false}, {"a\\|b", false},
      {"\\(a\\)", false}, {"\\[", false}, {"]", false}, {"}", false}, {"\\{a\\}", false}, {"\\/", false},
      {"(a*)*", true}, {"(a*)+", true}, {"(a?)+", true}, {"(|a)*", true}, {"(a|)*", true}, {"(|a)+", true},
      {"(a*)*b", true}, {"(a?)*?b", true}, {"(?:a*)*", true}, {"(a*)*?", true}, {"(\\b)*a", true},
      {"(^)*", true}, {"(a|\\b)*", true}, {"((a)|)*", true}, {"(?:(?:c?|d)(?:|a))*", true},
      {"(a?b?)*", true}, {"(a*?)*", true}, {"(a?){2,}", true}, {"(a|b?)+c", true}, {"((a*)*)*", true},
      {"(a*){2}", false}, {"(a|$)*", true}, {"(?:(a)|b?)*", true}, {"([ab]?)*c", true},
      // An empty iteration makes libstdc++ run the body again at the same position, where its
      // later alternatives, and what consumes in them, come before the first pass's.
      {"(?:^(?:|b)*|bb)+", true}, {"(?:()+|b)*?a", true}, {"(?:(?:()a?\?){1,2})+?c", true},
      {"(^(b?\?)*|(b){2})+", true}, {"(((a*)*)*)*b", true}, {"(?:(a?)?(b?)?)*c", true},
  };
  return kPatterns;
}

struct DiffStats {
  int patterns = 0, cases = 0, std_refused = 0, too_many_counts = 0;
};

// Compares SafeRegex with std::regex on `texts`; returns false (after reporting it) at the first
// disagreement.
bool Compare(const std::string& pattern, const std::vector<std::string>& texts, DiffStats* stats) {
  std::regex std_re;
  try {
    std_re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error&) {
    stats->std_refused++;
    return true;
  }
  Result<SafeRegex> safe = SafeRegex::Compile(pattern, "test");
  if (!safe.ok() && safe.status().message().find("can match empty and holds more than") != std::string::npos) {
    stats->too_many_counts++;  // a limit of SafeRegex's, see RefusesPatternsOverItsLimits
    return true;
  }
  if (!safe.ok()) {
    ADD_FAILURE() << "SafeRegex refuses " << Show(pattern) << " that std::regex reads: " << safe.status().message();
    return false;
  }
  stats->patterns++;
  for (const std::string& text : texts) {
    stats->cases++;
    const Outcome want = RunStd(std_re, text);
    const Outcome got = RunSafe(safe.value(), text);
    if (want == got) continue;
    ADD_FAILURE() << "first disagreement: pattern " << Show(pattern) << " text " << Show(text)
                  << "\n  std::regex: " << want.Describe() << "\n  SafeRegex:  " << got.Describe();
    return false;
  }
  return true;
}

TEST(SafeRegexTest, AgreesWithStdRegexOnHandWrittenPatterns) {
  std::mt19937 rng(12345);
  const std::string alphabet = "aabbc d1_\n.-";
  std::vector<std::string> texts = {"",   "a",   "ab", "abc", "aab", "ba", " ab c", "a\nb", "cd",
                                    "xa", "aaa", "-",  "]",   "bb",  "bba", "ac"};
  while (texts.size() < 60) texts.push_back(RandomText(rng, alphabet, 30));
  DiffStats stats;
  int empty_loop_patterns = 0;
  for (const auto& [pattern, empty_loop] : HandWritten()) {
    empty_loop_patterns += empty_loop;
    if (!Compare(pattern, texts, &stats)) break;
  }
  EXPECT_EQ(stats.std_refused, 0);
  EXPECT_EQ(stats.too_many_counts, 0);
  EXPECT_EQ(stats.patterns, static_cast<int>(HandWritten().size()));
  std::printf("hand-written: %d patterns (%d with a repetition that can match empty), %d cases\n", stats.patterns,
              empty_loop_patterns, stats.cases);
}

TEST(SafeRegexTest, AgreesWithStdRegexOnRandomPatterns) {
  PatternGen gen(2024);
  std::mt19937 rng(777);
  DiffStats stats;
  int empty_loop_patterns = 0;
  for (int k = 0; k < 400; ++k) {
    const Generated g = gen.Alternation(0);
    // std::regex backtracks, exponentially for nested repetitions and for repetitions that can
    // match empty (about 3x per byte for `(|\w??|)+?ab`): keep those on short texts.
    const size_t max_len = g.nesting >= 3 || g.empty_loop ? 8 : g.nesting == 2 ? 14 : 30;
    std::vector<std::string> texts;
    for (int t = 0; t < 25; ++t) texts.push_back(RandomText(rng, "aaabbc ", max_len));
    empty_loop_patterns += g.empty_loop;
    if (!Compare(g.text, texts, &stats)) break;
  }
  std::printf("random: %d patterns compared (%d with a repetition that can match empty), %d cases; %d refused by "
              "std::regex, %d by SafeRegex for nesting repetitions that can match empty more than 3 deep\n",
              stats.patterns, empty_loop_patterns, stats.cases, stats.std_refused, stats.too_many_counts);
  EXPECT_GE(stats.patterns, 350);
}

// The two calls the reward code makes, on an ordinary answer pattern.
TEST(SafeRegexTest, FindsTheLastMatchAndItsFirstGroup) {
  const SafeRegex re = MustCompile("answer: *(\\d+)");
  EXPECT_EQ(re.groups(), 1);
  const std::string text = "answer: 12, no wait, answer: 345.";
  std::optional<SafeRegex::Match> m = re.LastMatch(text);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(text.substr(m->begin, m->end - m->begin), "answer: 345");
  ASSERT_EQ(m->groups.size(), 1u);
  ASSERT_TRUE(m->groups[0].has_value());
  EXPECT_EQ(text.substr(m->groups[0]->first, m->groups[0]->second - m->groups[0]->first), "345");
  EXPECT_FALSE(re.LastMatch("no answer here").has_value());
  EXPECT_TRUE(re.FullMatch("answer: 7"));
  EXPECT_FALSE(re.FullMatch("answer: 7."));
  EXPECT_FALSE(re.FullMatch(""));
}

TEST(SafeRegexTest, GroupThatTookNoPartIsUnset) {
  const SafeRegex re = MustCompile("(a)|(b)");
  EXPECT_EQ(re.groups(), 2);
  std::optional<SafeRegex::Match> m = re.LastMatch("xb");
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->groups[0].has_value());
  ASSERT_TRUE(m->groups[1].has_value());
  EXPECT_EQ(*m->groups[1], std::make_pair(size_t{1}, size_t{2}));
}

// std::sregex_iterator's empty-match rules: a*, on "baa", visits [0,0) [1,3) [3,3).
TEST(SafeRegexTest, EmptyMatchesIterateLikeSregexIterator) {
  struct Case {
    const char* pattern;
    const char* text;
    size_t begin, end;
  };
  const Case cases[] = {
      {"a*", "baa", 3, 3},       // ends with the empty match at the end of the text
      {"a*?", "aa", 2, 2},       // [0,0) then the retry finds [0,1) ...
      {"(|a)*", "a", 1, 1},      // std::regex: [0,0) [0,1) [1,1)
      {"\\B|^a", "xa", 1, 2},    // libstdc++ retries without match_prev_avail: ^ holds at 1
      {"(?:a*b|a)", "aaaa", 3, 4},
      {"x*", "", 0, 0},
  };
  for (const Case& c : cases) {
    std::optional<SafeRegex::Match> m = MustCompile(c.pattern).LastMatch(c.text);
    ASSERT_TRUE(m.has_value()) << c.pattern;
    EXPECT_EQ(m->begin, c.begin) << c.pattern;
    EXPECT_EQ(m->end, c.end) << c.pattern;
  }
}

// Text and pattern are bytes: UTF-8 is matched byte by byte, as std::regex on std::string does.
TEST(SafeRegexTest, MatchesBytes) {
  EXPECT_TRUE(MustCompile("caf\\xc3\\xa9").FullMatch("caf\xc3\xa9"));
  EXPECT_TRUE(MustCompile("caf..").FullMatch("caf\xc3\xa9"));
  EXPECT_TRUE(MustCompile("[\\x00-\\xff]+").FullMatch(std::string("\0\xff a", 4)));
  EXPECT_TRUE(MustCompile("\\W\\W").FullMatch("\xc3\xa9"));
  EXPECT_FALSE(MustCompile(".").FullMatch("\n"));
  EXPECT_FALSE(MustCompile(".").FullMatch("\r"));
  EXPECT_TRUE(MustCompile("[^]").FullMatch("\n"));
}

// Each refused construct: the error names the caller's `where`, the construct and its offset.
TEST(SafeRegexTest, RefusesUnsupportedConstructsNamingThem) {
  struct Case {
    std::string pattern;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"(a)\\1", {"backreference \\1", "offset 3"}},
      {"[\\1]", {"backreference \\1", "offset 1"}},
      {"x(?=a)", {"lookahead (?=", "offset 1"}},
      {"(?!a)", {"negative lookahead (?!", "offset 0"}},
      {"(?<=a)b", {"lookbehind (?<=", "offset 0"}},
      {"(?<!a)b", {"negative lookbehind (?<!", "offset 0"}},
      {"(?<year>\\d+)", {"named group (?<", "offset 0"}},
      {"(?P<year>\\d+)", {"named group (?P", "offset 0"}},
      {"(?i)a", {"unknown group construct (?i", "offset 0"}},
      {"\\k<a>", {"named backreference \\k", "offset 0"}},
      {"ab\\q", {"unknown escape \\q", "offset 2"}},
      {"\\cA", {"control escape \\c", "offset 0"}},
      {"\\p{L}", {"Unicode property escape \\p", "offset 0"}},
      {"[[:alpha:]]", {"POSIX class [:", "offset 1"}},
      {"[\\B]", {"\\B inside a character class", "offset 1"}},
      {"[z-a]", {"range z-a is out of order", "offset 1"}},
      {"[\\d-z]", {"class escape \\d cannot start a range", "offset 1"}},
      {"[a-\\w]", {"class escape \\w cannot end a range", "offset 3"}},
      {"*a", {"quantifier '*' with nothing to repeat", "offset 0"}},
      {"a|+", {"quantifier '+' with nothing to repeat", "offset 2"}},
      {"a**", {"right after the quantifier *", "offset 2"}},
      {"a{2}{3}", {"right after the quantifier {2}", "offset 4"}},
      {"^*", {"after the assertion ^", "offset 1"}},
      {"\\b+", {"after the assertion \\b", "offset 2"}},
      {"a{2,1}", {"maximum below its minimum", "offset 1"}},
      {"a{", {"'{' does not start a repetition", "offset 1"}},
      {"a{,3}", {"'{' does not start a repetition", "offset 1"}},
      {"{", {"'{' does not start a repetition", "offset 0"}},
      {"a{1001}", {"repetition count 1001 is over the limit of 1000", "offset 1"}},
      {"(a", {"missing ')'", "offset 0"}},
      {"a)", {"unmatched ')'", "offset 1"}},
      {"[ab", {"missing ']'", "offset 0"}},
      {"ab\\", {"trailing backslash", "offset 2"}},
      {"\\x4", {"\\x needs 2 hex digits", "offset 0"}},
      {"\\u00e9", {"\\u00e9 is above \\u007F", "offset 0"}},
      {"\\01", {"octal escape \\01", "offset 0"}},
  };
  for (const Case& c : cases) {
    Result<SafeRegex> re = SafeRegex::Compile(c.pattern, "task option regex");
    ASSERT_FALSE(re.ok()) << Show(c.pattern) << " compiled";
    const std::string& msg = re.status().message();
    EXPECT_EQ(re.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(msg.rfind("task option regex: ", 0), 0u) << msg;
    for (const std::string& want : c.says) {
      EXPECT_NE(msg.find(want), std::string::npos) << Show(c.pattern) << ": " << msg;
    }
  }
}

TEST(SafeRegexTest, RefusesPatternsOverItsLimits) {
  auto error_of = [](const std::string& pattern) {
    Result<SafeRegex> re = SafeRegex::Compile(pattern, "task option format");
    return re.ok() ? std::string("compiled") : re.status().message();
  };
  EXPECT_NE(error_of(std::string(4097, 'a')).find("4097 bytes; the limit is 4096"), std::string::npos);
  EXPECT_EQ(error_of(std::string(4096, 'a')), "compiled");
  const std::string deep = std::string(201, '(') + "a" + std::string(201, ')');
  EXPECT_NE(error_of(deep).find("groups nest deeper than 200 at offset 200"), std::string::npos) << error_of(deep);
  EXPECT_EQ(error_of(std::string(200, '(') + "a" + std::string(200, ')')), "compiled");
  EXPECT_NE(error_of("(?:a{1000}){1000}").find("more than 100000 instructions"), std::string::npos);
  EXPECT_NE(error_of("(((((a{10}){10}){10}){10}){10})").find("more than 100000 instructions"), std::string::npos);
  EXPECT_EQ(error_of("a{1000}b{1000}"), "compiled");
  // Repetitions that can match empty, nested inside one another: the matcher counts each one's
  // entries per position (as libstdc++ does), and the combinations of counts are its states.
  EXPECT_EQ(error_of("((a*)*)*b"), "compiled");
  EXPECT_EQ(error_of("(?:(a?)?(b?)?)*"), "compiled");
  EXPECT_EQ(error_of("(((a*)*)*)*b"), "compiled");
  const std::string deep_empty = error_of("x((((a*)*)*)*)*");
  EXPECT_NE(deep_empty.find("repetition at offset 14 can match empty and holds more than 3"), std::string::npos)
      << deep_empty;
  EXPECT_NE(error_of("(?:(a?)?(b?)?(c?)?)*").find("holds more than 3"), std::string::npos);
  // 27 states a pc (three counts), copied 4000 times.
  EXPECT_EQ(error_of("(?:(?:(?:(a?)?(b?)?)*){100}){20}"), "compiled");
  const std::string states = error_of("(?:(?:(?:(a?)?(b?)?)*){100}){40}");
  EXPECT_NE(states.find("matcher states; the limit is 1000000"), std::string::npos) << states;
  // A thousand groups over a thousand more bytes to match: too many capture slots.
  std::string groups;
  for (int k = 0; k < 1000; ++k) groups += "(a)";
  EXPECT_NE(error_of(groups + "b{200}").find("capture slots"), std::string::npos) << error_of(groups + "b{200}");
  EXPECT_EQ(error_of(groups), "compiled");
}

// Sanitizer builds (the fuzz configuration) run several times slower; only the absolute limit
// scales, the linearity check does not.
#if defined(__SANITIZE_ADDRESS__)
constexpr double kSlowdown = 10;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
constexpr double kSlowdown = 10;
#else
constexpr double kSlowdown = 1;
#endif
#else
constexpr double kSlowdown = 1;
#endif

double SecondsFor(const std::function<void()>& run) {
  double best = 1e9;
  for (int k = 0; k < 3; ++k) {  // the best of three: the machine may be busy with other tests
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Patterns that overflow std::regex's recursive matcher or make it backtrack exponentially
// (not run on std::regex here) finish on megabyte texts, in time proportional to the text.
TEST(SafeRegexTest, HugeTextsNeitherOverflowTheStackNorTakeSuperlinearTime) {
  std::mt19937 rng(99);
  auto from = [&rng](const std::string& alphabet) {
    return [&rng, alphabet](size_t n) {
      std::string s(n, ' ');
      for (char& c : s) c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      return s;
    };
  };
  struct Case {
    const char* pattern;
    std::function<std::string(size_t)> text;
    bool full;
    std::optional<size_t> last_begin;  // where the last match starts, relative to the end
  };
  const std::vector<Case> cases = {
      {"(a|b)*c", from("ab"), false, std::nullopt},
      {"[\\s\\S]*x", from("ab \n\t.y"), false, std::nullopt},
      {"(a*)*b", from("a"), false, std::nullopt},
      {"(x+x+)+y", from("x"), false, std::nullopt},
      {"(a|b)*", from("ab"), true, 0},          // one match of the whole text, then the empty one at its end
      {"(?:a*b|a)", from("a"), false, 1},       // a million matches, each found after reading to the end
  };
  for (const Case& c : cases) {
    const SafeRegex re = MustCompile(c.pattern);
    double seconds[2];
    for (int k = 0; k < 2; ++k) {
      const std::string text = c.text(size_t{1000000} << k);
      bool full = false;
      std::optional<SafeRegex::Match> last;
      seconds[k] = SecondsFor([&] {
        full = re.FullMatch(text);
        last = re.LastMatch(text);
      });
      EXPECT_EQ(full, c.full) << c.pattern;
      ASSERT_EQ(last.has_value(), c.last_begin.has_value()) << c.pattern;
      if (last) {
        EXPECT_EQ(last->begin, text.size() - *c.last_begin) << c.pattern;
      }
    }
    std::printf("%-12s 1M bytes %.3fs, 2M bytes %.3fs (x%.2f)\n", c.pattern, seconds[0], seconds[1],
                seconds[1] / seconds[0]);
    EXPECT_LT(seconds[0], 3.0 * kSlowdown) << c.pattern;
    EXPECT_LT(seconds[1], 3.0 * seconds[0] + 0.05)
        << c.pattern << ": twice the text took more than three times as long";
  }
}

// Compile once, match from many threads: the matcher keeps its scratch space on the call.
TEST(SafeRegexTest, OneRegexServesConcurrentCallers) {
  const SafeRegex re = MustCompile("(\\w+)@(\\w+)\\.com");
  std::vector<std::thread> threads;
  std::vector<int> right(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&re, &right, t] {
      const std::string text = "mail " + std::string(static_cast<size_t>(t) + 1, 'u') + "@host.com and x@y.com";
      for (int k = 0; k < 200; ++k) {
        std::optional<SafeRegex::Match> m = re.LastMatch(text);
        right[t] += m && m->groups[0] && text.substr(m->groups[0]->first, 1) == "x" && re.FullMatch("a@b.com");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(right[t], 200);
}

}  // namespace
}  // namespace echelon::data
