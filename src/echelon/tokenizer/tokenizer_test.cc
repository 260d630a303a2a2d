#include "echelon/tokenizer/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "echelon/tokenizer/bpe.h"
#include "echelon/tokenizer/unicode.h"

namespace echelon::tokenizer {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string Sym(uint8_t b) {
  std::string s;
  AppendUtf8(ByteToChar(b), &s);
  return s;
}

// A tiny Qwen2-style tokenizer.json: the 256 byte symbols have ids 0..255 (id == byte), a
// few merges, and added tokens with every flag.
json TinyTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Sym(static_cast<uint8_t>(b))] = b;
  int next = 256;
  json merges = json::array();
  auto merge = [&](const std::string& a, const std::string& b, bool as_string) {
    merges.push_back(as_string ? json(a + " " + b) : json::array({a, b}));
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  };
  merge("b", "c", true);  // ranks count from 0 in list order: "b c" outranks "a b"
  merge("a", "b", false);
  merge("a", "a", true);
  merge("h", "e", false);
  merge("l", "l", true);
  merge("he", "ll", false);
  merge("hell", "o", true);
  merge("Ġ", "w", false);
  merge("o", "r", true);
  merge("Ġw", "or", false);
  merge("l", "d", true);
  merge("Ġwor", "ld", false);
  vocab["xyz"] = next++;  // reachable only with ignore_merges
  json added = json::array({
      {{"id", 1000}, {"content", "<|im_start|>"}, {"special", true}, {"normalized", false}},
      {{"id", 1001}, {"content", "<|im_end|>"}, {"special", true}, {"normalized", false}},
      {{"id", 1002}, {"content", "<think>"}, {"special", false}, {"normalized", false}},
      {{"id", 1003}, {"content", "<|im"}, {"special", false}, {"normalized", false}},
      {{"id", 1004}, {"content", "<mask>"}, {"special", true}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}},
      {{"id", 1005}, {"content", "<w>"}, {"special", false}, {"normalized", false}, {"single_word", true}},
      {{"id", 1006}, {"content", "caf\u00E9"}, {"special", false}, {"normalized", true}},
  });
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

Tokenizer Make(const json& j, const json& config = nullptr) {
  Result<Tokenizer> t = Tokenizer::FromJsonText(j.dump(), "tiny/tokenizer.json", config.is_null() ? "" : config.dump(),
                                                "tiny/tokenizer_config.json");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

int32_t Id(const Tokenizer& t, const std::string& token) {
  std::optional<int32_t> id = t.TokenToId(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

Ids Bytes(const std::string& s) {
  Ids ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

Ids Encode(const Tokenizer& t, const std::string& text) {
  Result<Ids> ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? ids.value() : Ids{};
}

std::string Decode(const Tokenizer& t, const Ids& ids, bool skip_special = false) {
  Result<std::string> s = t.Decode(ids, skip_special);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? s.value() : "";
}

TEST(TokenizerTest, MergesApplyByRank) {
  const Tokenizer t = Make(TinyTokenizer());
  const int32_t a = 'a', c = 'c';
  // "b c" has the lower rank, so it wins over "a b" although "a b" is leftmost.
  EXPECT_EQ(Encode(t, "abc"), (Ids{a, Id(t, "bc")}));
  EXPECT_EQ(Encode(t, "abx"), (Ids{Id(t, "ab"), 'x'}));
  // Equal ranks merge leftmost first.
  EXPECT_EQ(Encode(t, "aaa"), (Ids{Id(t, "aa"), a}));
  EXPECT_EQ(Encode(t, "aaaa"), (Ids{Id(t, "aa"), Id(t, "aa")}));
  // Merges chain through intermediate tokens; pre-tokens never merge across.
  EXPECT_EQ(Encode(t, "hello world"), (Ids{Id(t, "hello"), Id(t, "Ġworld")}));
  EXPECT_EQ(Encode(t, "hello  world"), (Ids{Id(t, "hello"), ' ', Id(t, "Ġworld")}));
  EXPECT_EQ(Encode(t, "ab1c"), (Ids{Id(t, "ab"), '1', c}));
  // Without merges every byte is its own token (ids equal bytes in this vocabulary).
  EXPECT_EQ(Encode(t, "\u4E2D!"), Bytes("\u4E2D!"));
  EXPECT_EQ(Encode(t, ""), Ids{});
  // The cached second encoding is the same as the first.
  EXPECT_EQ(Encode(t, "hello world"), (Ids{Id(t, "hello"), Id(t, "Ġworld")}));
}

TEST(TokenizerTest, IgnoreMergesTakesWholeVocabularyWords) {
  json j = TinyTokenizer();
  EXPECT_EQ(Encode(Make(j), "xyz"), Bytes("xyz"));
  j["model"]["ignore_merges"] = true;
  const Tokenizer t = Make(j);
  EXPECT_EQ(Encode(t, "xyz"), (Ids{Id(t, "xyz")}));
  EXPECT_EQ(Encode(t, "abc"), (Ids{'a', Id(t, "bc")}));
}

TEST(TokenizerTest, AddedTokensSplitOutBeforePreTokenization) {
  const Tokenizer t = Make(TinyTokenizer());
  EXPECT_EQ(Encode(t, "<|im_start|>user<think>ab<|im_end|>"),
            (Ids{1000, 'u', 's', 'e', 'r', 1002, Id(t, "ab"), 1001}));
  // Inside a word, and the longest match at the leftmost position wins ("<|im" vs "<|im_start|>").
  EXPECT_EQ(Encode(t, "ab<|im_start|>ab"), (Ids{Id(t, "ab"), 1000, Id(t, "ab")}));
  EXPECT_EQ(Encode(t, "<|im_end"), (Ids{1003, '_', 'e', 'n', 'd'}));
  // Text around a token is pre-tokenized on its own: " " alone, then " ab" as Ġ + ab.
  EXPECT_EQ(Encode(t, " <think> ab"), (Ids{' ', 1002, ' ', Id(t, "ab")}));
  // A partial special token is plain text.
  EXPECT_EQ(Encode(t, "<think"), Bytes("<think"));
}

TEST(TokenizerTest, AddedTokenFlags) {
  const Tokenizer t = Make(TinyTokenizer());
  // lstrip/rstrip: "<mask>" swallows the whitespace on both sides.
  EXPECT_EQ(Encode(t, "ab  <mask>\t ab"), (Ids{Id(t, "ab"), 1004, Id(t, "ab")}));
  EXPECT_EQ(Encode(t, "<mask>\u3000"), (Ids{1004}));
  // single_word: "<w>" only matches with no word character next to it.
  EXPECT_EQ(Encode(t, "ab <w> ab"), (Ids{Id(t, "ab"), ' ', 1005, ' ', Id(t, "ab")}));
  EXPECT_EQ(Encode(t, "<w>"), (Ids{1005}));
  EXPECT_EQ(Encode(t, "x<w>"), Bytes("x<w>"));
  EXPECT_EQ(Encode(t, "<w>\u00E9"), Bytes("<w>\u00E9"));
  EXPECT_EQ(Encode(t, "<w>,"), (Ids{1005, ','}));
  // normalized: "café" matches after NFC, so the decomposed spelling matches too.
  EXPECT_EQ(Encode(t, "cafe\u0301"), (Ids{1006}));
  EXPECT_EQ(Encode(t, "a caf\u00E9!"), (Ids{'a', ' ', 1006, '!'}));
}

// The cases the reference library's own tests pin down for single_word, lstrip and rstrip.
TEST(TokenizerTest, AddedTokenFlagsMatchTheReferenceCases) {
  auto with_mask = [](bool strip) {
    json j = TinyTokenizer();
    j["added_tokens"] = json::array({{{"id", 1000}, {"content", "<mask>"}, {"special", false}, {"normalized", false},
                                      {"single_word", true}, {"lstrip", strip}, {"rstrip", strip}}});
    return Make(j);
  };
  auto count = [](const Ids& ids) { return std::count(ids.begin(), ids.end(), 1000); };
  const Tokenizer word = with_mask(false);
  const std::string s1 = "<mask> My name <mask> A<mask> <mask>ony <mask>";
  const Ids ids1 = Encode(word, s1);
  EXPECT_EQ(count(ids1), 3);  // not "A<mask>", not "<mask>ony"
  EXPECT_EQ(ids1.front(), 1000);
  EXPECT_EQ(ids1.back(), 1000);
  EXPECT_EQ(Decode(word, ids1), s1);
  // Punctuation is no word character; a combining mark is.
  EXPECT_EQ(count(Encode(word, "<mask>, <mask>- \u25CC\u0330<mask>")), 2);
  // Stripping: the third token's left tab already belongs to the second token.
  const Tokenizer strip = with_mask(true);
  const int32_t he = Id(strip, "he");
  EXPECT_EQ(Encode(strip, "Hi <mask> there\t<mask>\t<mask>\u2000"), (Ids{'H', 'i', 1000, 't', he, 'r', 'e', 1000, 1000}));
}

TEST(TokenizerTest, NfcAppliesOutsideAddedTokens) {
  const Tokenizer t = Make(TinyTokenizer());
  EXPECT_EQ(Encode(t, "e\u0301"), Bytes("\u00E9"));
  EXPECT_EQ(Encode(t, "\u212B"), Bytes("\u00C5"));  // ANGSTROM SIGN -> A WITH RING
  json j = TinyTokenizer();
  j["normalizer"] = nullptr;
  EXPECT_EQ(Encode(Make(j), "e\u0301"), Bytes("e\u0301"));
}

TEST(TokenizerTest, ByteLevelMappingCoversAll256Bytes) {
  std::set<char32_t> chars;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = ByteToChar(static_cast<uint8_t>(b));
    EXPECT_EQ(CharToByte(c), b);
    chars.insert(c);
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (printable) {
      EXPECT_EQ(c, static_cast<char32_t>(b));
    }
  }
  EXPECT_EQ(chars.size(), 256u);
  EXPECT_EQ(ByteToChar(' '), U'\u0120');   // Ġ
  EXPECT_EQ(ByteToChar('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(ByteToChar(0xAD), U'\u0143');
  EXPECT_EQ(CharToByte(U'\u0144'), -1);

  json j = TinyTokenizer();
  j["normalizer"] = nullptr;  // NFC would rewrite some of the characters below
  const Tokenizer t = Make(j);
  // Every byte decodes alone: ASCII to itself, the rest to U+FFFD (no byte >= 0x80 is UTF-8 alone).
  for (int b = 0; b < 256; ++b) {
    const std::string want = b < 0x80 ? std::string(1, static_cast<char>(b)) : "\uFFFD";
    EXPECT_EQ(Decode(t, {b}), want) << b;
  }
  // Text using every byte that well-formed UTF-8 has round-trips, one byte token each.
  std::string all;
  for (char32_t c : {0x00, 0x7F, 0x80, 0x7FF, 0x800, 0xCFFF, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF}) {
    AppendUtf8(c, &all);
  }
  for (char32_t c = 0; c < 0x800; c += 1) AppendUtf8(c, &all);
  for (char32_t c = 0x1000; c <= 0xF000; c += 0x1000) AppendUtf8(c, &all);
  for (char32_t c = 0x10000; c <= 0x100000; c += 0x40000) AppendUtf8(c, &all);
  std::set<uint8_t> seen(all.begin(), all.end());
  EXPECT_EQ(seen.size(), 256u - 13u);  // all but C0 C1 F5..FF
  EXPECT_EQ(Decode(t, Encode(t, all)), all);
}

TEST(TokenizerTest, DecodeReplacesIllFormedUtf8AndNamesUnknownIds) {
  const Tokenizer t = Make(TinyTokenizer());
  EXPECT_EQ(Decode(t, {0xE4, 0xB8, 0xAD}), "\u4E2D");
  EXPECT_EQ(Decode(t, {0xE4, 0xB8}), "\uFFFD");            // truncated: one replacement
  EXPECT_EQ(Decode(t, {0xE4, 0xB8, 'a', 0xAD}), "\uFFFDa\uFFFD");
  EXPECT_EQ(Decode(t, {0xE4, 0xB8, 1000, 0xAD}), "\uFFFD<|im_start|>\uFFFD");
  EXPECT_EQ(Decode(t, {0xF0, 0x9F, 0x98}), "\uFFFD");
  EXPECT_EQ(Decode(t, {0xED, 0xA0, 0x80}), "\uFFFD\uFFFD\uFFFD");  // surrogate: each byte
  EXPECT_EQ(Decode(t, {0xC0, 0xAF}), "\uFFFD\uFFFD");              // overlong
  EXPECT_EQ(Decode(t, {0xF4, 0x90, 0x80, 0x80}), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(Decode(t, {Id(t, "Ġworld"), 1000, 1002, Id(t, "hello")}), " world<|im_start|><think>hello");
  EXPECT_EQ(Decode(t, {1000, 'a', 1004, 1002}, /*skip_special=*/true), "a<think>");
  EXPECT_EQ(Decode(t, {}), "");
  Result<std::string> bad = t.Decode({1, 999999});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("999999"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(t.Encode("ab\xC3").ok());
}

TEST(TokenizerTest, EncodeDecodeRoundTripsMixedText) {
  const Tokenizer t = Make(TinyTokenizer());
  for (const std::string s : {"hello world<|im_end|>\n\n  x", "I'M \u4F60\u597D \U0001F468\u200D\U0001F469\u200D\U0001F467 12345\r\n",
                              "\t\t<think>\u00E9</think>", "   "}) {
    EXPECT_EQ(Decode(t, Encode(t, s)), s);
  }
}

TEST(TokenizerTest, ByteLevelPrefixSpaceAndRegex) {
  json j = TinyTokenizer();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  const Tokenizer t = Make(j);
  // The GPT-2 split, then every piece without a leading space gets one.
  EXPECT_EQ(Encode(t, "hello world"), (Ids{' ', Id(t, "hello"), Id(t, "Ġworld")}));
  EXPECT_EQ(Encode(t, "ab<think>ab"), (Ids{' ', Id(t, "ab"), 1002, ' ', Id(t, "ab")}));
}

TEST(TokenizerTest, ConfigOverridesAndAddsTokens) {
  const json config = {{"added_tokens_decoder",
                        {{"1002", {{"content", "<think>"}, {"special", true}, {"normalized", false}}},
                         {"1010", {{"content", "<new>"}, {"special", false}, {"normalized", false}}}}},
                       {"clean_up_tokenization_spaces", false}};
  const Tokenizer t = Make(TinyTokenizer(), config);
  EXPECT_EQ(Decode(t, {1000, 'a', 1002}, /*skip_special=*/true), "a");
  EXPECT_EQ(Encode(t, "a<new>"), (Ids{'a', 1010}));
  EXPECT_EQ(t.id_end(), 1011);
  EXPECT_EQ(t.IdToToken(1010).value_or(""), "<new>");
}

TEST(TokenizerTest, LoadsFromDirectory) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("echelon_tokenizer_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << TinyTokenizer().dump();
  Result<Tokenizer> t = Tokenizer::Load(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->Encode("hello").value(), Ids{Id(t.value(), "hello")});
  std::ofstream(dir / "tokenizer_config.json") << "{\"added_tokens_decoder\": [";
  Result<Tokenizer> bad = Tokenizer::Load(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find((dir / "tokenizer_config.json").string()), std::string::npos);
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos) << bad.status().message();
  std::filesystem::remove_all(dir);
  Result<Tokenizer> missing = Tokenizer::Load(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find((dir / "tokenizer.json").string()), std::string::npos);
}

TEST(TokenizerTest, RefusesMalformedFilesWithOneClearError) {
  auto expect_bad = [](const std::function<void(json&)>& edit, const std::string& part) {
    json j = TinyTokenizer();
    edit(j);
    Result<Tokenizer> t = Tokenizer::FromJsonText(j.dump(), "bad/tokenizer.json");
    ASSERT_FALSE(t.ok()) << "accepted, expected: " << part;
    EXPECT_NE(t.status().message().find("bad/tokenizer.json"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(part), std::string::npos) << t.status().message();
  };
  expect_bad([](json& j) { j["model"].erase("vocab"); }, "missing model.vocab");
  expect_bad([](json& j) { j["model"].erase("merges"); }, "missing model.merges");
  expect_bad([](json& j) { j.erase("model"); }, "missing model");
  expect_bad([](json& j) { j["model"]["type"] = "WordPiece"; }, "\"WordPiece\" is not supported");
  expect_bad([](json& j) { j["model"]["vocab"]["x"] = -3; }, "model.vocab[\"x\"]");
  expect_bad([](json& j) { j["model"]["vocab"]["dup"] = 5; }, "id 5");
  expect_bad([](json& j) { j["model"]["merges"].push_back("a zz"); }, "names \"zz\", which is not in model.vocab");
  expect_bad([](json& j) { j["model"]["merges"].push_back(json::array({"q", "x"})); }, "makes \"qx\"");
  expect_bad([](json& j) { j["model"]["merges"].push_back("abc"); }, "model.merges[12]");
  expect_bad([](json& j) { j["model"]["merges"].push_back(7); }, "model.merges[12]");
  expect_bad([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  expect_bad([](json& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  expect_bad([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  expect_bad([](json& j) { j["model"]["unk_token"] = "<unk>"; }, "unk_token");
  expect_bad([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer type \"Lowercase\"");
  expect_bad([](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer");
  expect_bad([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\w+)"; }, "\\w+");
  expect_bad([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "behavior");
  expect_bad([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}}; }, "pattern");
  expect_bad([](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }, "must end with a ByteLevel");
  expect_bad([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder");
  expect_bad([](json& j) { j["added_tokens"][1]["id"] = 1000; }, "id 1000 is given to both");
  expect_bad([](json& j) { j["added_tokens"][1]["id"] = 7; }, "model.vocab gives to");
  expect_bad([](json& j) { j["added_tokens"][1].erase("content"); }, "added_tokens[1]");
  expect_bad([](json& j) { j["added_tokens"][1]["special"] = "yes"; }, "special must be true or false");
  expect_bad([](json& j) { j = json::array(); }, "must be a JSON object");

  Result<Tokenizer> not_json = Tokenizer::FromJsonText("{\"model\": ", "bad/tokenizer.json");
  ASSERT_FALSE(not_json.ok());
  EXPECT_NE(not_json.status().message().find("bad/tokenizer.json: not valid JSON"), std::string::npos);

  const json config = {{"added_tokens_decoder", {{"1002", {{"content", "<other>"}}}}}};
  Result<Tokenizer> clash = Tokenizer::FromJsonText(TinyTokenizer().dump(), "t.json", config.dump(), "bad/tokenizer_config.json");
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("bad/tokenizer_config.json"), std::string::npos) << clash.status().message();
  EXPECT_NE(clash.status().message().find("<other>"), std::string::npos) << clash.status().message();
}

}  // namespace
}  // namespace echelon::tokenizer
