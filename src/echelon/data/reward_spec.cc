#include "echelon/data/reward_spec.h"

#include <cctype>
#include <cmath>

#include "echelon/data/math_verify.h"

namespace echelon::data {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// What an answer verifier reads: the text after the last "</think>".
std::string AnswerPart(const std::string& completion) {
  const size_t p = completion.rfind("</think>");
  return p == std::string::npos ? completion : completion.substr(p + 8);
}

// "<think>" (after leading spaces), one "</think>" after it, and a non-blank answer after that.
bool ThinkForm(const std::string& completion) {
  const size_t open = completion.find_first_not_of(" \t\r\n");
  if (open == std::string::npos || completion.compare(open, 7, "<think>") != 0) return false;
  const size_t close = completion.find("</think>", open + 7);
  if (close == std::string::npos || completion.find("<think>", open + 7) != std::string::npos ||
      completion.find("</think>", close + 8) != std::string::npos)
    return false;
  return !Trim(completion.substr(close + 8)).empty();
}

// The letter a short answer text names: "B", "(B)", "B.", "\text{(B)}", "B) 42"; '\0' otherwise.
char LetterOf(const std::string& text) {
  std::string s;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 5, "\\text") == 0) {
      i += 4;
      while (i + 1 < text.size() && std::isalpha(static_cast<unsigned char>(text[i + 1]))) ++i;
      continue;
    }
    if (std::string(" \t\r\n(){}$*").find(text[i]) == std::string::npos) s += text[i];
  }
  if (s.empty() || s[0] < 'A' || s[0] > 'Z') return '\0';
  // The letter alone, or followed by "." / ")" and the option's text.
  if (s.size() == 1 || s[1] == '.' || s[1] == ':') return s[0];
  const size_t after = text.find(s[0]) + 1;
  return after < text.size() && text[after] == ')' ? s[0] : '\0';
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

char ChosenLetter(const std::string& completion) {
  const std::string text = AnswerPart(completion);
  const size_t boxed = text.rfind("\\boxed{");
  if (boxed != std::string::npos) {
    int depth = 0;
    for (size_t i = boxed + 6; i < text.size(); ++i) {
      if (text[i] == '{') ++depth;
      if (text[i] == '}' && --depth == 0) return LetterOf(text.substr(boxed + 7, i - boxed - 7));
    }
    return '\0';
  }
  const std::string lower = Lower(text);
  size_t at = std::string::npos, skip = 0;
  for (const char* cue : {"answer is", "answer:"}) {
    const size_t p = lower.rfind(cue);
    if (p != std::string::npos && (at == std::string::npos || p > at)) at = p, skip = std::string(cue).size();
  }
  if (at != std::string::npos) {
    std::string rest = text.substr(at + skip);
    rest = Trim(rest.substr(0, rest.find('\n')));
    return LetterOf(rest.substr(0, rest.find(' ')));
  }
  // Only the letter ("B", "(B)"), or an option written out ("B) 42", "(B) 42"); a bare first
  // word "A" of a sentence is no choice.
  const std::string whole = Trim(text);
  if (whole.size() <= 4) return LetterOf(whole);
  const std::string first = whole.substr(0, whole.find_first_of(" \t\n"));
  return first.size() >= 2 ? LetterOf(first) : '\0';
}

Result<RewardSpec> RewardSpec::Parse(const std::string& spec, const std::string& regex, const std::string& format) {
  RewardSpec r;
  size_t from = 0;
  while (from <= spec.size()) {
    size_t plus = spec.find('+', from);
    if (plus == std::string::npos) plus = spec.size();
    const std::string term = Trim(spec.substr(from, plus - from));
    from = plus + 1;
    const std::string where = "reward \"" + spec + "\": term \"" + term + "\"";
    double weight = 1.0;
    std::string name = term;
    const size_t star = term.find('*');
    if (star != std::string::npos) {
      const std::string w = Trim(term.substr(0, star));
      name = Trim(term.substr(star + 1));
      size_t used = 0;
      try {
        weight = std::stod(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (w.empty() || used != w.size() || !std::isfinite(weight))
        return InvalidArgument(where + ": the weight \"" + w + "\" is not a finite number");
    }
    Kind kind;
    if (name == "math") {
      kind = Kind::kMath;
    } else if (name == "exact") {
      kind = Kind::kExact;
    } else if (name == "choice") {
      kind = Kind::kChoice;
    } else if (name == "regex") {
      kind = Kind::kRegex;
    } else if (name == "format") {
      kind = Kind::kFormat;
    } else if (name == "python") {
      kind = Kind::kPython;
    } else if (name == "http") {
      kind = Kind::kHttp;
    } else {
      return InvalidArgument(where + ": unknown verifier \"" + name +
                             "\"; known: math, exact, choice, regex, format, python, http");
    }
    r.terms_.push_back({kind, weight});
  }
  auto compile = [](const std::string& pattern, const std::string& option) -> Result<std::shared_ptr<const SafeRegex>> {
    ECHELON_ASSIGN_OR_RETURN(SafeRegex re, SafeRegex::Compile(pattern, "task option " + option + " \"" + pattern + "\""));
    return std::make_shared<const SafeRegex>(std::move(re));
  };
  for (const Term& t : r.terms_) {
    if (t.kind == Kind::kRegex && !r.regex_) {
      if (regex.empty()) return InvalidArgument("reward \"" + spec + "\" uses regex: set task option regex");
      ECHELON_ASSIGN_OR_RETURN(r.regex_, compile(regex, "regex"));
    }
    if (t.kind == Kind::kFormat && !r.format_ && !format.empty() && format != "think") {
      ECHELON_ASSIGN_OR_RETURN(r.format_, compile(format, "format"));
    }
  }
  return r;
}

double RewardSpec::ScoreTerm(Kind kind, const std::string& completion, const std::string& ground_truth) const {
  switch (kind) {
    case Kind::kMath:
      return MathScore(AnswerPart(completion), ground_truth);
    case Kind::kExact:
      return Trim(AnswerPart(completion)) == Trim(ground_truth) ? 1.0 : 0.0;
    case Kind::kChoice: {
      const char want = LetterOf(Trim(ground_truth));
      return want != '\0' && ChosenLetter(completion) == want ? 1.0 : 0.0;
    }
    case Kind::kRegex: {
      const std::string text = AnswerPart(completion);
      const std::optional<SafeRegex::Match> last = regex_->LastMatch(text);
      if (!last) return 0.0;
      const auto [begin, end] =
          !last->groups.empty() && last->groups[0] ? *last->groups[0] : std::pair<size_t, size_t>(last->begin, last->end);
      return Trim(text.substr(begin, end - begin)) == Trim(ground_truth) ? 1.0 : 0.0;
    }
    case Kind::kFormat:
      return (format_ ? format_->FullMatch(completion) : ThinkForm(completion)) ? 1.0 : 0.0;
    case Kind::kPython:
    case Kind::kHttp:
      return 0.0;  // scored by the caller
  }
  return 0.0;
}

double RewardSpec::Score(const std::string& completion, const std::string& ground_truth,
                         const ExternalScores& external) const {
  double sum = 0;
  for (const Term& t : terms_) {
    const double score = t.kind == Kind::kPython ? external.python
                         : t.kind == Kind::kHttp ? external.http
                                                 : ScoreTerm(t.kind, completion, ground_truth);
    sum += t.weight * score;
  }
  return sum;
}

bool RewardSpec::Uses(Kind kind) const {
  for (const Term& t : terms_)
    if (t.kind == kind) return true;
  return false;
}

}  // namespace echelon::data
