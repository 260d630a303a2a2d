// Verifiable rewards of the prompts task, written as one verifier or a weighted sum:
//   "math"                    1 when the final answer equals the ground truth (math_verify.h)
//   "exact"                   1 when the completion equals the ground truth, both trimmed
//   "choice"                  1 when the chosen letter equals the ground truth's ("B", "(B)"):
//                             the letter in \boxed{}, else after "answer is" / "answer:", else
//                             a completion that is only the letter ("B", "(B)", "B.")
//   "regex"                   1 when the last match of `regex` (its first group, else the whole
//                             match) equals the ground truth, both trimmed
//   "format"                  1 when the completion has the required form: `format` "think"
//                             (the default) is "<think>...</think>" followed by an answer;
//                             anything else is a regular expression the whole completion matches
//   "python"                  the user's Python function (python_reward.h)
//   "http"                    a scoring service over HTTP (http_reward.h); both scores come
//                             from the caller (PromptsAdapter calls them)
//   "0.9*math + 0.1*format"   a weighted sum (any finite weights)
// The answer verifiers read the text after the last "</think>" when there is one, so a
// thinking model's reasoning never counts as its answer. Regular expressions are ECMAScript's
// syntax on a matcher whose time is linear in the text and which cannot overflow the stack
// (data/safe_regex.h): a worker chooses the text.
//
//   ECHELON_ASSIGN_OR_RETURN(RewardSpec r, RewardSpec::Parse("0.9*math + 0.1*format", "", "think"));
//   double reward = r.Score(completion, "42");
//
// Thread contract: immutable after Parse; Score may run concurrently.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/safe_regex.h"

namespace echelon::data {

// One completion as an external reward (a Python function, a scoring service) is asked about it,
// with verl's argument names.
struct RewardSample {
  std::string data_source;
  std::string solution_str;
  std::string ground_truth;
  std::string extra_info_json;  // "null" when none
};

// What an external reward (a Python function, a scoring service) returned for one sample.
struct ExternalScore {
  double score = 0;
  std::map<std::string, double> extras;  // other numbers it reported (they become metrics)
};

// The external rewards' scores of one completion, for Score's "python" and "http" terms.
struct ExternalScores {
  double python = 0;
  double http = 0;
};

class RewardSpec {
 public:
  // `regex` is needed by a "regex" term; `format` is read by a "format" term ("" = "think").
  // Errors name the bad term, weight or expression.
  static Result<RewardSpec> Parse(const std::string& spec, const std::string& regex, const std::string& format);

  double Score(const std::string& completion, const std::string& ground_truth, const ExternalScores& external = {}) const;
  bool uses_python() const { return Uses(Kind::kPython); }
  bool uses_http() const { return Uses(Kind::kHttp); }

 private:
  enum class Kind { kMath, kExact, kChoice, kRegex, kFormat, kPython, kHttp };
  struct Term {
    Kind kind;
    double weight;
  };
  double ScoreTerm(Kind kind, const std::string& completion, const std::string& ground_truth) const;
  bool Uses(Kind kind) const;

  std::vector<Term> terms_;
  std::shared_ptr<const SafeRegex> regex_;
  std::shared_ptr<const SafeRegex> format_;  // null: the "think" form
};

// The letter a multiple-choice completion picked ('\0' when none); exposed for tests.
char ChosenLetter(const std::string& completion);

}  // namespace echelon::data
