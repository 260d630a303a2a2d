// Verifying math answers the way RL datasets write them (GSM8K, MATH, DAPO, verl's layouts):
// the final answer is taken from the response and compared with the ground truth after both
// are normalised, as exact rationals when both are numbers.
//
//   MathScore("... so the total is \\boxed{1{,}250}.", "1250") == 1.0
//   MathScore("#### 0.5", "\\frac{1}{2}") == 1.0
//   MathScore("The answer is 0.33", "1/3") == 0.0
//
// The final answer of a response is, in this order of preference:
//   1. the content of the last \boxed{...} or \fbox{...} (balanced braces; "\boxed 5" too);
//   2. the rest of the line after the last "####" (GSM8K);
//   3. the last number written in it ("1,234", "-3.5", "3/4").
// A ground truth that itself carries \boxed or "####" is reduced the same way.
//
// Normalisation: surrounding $...$, \(...\), \[...\] and spaces go; \left, \right, \!, \, \;
// \: \displaystyle, degree marks, dollar signs and \% go; \text{}, \textbf{}, \mathrm{},
// \mathbf{}, \mbox{} are unwrapped; \dfrac and \tfrac are \frac, and \frac12 / \sqrt2 gain
// their braces; a leading "x =" is dropped; unit words after a number ("12 dollars",
// "5 cm") go; a trailing full stop goes; thousands separators ("1,234", "1{,}234") go.
// Numbers: integers, decimals (trailing zeros do not matter), a/b and \frac{a}{b} with numeric
// a and b, a percentage (equal to its number: "50%" == "50"), each optionally negative
// (also U+2212). Tuples and intervals "(1, 2)", "[0, 1)" compare element by element with
// their brackets. Anything else compares as its normalised text.
//
// Thread contract: free functions without state.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace echelon::data {

// The final answer of a response (see above); nullopt when it holds none.
std::optional<std::string> ExtractMathAnswer(std::string_view response);

// The canonical text of one answer (see above); "" for an empty answer.
std::string NormalizeMathAnswer(std::string_view answer);

// Whether two answers are the same after normalisation (numbers as exact rationals).
bool MathAnswersEqual(std::string_view a, std::string_view b);

// 1 when the response's final answer equals the ground truth, else 0.
double MathScore(std::string_view response, std::string_view ground_truth);

}  // namespace echelon::data
