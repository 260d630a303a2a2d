// Math problems ("37+48", "12-60") and their JSONL files, one problem per line:
//   {"question": "37+48", "answer": "85"}
// The prompt text is the question followed by "="; the reference is the answer. Every line
// is validated (the answer must be the exact result, written plainly), so a bad file fails
// at load with its file:line, not later as a silently unlearnable prompt.
//
//   Result<std::vector<Prompt>> eval = ReadMathJsonl("data/eval.jsonl");
//
// Thread contract: free functions without shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::data {

// Two-operand integer addition or subtraction of non-negative operands.
struct MathProblem {
  int64_t a = 0;
  char op = '+';  // '+' or '-'
  int64_t b = 0;

  int64_t Answer() const { return op == '+' ? a + b : a - b; }
  // Canonical question text ("37+48"): also the key that identifies a problem.
  std::string Question() const { return std::to_string(a) + op + std::to_string(b); }
  // The prompt the policy sees and the exact answer it must produce.
  Prompt ToPrompt(uint64_t id) const {
    Prompt p;
    p.id = id;
    p.text = Question() + "=";
    p.reference = std::to_string(Answer());
    return p;
  }
};

// Parses "A+B" or "A-B" where A and B are 1-9 decimal digits; nullopt otherwise.
std::optional<MathProblem> ParseMathQuestion(const std::string& question);

// Reads a math JSONL file. Blank lines are skipped; each returned Prompt's id is its 1-based
// line number. Errors name the file, the line and what was expected; an empty file is one.
Result<std::vector<Prompt>> ReadMathJsonl(const std::string& path);

// Writes prompts (text "37+48=", reference "85") as a math JSONL file, atomically.
Status WriteMathJsonl(const std::string& path, const std::vector<Prompt>& prompts);

}  // namespace echelon::data
