#include "echelon/data/math_verify.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace echelon::data {
namespace {

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Every hand-written case of tests/data/verify/math_cases.tsv: answers written many ways score
// 1, near misses 0.
TEST(MathVerify, HandWrittenCases) {
  std::ifstream in(std::string(ECHELON_TEST_DATA) + "/verify/math_cases.tsv");
  ASSERT_TRUE(in) << "missing tests/data/verify/math_cases.tsv";
  std::string line;
  int line_no = 0, cases = 0, right = 0, near_misses = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    ASSERT_TRUE(t1 != std::string::npos && t2 != std::string::npos) << "line " << line_no << ": " << line;
    const double expected = std::stod(line.substr(0, t1));
    const std::string truth = Unescape(line.substr(t1 + 1, t2 - t1 - 1));
    const std::string response = Unescape(line.substr(t2 + 1));
    EXPECT_EQ(MathScore(response, truth), expected)
        << "math_cases.tsv:" << line_no << ": truth \"" << truth << "\", response \"" << response << "\"";
    ++cases;
    (expected == 1.0 ? right : near_misses) += 1;
  }
  EXPECT_GE(cases, 300);
  EXPECT_GE(near_misses, 100);
  EXPECT_GE(right, 150);
}

TEST(MathVerify, ExtractsBoxedThenHashesThenLastNumber) {
  EXPECT_EQ(ExtractMathAnswer("so \\boxed{\\frac{1}{2}} and 7"), "\\frac{1}{2}");
  EXPECT_EQ(ExtractMathAnswer("\\boxed{a{b}c}"), "a{b}c");
  EXPECT_EQ(ExtractMathAnswer("3 apples\n#### 12\nthanks 9"), "12");
  EXPECT_EQ(ExtractMathAnswer("it is 1,234,567.5 or so"), "1,234,567.5");
  EXPECT_EQ(ExtractMathAnswer("no numbers"), std::nullopt);
  EXPECT_EQ(ExtractMathAnswer("\\boxed{unclosed"), std::nullopt);
}

TEST(MathVerify, NormalisesToOneSpelling) {
  EXPECT_EQ(NormalizeMathAnswer(" $1{,}250$ "), "1250");
  EXPECT_EQ(NormalizeMathAnswer("\\dfrac12"), "\\frac{1}{2}");
  EXPECT_EQ(NormalizeMathAnswer("x = \\sqrt2"), "\\sqrt{2}");
  EXPECT_EQ(NormalizeMathAnswer("\\left( 1, 2 \\right)"), "(1,2)");
  EXPECT_EQ(NormalizeMathAnswer("12 \\text{ dollars}"), "12");
}

// Huge numbers compare as text instead of overflowing.
TEST(MathVerify, HugeNumbersDoNotOverflow) {
  EXPECT_EQ(MathScore("\\boxed{123456789012345678901234567890}", "123456789012345678901234567890"), 1.0);
  EXPECT_EQ(MathScore("\\boxed{123456789012345678901234567891}", "123456789012345678901234567890"), 0.0);
  EXPECT_EQ(MathScore("\\boxed{999999999999999999/7}", "1/999999999999999999"), 0.0);
}

}  // namespace
}  // namespace echelon::data
