#include "echelon/tokenizer/split_pattern.h"

#include <gtest/gtest.h>

namespace echelon::tokenizer {
namespace {

const char* kQwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kLlama3 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> Split(const SplitPattern& p, const std::string& text) {
  std::vector<std::string_view> pieces;
  p.Split(text, &pieces);
  std::string joined;
  std::vector<std::string> out;
  for (std::string_view s : pieces) {
    out.emplace_back(s);
    joined += s;
  }
  EXPECT_EQ(joined, text) << "pieces must cover the text exactly";
  return out;
}

using V = std::vector<std::string>;

class Qwen2SplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<SplitPattern> p = SplitPattern::Parse(kQwen2);
    ASSERT_TRUE(p.ok()) << p.status().message();
    pattern_ = std::move(p).value();
  }
  std::optional<SplitPattern> pattern_;
};

TEST_F(Qwen2SplitTest, ContractionsInAnyCase) {
  EXPECT_EQ(Split(*pattern_, "I'M here'S you'Re they'LL we'd it't"),
            (V{"I", "'M", " here", "'S", " you", "'Re", " they", "'LL", " we", "'d", " it", "'t"}));
  // Only the ASCII apostrophe starts a contraction; the curly one joins the letters after it.
  EXPECT_EQ(Split(*pattern_, "it\u2019s"), (V{"it", "\u2019s"}));
  // 'v' alone is no contraction: the apostrophe starts a word instead.
  EXPECT_EQ(Split(*pattern_, "a'vx"), (V{"a", "'vx"}));
  // Case folding maps U+017F (long s) to 's', so "'ſ" is a contraction and "a" a word of its own.
  EXPECT_EQ(Split(*pattern_, "x'\u017Fa"), (V{"x", "'\u017F", "a"}));
}

TEST_F(Qwen2SplitTest, DigitsOneByOne) {
  EXPECT_EQ(Split(*pattern_, "abc12345"), (V{"abc", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(Split(*pattern_, "\u0663\u0664\u00BD\u2167"), (V{"\u0663", "\u0664", "\u00BD", "\u2167"}));  // Nd, Nd, No, Nl
  EXPECT_EQ(Split(*pattern_, " 7"), (V{" ", "7"}));
}

TEST_F(Qwen2SplitTest, WhitespaceRunsBeforeWords) {
  EXPECT_EQ(Split(*pattern_, "hello   world"), (V{"hello", "  ", " world"}));
  EXPECT_EQ(Split(*pattern_, "   hello"), (V{"  ", " hello"}));
  EXPECT_EQ(Split(*pattern_, "end   "), (V{"end", "   "}));
  EXPECT_EQ(Split(*pattern_, "a \t b"), (V{"a", " \t", " b"}));
  EXPECT_EQ(Split(*pattern_, "a\tb"), (V{"a", "\tb"}));
  // A no-break space or ideographic space is whitespace and also a "non-letter" prefix of a word.
  EXPECT_EQ(Split(*pattern_, "\u00A0x\u3000\u3000y"), (V{"\u00A0x", "\u3000", "\u3000y"}));
  // U+0085 (NEL) is White_Space; U+200B (zero width space) and U+FEFF are not.
  EXPECT_EQ(Split(*pattern_, "a\u0085\u0085"), (V{"a", "\u0085\u0085"}));
  EXPECT_EQ(Split(*pattern_, "a\u200Bb\uFEFFc"), (V{"a", "\u200Bb", "\uFEFFc"}));
}

TEST_F(Qwen2SplitTest, Newlines) {
  EXPECT_EQ(Split(*pattern_, "a\n\nb"), (V{"a", "\n\n", "b"}));
  EXPECT_EQ(Split(*pattern_, "x  \n  y"), (V{"x", "  \n", " ", " y"}));
  EXPECT_EQ(Split(*pattern_, "a\r\n\tb"), (V{"a", "\r\n", "\tb"}));
  EXPECT_EQ(Split(*pattern_, "foo!!!\n\nbar"), (V{"foo", "!!!\n\n", "bar"}));
  EXPECT_EQ(Split(*pattern_, "x = {\n  y;\n}\n"), (V{"x", " =", " {\n", " ", " y", ";\n", "}\n"}));
  EXPECT_EQ(Split(*pattern_, "\n"), (V{"\n"}));
}

TEST_F(Qwen2SplitTest, PunctuationAndScripts) {
  EXPECT_EQ(Split(*pattern_, "Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(Split(*pattern_, "$x+=1;"), (V{"$x", "+=", "1", ";"}));
  EXPECT_EQ(Split(*pattern_, "\u4F60\u597D\u4E16\u754C"), (V{"\u4F60\u597D\u4E16\u754C"}));
  EXPECT_EQ(Split(*pattern_, "\U0001F44D\U0001F3FD!"), (V{"\U0001F44D\U0001F3FD!"}));
  // A combining mark is not a letter: it stops the letter run and starts a word with the rest.
  EXPECT_EQ(Split(*pattern_, "cafe\u0301s"), (V{"cafe", "\u0301s"}));
  EXPECT_EQ(Split(*pattern_, ""), V{});
}

TEST(SplitPatternTest, Llama3GroupsDigitsByThree) {
  Result<SplitPattern> p = SplitPattern::Parse(kLlama3);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Split(p.value(), "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(Split(p.value(), "x12 345"), (V{"x", "12", " ", "345"}));
}

TEST(SplitPatternTest, Gpt2PatternIsCaseSensitiveAndPrefixesSpaces) {
  const SplitPattern p = SplitPattern::Gpt2();
  EXPECT_EQ(Split(p, "Hello  world's 42 'S!?"), (V{"Hello", " ", " world", "'s", " 42", " '", "S", "!?"}));
}

TEST(SplitPatternTest, RefusesUnknownPatternsNamingThem) {
  for (const std::string bad : {R"(\w+|\s+)", R"([^\r\n\p{L}\p{N}]?\p{Lu}+|\s+)", R"((?i:'s|'t)|\s+)", R"((\s+)"}) {
    Result<SplitPattern> p = SplitPattern::Parse(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.status().message().find(bad), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("not supported"), std::string::npos) << p.status().message();
  }
}

}  // namespace
}  // namespace echelon::tokenizer
