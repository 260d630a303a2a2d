#include "echelon/model/tokenizer.h"

#include <gtest/gtest.h>

#include "echelon/tokenizer/tokenizer.h"

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
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"].size(), 4u);
  EXPECT_EQ(j["model"]["vocab"]["\u0120"], 6) << "the space is byte-level U+0120, id 3 + 3";
  Result<CharTokenizer> back = CharTokenizer::FromJson(j, "tok.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->vocab_size(), tok.vocab_size());
  EXPECT_EQ(back->Encode("z y").value(), tok.Encode("z y").value());
}

// The stored form is a real Hugging Face tokenizer.json: the byte-level BPE of tokenizer/
// encodes and decodes it exactly as CharTokenizer does, specials included.
TEST(CharTokenizerTest, StoredFormIsAHuggingFaceTokenizerWithTheSameIds) {
  std::string printable;
  for (int c = 32; c < 127; ++c) printable.push_back(static_cast<char>(c));
  for (const std::string& alphabet : {std::string("0123456789+-= "), printable}) {
    const CharTokenizer tok = CharTokenizer::ForAlphabet(alphabet);
    Result<tokenizer::Tokenizer> hf = tokenizer::Tokenizer::FromJsonText(tok.ToJson().dump(), "tokenizer.json");
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_EQ(hf->id_end(), tok.vocab_size());
    for (const std::string& text : {std::string("37+48=85"), std::string(" 1 - 2 "), alphabet}) {
      const std::vector<int64_t> want = tok.Encode(text).value();
      const std::vector<int32_t> got = hf->Encode(text).value();
      EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want) << text;
      EXPECT_EQ(hf->Decode(got).value(), text);
    }
    EXPECT_EQ(hf->Encode("<eos>").value(), std::vector<int32_t>{2});
    EXPECT_EQ(hf->Decode({1, 5, 2}, /*skip_special_tokens=*/true).value(), tok.Decode({1, 5, 2}));
  }
}

TEST(CharTokenizerTest, ReadsTheOlderCharFormat) {
  const nlohmann::json old = {{"type", "char"}, {"specials", {"<pad>", "<bos>", "<eos>"}}, {"chars", "ab "}};
  Result<CharTokenizer> t = CharTokenizer::FromJson(old, "old.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->Encode("b a").value(), (std::vector<int64_t>{4, 5, 3}));
}

TEST(CharTokenizerTest, FromJsonRejectsMalformedInput) {
  auto expect_bad = [](const nlohmann::json& j, const std::string& part) {
    Result<CharTokenizer> r = CharTokenizer::FromJson(j, "ck/tokenizer.json");
    ASSERT_FALSE(r.ok()) << j.dump();
    EXPECT_NE(r.status().message().find("ck/tokenizer.json"), std::string::npos);
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  };
  const nlohmann::json good = CharTokenizer::ForAlphabet("ab").ToJson();
  nlohmann::json j = good;
  j["model"]["merges"] = {"a b"};
  expect_bad(j, "merges");
  j = good;
  j["added_tokens"][0]["content"] = "<s>";
  expect_bad(j, "added_tokens");
  j = good;
  j["model"]["vocab"]["ab"] = 5;
  expect_bad(j, "not one byte");
  j = good;
  j["model"]["vocab"]["b"] = 3;
  expect_bad(j, "3, 4");
  // The older form.
  const nlohmann::json old = {{"type", "char"}, {"specials", {"<pad>", "<bos>", "<eos>"}}, {"chars", "ab"}};
  j = old;
  j["type"] = "bpe";
  expect_bad(j, "type");
  j = old;
  j["specials"] = {"<bos>", "<pad>", "<eos>"};
  expect_bad(j, "specials");
  j = old;
  j["chars"] = "aba";
  expect_bad(j, "repeated");
  j = old;
  j.erase("chars");
  expect_bad(j, "chars");
  expect_bad(nlohmann::json::array(), "object");
}

}  // namespace
}  // namespace echelon::model
