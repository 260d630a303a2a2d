#include "echelon/model/tokenizer.h"

#include <gtest/gtest.h>

namespace echelon::model {
namespace {

TEST(CharTokenizerTest, EncodesAndDecodesTheAlphabet) {
  const CharTokenizer tok = CharTokenizer::ForAlphabet("0123456789+-= ");
  EXPECT_EQ(tok.vocab_size(), 17);
  Result<std::vector<int64_t>> ids = tok.Encode("37+48=");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids.value(), (std::vector<int64_t>{6, 10, 13, 7, 11, 15}));
  EXPECT_EQ(tok.Decode(ids.value()), "37+48=");
  EXPECT_EQ(tok.Encode("")->size(), 0u);
}

TEST(CharTokenizerTest, DecodeDropsSpecialsAndMarksUnknownIds) {
  const CharTokenizer tok = CharTokenizer::ForAlphabet("ab");
  EXPECT_EQ(tok.Decode({CharTokenizer::kBos, 3, CharTokenizer::kPad, 4, CharTokenizer::kEos}), "ab");
  EXPECT_EQ(tok.Decode({3, 5, -1, 4}), "a??b");
}

TEST(CharTokenizerTest, EncodeNamesTheUnknownCharacterAndPosition) {
  const CharTokenizer tok = CharTokenizer::ForAlphabet("0123456789");
  Result<std::vector<int64_t>> r = tok.Encode("12x4");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'x'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("position 2"), std::string::npos) << r.status().message();
  Result<std::vector<int64_t>> nonprint = tok.Encode(std::string("1\n"));
  ASSERT_FALSE(nonprint.ok());
  EXPECT_NE(nonprint.status().message().find("0x0a"), std::string::npos) << nonprint.status().message();
  EXPECT_FALSE(CharTokenizer().Encode("a").ok()) << "an empty tokenizer knows no characters";
}

TEST(CharTokenizerTest, RepeatedCharactersKeepTheirFirstId) {
  const CharTokenizer tok = CharTokenizer::ForAlphabet("abca");
  EXPECT_EQ(tok.vocab_size(), 6);
  EXPECT_EQ(tok.Encode("a").value(), std::vector<int64_t>{3});
}

TEST(CharTokenizerTest, JsonRoundTrip) {
  const CharTokenizer tok = CharTokenizer::ForAlphabet("xyz ");
  const nlohmann::json j = tok.ToJson();
  EXPECT_EQ(j["type"], "char");
  EXPECT_EQ(j["chars"], "xyz ");
  EXPECT_EQ(j["specials"], nlohmann::json({"<pad>", "<bos>", "<eos>"}));
  Result<CharTokenizer> back = CharTokenizer::FromJson(j, "tok.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->vocab_size(), tok.vocab_size());
  EXPECT_EQ(back->Encode("z y").value(), tok.Encode("z y").value());
}

TEST(CharTokenizerTest, FromJsonRejectsMalformedInput) {
  nlohmann::json good = CharTokenizer::ForAlphabet("ab").ToJson();
  auto expect_bad = [](const nlohmann::json& j, const std::string& part) {
    Result<CharTokenizer> r = CharTokenizer::FromJson(j, "ck/tokenizer.json");
    ASSERT_FALSE(r.ok()) << j.dump();
    EXPECT_NE(r.status().message().find("ck/tokenizer.json"), std::string::npos);
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  };
  nlohmann::json j = good;
  j["type"] = "bpe";
  expect_bad(j, "type");
  j = good;
  j["specials"] = {"<bos>", "<pad>", "<eos>"};
  expect_bad(j, "specials");
  j = good;
  j["chars"] = "aba";
  expect_bad(j, "repeated");
  j = good;
  j.erase("chars");
  expect_bad(j, "chars");
  expect_bad(nlohmann::json::array(), "object");
}

}  // namespace
}  // namespace echelon::model
