#include "echelon/data/reward_spec.h"

#include <gtest/gtest.h>

namespace echelon::data {
namespace {

RewardSpec Spec(const std::string& spec, const std::string& regex = "", const std::string& format = "think") {
  Result<RewardSpec> r = RewardSpec::Parse(spec, regex, format);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}

TEST(RewardSpec, ExactComparesTrimmedText) {
  const RewardSpec r = Spec("exact");
  EXPECT_EQ(r.Score(" Paris\n", "Paris"), 1.0);
  EXPECT_EQ(r.Score("paris", "Paris"), 0.0);
  EXPECT_EQ(r.Score("Paris.", "Paris"), 0.0);
}

TEST(RewardSpec, AnswerVerifiersReadAfterTheThinking) {
  const RewardSpec r = Spec("math");
  EXPECT_EQ(r.Score("<think>maybe \\boxed{41}</think> It is \\boxed{42}.", "42"), 1.0);
  EXPECT_EQ(r.Score("<think>it is 42</think> I give up", "42"), 0.0);
  EXPECT_EQ(Spec("exact").Score("<think>hmm</think>\n42", "42"), 1.0);
}

TEST(RewardSpec, ChoicePicksTheLetter) {
  const RewardSpec r = Spec("choice");
  EXPECT_EQ(r.Score("\\boxed{B}", "B"), 1.0);
  EXPECT_EQ(r.Score("\\boxed{\\text{(B)}}", "(B)"), 1.0);
  EXPECT_EQ(r.Score("So the answer is (C) because ...", "C"), 1.0);
  EXPECT_EQ(r.Score("Answer: D", "D"), 1.0);
  EXPECT_EQ(r.Score("Answer: D", "C"), 0.0);
  EXPECT_EQ(r.Score("B", "B"), 1.0);
  EXPECT_EQ(r.Score("(B)", "B"), 1.0);
  EXPECT_EQ(r.Score("A car is faster.", "A"), 0.0);
  EXPECT_EQ(r.Score("B) 42", "B"), 1.0);
  EXPECT_EQ(ChosenLetter("I pick something"), '\0');
}

TEST(RewardSpec, RegexTakesTheLastMatchsFirstGroup) {
  const RewardSpec r = Spec("regex", "ANSWER: *([0-9]+)");
  EXPECT_EQ(r.Score("ANSWER: 3 ... no, ANSWER: 42", "42"), 1.0);
  EXPECT_EQ(r.Score("ANSWER: 42 ... no, ANSWER: 3", "42"), 0.0);
  EXPECT_EQ(r.Score("no answer", "42"), 0.0);
  // A long completion is searched without trouble.
  EXPECT_EQ(r.Score(std::string(100000, 'x') + " ANSWER: 42", "42"), 1.0);
}

// std::regex recursed per character: a worker's completion of a few hundred thousand characters
// against `(a|b)*` or a `[\s\S]*` format overflowed the learner's stack (a crash), and
// `(a*)*b` backtracked for ever. Both verifiers now match in one pass.
TEST(RewardSpec, ARegexRewardOnAHugeCompletionNeitherOverflowsNorHangs) {
  const std::string huge(1000000, 'a');
  EXPECT_EQ(Spec("regex", "((a|b)*)c").Score(huge + "c", huge), 1.0);
  EXPECT_EQ(Spec("regex", "(a*)*b").Score(huge, "a"), 0.0);
  EXPECT_EQ(Spec("format", "", "<think>[\\s\\S]*</think>[\\s\\S]*").Score("<think>" + huge + "</think>42", ""), 1.0);
  EXPECT_EQ(Spec("format", "", "(a|b)*").Score(huge + "c", ""), 0.0);
}

TEST(RewardSpec, FormatThinkNeedsOneThinkBlockAndAnAnswer) {
  const RewardSpec r = Spec("format");
  EXPECT_EQ(r.Score("<think>a</think>42", "x"), 1.0);
  EXPECT_EQ(r.Score("  <think>\na\n</think>\n\n42", "x"), 1.0);
  EXPECT_EQ(r.Score("<think>a</think>", "x"), 0.0);
  EXPECT_EQ(r.Score("<think>a</think><think>b</think>42", "x"), 0.0);
  EXPECT_EQ(r.Score("42 <think>a</think>42", "x"), 0.0);
  EXPECT_EQ(r.Score("<think>a 42", "x"), 0.0);
  const RewardSpec custom = Spec("format", "", "Answer: .*");
  EXPECT_EQ(custom.Score("Answer: 42", "x"), 1.0);
  EXPECT_EQ(custom.Score("The Answer: 42", "x"), 0.0);
}

TEST(RewardSpec, WeightedSum) {
  const RewardSpec r = Spec("0.9*math + 0.1 * format");
  EXPECT_DOUBLE_EQ(r.Score("<think>x</think>\\boxed{42}", "42"), 1.0);
  EXPECT_DOUBLE_EQ(r.Score("\\boxed{42}", "42"), 0.9);
  EXPECT_DOUBLE_EQ(r.Score("<think>x</think>\\boxed{41}", "42"), 0.1);
  EXPECT_DOUBLE_EQ(Spec("math + -0.5*format").Score("<think>x</think>7", "8"), -0.5);
}

TEST(RewardSpec, BadSpecsNameTheTerm) {
  auto message = [](const std::string& spec, const std::string& regex = "", const std::string& format = "think") {
    Result<RewardSpec> r = RewardSpec::Parse(spec, regex, format);
    EXPECT_FALSE(r.ok()) << spec;
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(message("maths").find("unknown verifier \"maths\"; known: math, exact, choice, regex, format"),
            std::string::npos);
  EXPECT_NE(message("x*math").find("the weight \"x\" is not a finite number"), std::string::npos);
  EXPECT_NE(message("inf*math").find("not a finite number"), std::string::npos);
  EXPECT_NE(message("math +").find("term \"\""), std::string::npos);
  EXPECT_NE(message("regex").find("set task option regex"), std::string::npos);
  EXPECT_NE(message("regex", "(unclosed").find("task option regex \"(unclosed\": missing ')' for this '(' at offset 0"),
            std::string::npos);
  EXPECT_NE(message("regex", "(a)\\1").find("task option regex \"(a)\\1\": backreference \\1 is not supported"),
            std::string::npos);
  EXPECT_NE(message("format", "", "[").find("task option format"), std::string::npos);
}

}  // namespace
}  // namespace echelon::data
