#include "echelon/data/math_jsonl.h"

#include <nlohmann/json.hpp>

#include "echelon/common/fs.h"
#include "echelon/data/adapter_kit.h"

namespace echelon::data {
namespace {

constexpr char kExample[] = R"(expected one JSON object per line like {"question": "37+48", "answer": "85"})";

// 1-9 digits, so that every operand, result and sum fits an int64 with room to spare.
std::optional<int64_t> ParseOperand(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

// Checks one line's JSON; returns the prompt or a message without the location.
Result<Prompt> ParseRecord(const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(std::string("not valid JSON; ") + kExample);
  if (!j.is_object()) return InvalidArgument(std::string("not a JSON object; ") + kExample);
  for (const char* field : {"question", "answer"}) {
    if (!j.contains(field)) {
      return InvalidArgument("missing field " + Quoted(field) + "; " + kExample);
    }
    if (!j[field].is_string()) {
      return InvalidArgument("field " + Quoted(field) + " must be a string; " + kExample);
    }
  }
  const std::string question = j["question"].get<std::string>();
  const std::string answer = j["answer"].get<std::string>();
  std::optional<MathProblem> p = ParseMathQuestion(question);
  if (!p) {
    return InvalidArgument("question " + Quoted(question) +
                           " is not A+B or A-B with non-negative integers A and B (up to 9 "
                           "digits, no spaces)");
  }
  const std::string expected = std::to_string(p->Answer());
  if (answer != expected) {
    const bool integer = ParseOperand(answer[0] == '-' ? answer.substr(1) : answer).has_value();
    return InvalidArgument("answer " + Quoted(answer) +
                           (integer ? " is wrong: " : " is not an integer written plainly: ") +
                           question + " is " + Quoted(expected));
  }
  Prompt prompt;
  prompt.text = question + "=";
  prompt.reference = answer;
  return prompt;
}

}  // namespace

std::optional<MathProblem> ParseMathQuestion(const std::string& question) {
  const size_t pos = question.find_first_of("+-");
  if (pos == std::string::npos) return std::nullopt;
  std::optional<int64_t> a = ParseOperand(question.substr(0, pos));
  std::optional<int64_t> b = ParseOperand(question.substr(pos + 1));
  if (!a || !b) return std::nullopt;
  return MathProblem{*a, question[pos], *b};
}

Result<std::vector<Prompt>> ReadMathJsonl(const std::string& path) {
  Result<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  std::vector<Prompt> prompts;
  ECHELON_RETURN_IF_ERROR(ForEachJsonlLine(path, bytes.value(), [&](uint64_t line_no, const std::string& line) -> Status {
    ECHELON_ASSIGN_OR_RETURN(Prompt p, ParseRecord(line));
    p.id = line_no;
    prompts.push_back(std::move(p));
    return Status::Ok();
  }));
  if (prompts.empty()) return InvalidArgument(path + ": no problems in file; " + kExample);
  return prompts;
}

Status WriteMathJsonl(const std::string& path, const std::vector<Prompt>& prompts) {
  std::string out;
  for (const Prompt& p : prompts) {
    if (p.text.empty() || p.text.back() != '=') {
      return InvalidArgument("prompt " + Quoted(p.text) + " is not a math prompt ending in '='");
    }
    nlohmann::json j = {{"question", p.text.substr(0, p.text.size() - 1)},
                        {"answer", p.reference}};
    out += j.dump() + "\n";
  }
  return WriteFileAtomic(path, out);
}

}  // namespace echelon::data
