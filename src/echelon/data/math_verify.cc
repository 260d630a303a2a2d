#include "echelon/data/math_verify.h"

#include <cstring>
#include <vector>

namespace echelon::data {
namespace {

constexpr size_t kNone = std::string_view::npos;
// Numerators and denominators beyond this compare as text, so cross products never overflow.
constexpr __int128 kMaxTerm = static_cast<__int128>(1000000000000000000LL);  // 1e18

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  for (size_t p = s->find(from); p != std::string::npos; p = s->find(from, p + to.size())) s->replace(p, from.size(), to);
}

// Index just past the brace group that opens at s[open] == '{' (escaped braces do not count),
// or kNone when it never closes.
size_t GroupEnd(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
      continue;
    }
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i + 1;
  }
  return kNone;
}

std::optional<std::string> LastBoxed(std::string_view s) {
  size_t at = kNone, len = 0;
  for (const char* cmd : {"\\boxed", "\\fbox"}) {
    const size_t p = s.rfind(cmd);
    if (p != kNone && (at == kNone || p > at)) at = p, len = std::strlen(cmd);
  }
  if (at == kNone) return std::nullopt;
  size_t i = at + len;
  while (i < s.size() && IsSpace(s[i])) ++i;
  if (i < s.size() && s[i] == '{') {
    const size_t end = GroupEnd(s, i);
    if (end == kNone) return std::nullopt;
    return std::string(s.substr(i + 1, end - i - 2));
  }
  size_t j = i;
  while (j < s.size() && !IsSpace(s[j]) && s[j] != '$') ++j;
  if (j == i) return std::nullopt;
  return std::string(s.substr(i, j - i));
}

std::optional<std::string> AfterHashes(std::string_view s) {
  const size_t p = s.rfind("####");
  if (p == kNone) return std::nullopt;
  size_t end = s.find('\n', p);
  if (end == kNone) end = s.size();
  std::string t = Trim(s.substr(p + 4, end - p - 4));
  if (t.empty()) return std::nullopt;
  return t;
}

// "1,234,567.5", "-12", "3/4": digits with comma groups of three, then a decimal part or a
// denominator. A '-' counts as the sign unless a digit or letter precedes it ("3-5").
std::optional<std::string> LastNumber(std::string_view s) {
  std::optional<std::string> last;
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (!IsDigit(s[i])) {
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < n && IsDigit(s[i])) ++i;
    const bool grouped = i - start <= 3;
    while (grouped && i + 3 < n && s[i] == ',' && IsDigit(s[i + 1]) && IsDigit(s[i + 2]) &&
           IsDigit(s[i + 3]) && (i + 4 == n || !IsDigit(s[i + 4])))
      i += 4;
    if (i + 1 < n && (s[i] == '.' || s[i] == '/') && IsDigit(s[i + 1])) {
      ++i;
      while (i < n && IsDigit(s[i])) ++i;
    }
    const bool negative = start > 0 && s[start - 1] == '-' &&
                          (start == 1 || !(IsDigit(s[start - 2]) || IsAlpha(s[start - 2])));
    last = (negative ? "-" : "") + std::string(s.substr(start, i - start));
  }
  return last;
}

// "\cmd{X}" -> "X" for every occurrence.
void Unwrap(std::string* s, std::string_view cmd) {
  for (size_t p = s->find(cmd); p != std::string::npos; p = s->find(cmd, p)) {
    const size_t open = p + cmd.size();
    if (open >= s->size() || (*s)[open] != '{') {
      p = open;
      continue;
    }
    const size_t end = GroupEnd(*s, open);
    if (end == kNone) return;
    *s = s->substr(0, p) + s->substr(open + 1, end - open - 2) + s->substr(end);
  }
}

// "\frac12" -> "\frac{1}{2}", "\sqrt2" -> "\sqrt{2}": single-character arguments get braces.
void BraceArguments(std::string* s, std::string_view cmd, int args) {
  for (size_t p = s->find(cmd); p != std::string::npos; p = s->find(cmd, p + 1)) {
    size_t i = p + cmd.size();
    if (i < s->size() && IsAlpha((*s)[i])) continue;  // a longer command name
    for (int a = 0; a < args; ++a) {
      while (i < s->size() && (*s)[i] == ' ') s->erase(i, 1);
      if (i >= s->size()) return;
      if ((*s)[i] == '{') {
        const size_t end = GroupEnd(*s, i);
        if (end == kNone) return;
        i = end;
      } else if (IsDigit((*s)[i]) || IsAlpha((*s)[i])) {
        s->insert(i, "{");
        s->insert(i + 2, "}");
        i += 3;
      } else {
        break;
      }
    }
  }
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!IsDigit(c)) return false;
  return true;
}

// "-1,234,567.25%" and the like: the thousands separators are dropped.
bool DropThousands(std::string* s) {
  std::string_view v = *s;
  size_t i = v.size() > 0 && v[0] == '-' ? 1 : 0;
  const size_t first = v.find(',', i);
  if (first == kNone) return false;
  size_t int_end = v.find_first_of(".%", i);
  if (int_end == kNone) int_end = v.size();
  if (first > int_end || first - i < 1 || first - i > 3 || !AllDigits(v.substr(i, first - i))) return false;
  for (size_t g = first; g < int_end; g += 4)
    if (v[g] != ',' || g + 4 > int_end || !AllDigits(v.substr(g + 1, 3))) return false;
  std::string out;
  for (char c : *s)
    if (c != ',') out += c;
  *s = out;
  return true;
}

struct Rational {
  __int128 num = 0;
  __int128 den = 1;
  bool percent = false;  // written with '%'
};

__int128 Gcd(__int128 a, __int128 b) {
  if (a < 0) a = -a;
  while (b != 0) {
    const __int128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

std::optional<Rational> Reduced(__int128 num, __int128 den) {
  if (den == 0) return std::nullopt;
  if (den < 0) num = -num, den = -den;
  const __int128 g = Gcd(num, den);
  if (g > 1) num /= g, den /= g;
  if (num > kMaxTerm || -num > kMaxTerm || den > kMaxTerm) return std::nullopt;
  return Rational{num, den};
}

// "-12", "3.50", ".5": at most 18 digits.
std::optional<Rational> ParseDecimal(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) negative = s[0] == '-', s.remove_prefix(1);
  const size_t dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  const std::string_view frac = dot == kNone ? std::string_view() : s.substr(dot + 1);
  if ((whole.empty() && frac.empty()) || (!whole.empty() && !AllDigits(whole)) || (dot != kNone && !AllDigits(frac)) ||
      whole.size() + frac.size() > 18)
    return std::nullopt;
  __int128 num = 0, den = 1;
  for (char c : whole) num = num * 10 + (c - '0');
  for (char c : frac) num = num * 10 + (c - '0'), den *= 10;
  return Reduced(negative ? -num : num, den);
}

std::optional<Rational> Divide(const std::optional<Rational>& a, const std::optional<Rational>& b) {
  if (!a || !b || b->num == 0) return std::nullopt;
  return Reduced(a->num * b->den, a->den * b->num);
}

std::optional<Rational> ParseNumber(std::string_view s) {
  if (!s.empty() && s.back() == '%') {
    std::optional<Rational> r = ParseNumber(s.substr(0, s.size() - 1));
    if (r) r->percent = true;
    return r;
  }
  if (s.empty()) return std::nullopt;
  if (s[0] == '-' && s.substr(1).rfind("\\frac{", 0) == 0) {
    std::optional<Rational> r = ParseNumber(s.substr(1));
    if (r) r->num = -r->num;
    return r;
  }
  if (s.rfind("\\frac{", 0) == 0) {
    const size_t end1 = GroupEnd(s, 5);
    if (end1 == kNone || end1 >= s.size() || s[end1] != '{') return std::nullopt;
    const size_t end2 = GroupEnd(s, end1);
    if (end2 != s.size()) return std::nullopt;
    return Divide(ParseNumber(s.substr(6, end1 - 7)), ParseNumber(s.substr(end1 + 1, end2 - end1 - 2)));
  }
  const size_t slash = s.find('/');
  if (slash != kNone) return Divide(ParseDecimal(s.substr(0, slash)), ParseDecimal(s.substr(slash + 1)));
  return ParseDecimal(s);
}

// The elements of "(a,b)" / "[a,b)" split at top-level commas, with the brackets; nullopt for
// anything else.
std::optional<std::vector<std::string>> TupleParts(const std::string& s) {
  if (s.size() < 3 || (s[0] != '(' && s[0] != '[') || (s.back() != ')' && s.back() != ']')) return std::nullopt;
  std::vector<std::string> parts{std::string(1, s[0]) + s.back()};
  int depth = 0;
  size_t from = 1;
  for (size_t i = 1; i + 1 < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (depth < 0) return std::nullopt;
    if (c == ',' && depth == 0) {
      parts.push_back(s.substr(from, i - from));
      from = i + 1;
    }
  }
  if (depth != 0 || parts.size() < 2) return std::nullopt;  // no top-level comma: "(5)"
  parts.push_back(s.substr(from, s.size() - 1 - from));
  return parts;
}

bool NormalizedEqual(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  const std::optional<Rational> x = ParseNumber(a), y = ParseNumber(b);
  if (x && y) {
    // "75%" is 75 or 0.75, whichever the other side wrote.
    auto same = [](const Rational& p, const Rational& q) { return p.num == q.num && p.den == q.den; };
    auto hundredth = [](const Rational& p) { return Reduced(p.num, p.den * 100); };
    const std::optional<Rational> xs = x->percent ? hundredth(*x) : std::nullopt;
    const std::optional<Rational> ys = y->percent ? hundredth(*y) : std::nullopt;
    return same(*x, *y) || (xs && same(*xs, *y)) || (ys && same(*x, *ys));
  }
  if (x || y) return false;
  const auto ta = TupleParts(a), tb = TupleParts(b);
  if (ta && tb) {
    if (ta->size() != tb->size() || (*ta)[0] != (*tb)[0]) return false;
    for (size_t i = 1; i < ta->size(); ++i)
      if (!NormalizedEqual(NormalizeMathAnswer((*ta)[i]), NormalizeMathAnswer((*tb)[i]))) return false;
    return true;
  }
  return a == b;
}

}  // namespace

std::optional<std::string> ExtractMathAnswer(std::string_view response) {
  std::string s(response);
  ReplaceAll(&s, "\xE2\x88\x92", "-");  // U+2212 MINUS SIGN
  if (std::optional<std::string> boxed = LastBoxed(s)) return boxed;
  if (std::optional<std::string> hashes = AfterHashes(s)) return hashes;
  return LastNumber(s);
}

std::string NormalizeMathAnswer(std::string_view answer) {
  std::string s = Trim(answer);
  ReplaceAll(&s, "\xE2\x88\x92", "-");
  ReplaceAll(&s, "\xC2\xB0", "");  // degree sign
  for (const char* cmd : {"\\text", "\\textbf", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox", "\\operatorname"})
    Unwrap(&s, cmd);
  for (const char* gone : {"\\left.", "\\right.", "\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:",
                           "^\\circ", "^{\\circ}", "\\$", "$", "\\(", "\\)", "\\[", "\\]"})
    ReplaceAll(&s, gone, "");
  ReplaceAll(&s, "\\ ", " ");
  ReplaceAll(&s, "~", " ");
  ReplaceAll(&s, "\\%", "%");
  ReplaceAll(&s, "{,}", ",");
  ReplaceAll(&s, "\\dfrac", "\\frac");
  ReplaceAll(&s, "\\tfrac", "\\frac");
  BraceArguments(&s, "\\frac", 2);
  BraceArguments(&s, "\\sqrt", 1);
  // "x^{2}" -> "x^2", "x_{1}" -> "x_1".
  for (size_t p = s.find_first_of("^_"); p != std::string::npos; p = s.find_first_of("^_", p + 1))
    if (p + 3 < s.size() && s[p + 1] == '{' && s[p + 3] == '}') s.erase(p + 3, 1), s.erase(p + 1, 1);
  s = Trim(s);
  // "x = 5" -> "5" (one variable, one '=').
  if (s.size() > 2 && IsAlpha(s[0])) {
    size_t i = 1;
    while (i < s.size() && s[i] == ' ') ++i;
    if (i < s.size() && s[i] == '=' && s.find('=', i + 1) == std::string::npos) s = Trim(s.substr(i + 1));
  }
  while (!s.empty() && s.back() == '.') s.pop_back();
  // "12 dollars", "5 square cm": a number followed by words only.
  const size_t space = s.find(' ');
  if (space != std::string::npos) {
    std::string head = s.substr(0, space);
    bool words = true;
    for (size_t i = space; i < s.size() && words; ++i) words = IsAlpha(s[i]) || s[i] == ' ' || s[i] == '.';
    std::string number = head;
    DropThousands(&number);
    if (words && ParseNumber(number)) s = head;
  }
  std::string out;
  for (char c : s)
    if (!IsSpace(c)) out += c;
  DropThousands(&out);
  return out;
}

bool MathAnswersEqual(std::string_view a, std::string_view b) {
  return NormalizedEqual(NormalizeMathAnswer(a), NormalizeMathAnswer(b));
}

double MathScore(std::string_view response, std::string_view ground_truth) {
  std::string truth(ground_truth);
  if (truth.find("\\boxed") != std::string::npos || truth.find("\\fbox") != std::string::npos ||
      truth.find("####") != std::string::npos) {
    std::optional<std::string> t = ExtractMathAnswer(truth);
    if (!t) return 0.0;
    truth = *t;
  }
  std::optional<std::string> answer = ExtractMathAnswer(response);
  return answer && MathAnswersEqual(*answer, truth) ? 1.0 : 0.0;
}

}  // namespace echelon::data
