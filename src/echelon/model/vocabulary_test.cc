// Vocabulary: the prompt prefix each tokenizer family asks for, completion decoding (stop id,
// special tokens, ids without a token), the run-spec round trip, and checkpoints of a BPE run
// that carry its tokenizer files byte for byte.
#include "echelon/model/vocabulary.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "echelon/common/fs.h"
#include "echelon/model/checkpoint.h"
#include "echelon/model/hf_model.h"
#include "echelon/model/testing.h"
#include "echelon/tokenizer/bpe.h"

namespace echelon::model {
namespace {

using nlohmann::json;

// A byte-level BPE: the 256 byte symbols (ids 0..255) and four added tokens.
json ByteLevelTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer::BytesToSymbols(std::string(1, static_cast<char>(b)))] = b;
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|begin_of_text|>", "<|endoftext|>", "<|im_end|>", "<|im_start|>"})
    added.push_back({{"id", id++}, {"content", t}, {"special", true}, {"normalized", false}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

TokenizerFiles Files(const json& tokenizer, const json& config = nullptr) {
  TokenizerFiles f{{"tokenizer.json", tokenizer.dump()}};
  if (!config.is_null()) f["tokenizer_config.json"] = config.dump();
  return f;
}

TEST(Vocabulary, CharactersPutBosFirstAndStopAtEos) {
  const Vocabulary v = Vocabulary::Characters("0123456789+=");
  EXPECT_TRUE(v.is_characters());
  EXPECT_EQ(v.id_end(), 15);
  EXPECT_EQ(v.EncodePrompt("1+2=").value(), (std::vector<int64_t>{1, 4, 13, 5, 14}));
  EXPECT_EQ(v.stop_ids(), std::vector<int64_t>{2});
  EXPECT_EQ(v.DecodeCompletion({6, 2}), "3");
  SamplingParams sp;
  v.SetStops(&sp);
  EXPECT_EQ(sp.eos_token_id, 2);
  EXPECT_TRUE(sp.stop_token_ids.empty());
  // The files it writes read back as the same vocabulary.
  Result<Vocabulary> back = Vocabulary::FromFiles(v.files(), {}, "ckpt");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->is_characters());
  EXPECT_EQ(back->EncodePrompt("9=").value(), v.EncodePrompt("9=").value());
  EXPECT_FALSE(v.EncodePrompt("a").ok()) << "outside the alphabet";
}

TEST(Vocabulary, PromptPrefixFollowsTheReferencePostProcessor) {
  // Qwen: a ByteLevel post-processor adds nothing.
  Result<Vocabulary> qwen = Vocabulary::FromFiles(Files(ByteLevelTokenizer()), {258, 257}, "qwen");
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  EXPECT_FALSE(qwen->is_characters());
  EXPECT_EQ(qwen->EncodePrompt("7+8=").value(), (std::vector<int64_t>{'7', '+', '8', '='}));
  EXPECT_EQ(qwen->bos(), -1);
  // Llama 3: TemplateProcessing whose single template starts with <|begin_of_text|>.
  json llama = ByteLevelTokenizer();
  llama["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {256}}}}}}}})}};
  Result<Vocabulary> l = Vocabulary::FromFiles(Files(llama), {257}, "llama");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->EncodePrompt("hi").value(), (std::vector<int64_t>{256, 'h', 'i'}));
  // tokenizer_config.json's add_bos_token decides when present.
  Result<Vocabulary> off = Vocabulary::FromFiles(Files(llama, {{"add_bos_token", false}}), {257}, "off");
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_EQ(off->EncodePrompt("hi").value(), (std::vector<int64_t>{'h', 'i'}));
  Result<Vocabulary> on = Vocabulary::FromFiles(
      Files(ByteLevelTokenizer(), {{"add_bos_token", true}, {"bos_token", {{"content", "<|endoftext|>"}}}}), {258}, "on");
  ASSERT_TRUE(on.ok()) << on.status().message();
  EXPECT_EQ(on->EncodePrompt("x").value(), (std::vector<int64_t>{257, 'x'}));
  // A BOS that is not a token is refused by file name.
  Result<Vocabulary> bad = Vocabulary::FromFiles(
      Files(ByteLevelTokenizer(), {{"add_bos_token", true}, {"bos_token", "<s>"}}), {258}, "dir");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dir/tokenizer_config.json"), std::string::npos) << bad.status().message();
}

TEST(Vocabulary, DecodeCompletionDropsTheStopAndSpecialsAndMarksUnknownIds) {
  Result<Vocabulary> v = Vocabulary::FromFiles(Files(ByteLevelTokenizer()), {258, 257}, "v");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->DecodeCompletion({'4', '2', 258}), "42");
  EXPECT_EQ(v->DecodeCompletion({'4', 257}), "4");
  EXPECT_EQ(v->DecodeCompletion({'4', 256, '2'}), "42") << "special tokens have no text in a completion";
  // Rows of a padded embedding (ids past the tokenizer) cannot be decoded: U+FFFD each.
  EXPECT_EQ(v->DecodeCompletion({'4', 300, '2'}), "4\xEF\xBF\xBD" "2");
  SamplingParams sp;
  v->SetStops(&sp);
  EXPECT_EQ(sp.eos_token_id, 258);
  EXPECT_EQ(sp.stop_token_ids, std::vector<int64_t>{257});
  EXPECT_EQ(v->eos_json(), json::array({258, 257}));
}

TEST(Vocabulary, RunSpecRoundTripAndErrors) {
  Result<Vocabulary> v = Vocabulary::FromFiles(Files(ByteLevelTokenizer(), {{"add_bos_token", false}}), {258}, "v");
  ASSERT_TRUE(v.ok()) << v.status().message();
  Result<Vocabulary> back = Vocabulary::FromJson(json::parse(v->ToJson().dump()), "run spec");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->files(), v->files());
  EXPECT_EQ(back->stop_ids(), v->stop_ids());
  EXPECT_EQ(back->Encode("a b").value(), v->Encode("a b").value());
  EXPECT_FALSE(Vocabulary::FromJson(json{{"files", json::object()}, {"stop_ids", {1}}}, "spec").ok())
      << "no tokenizer.json";
  EXPECT_FALSE(Vocabulary::FromJson(json{{"files", {{"tokenizer.json", "{"}}}, {"stop_ids", {1}}}, "spec").ok());
  EXPECT_FALSE(Vocabulary::FromJson(json{{"stop_ids", {1}}}, "spec").ok());
}

// The run spec's file names become files on an actor's disk (the openai-http backend writes
// them beside each snapshot): a learner naming "../x" must not write outside that directory.
TEST(Vocabulary, RunSpecFileNamesThatAreNotTokenizerFilesAreRefused) {
  json spec = json::parse(Vocabulary::Characters("0123").ToJson().dump());
  for (const std::string name : {"../../etc/cron.d/x", "/tmp/x", "sub/tokenizer.json", "model.safetensors", ""}) {
    json bad = spec;
    bad["files"][name] = "payload";
    Result<Vocabulary> v = Vocabulary::FromJson(bad, "run spec");
    ASSERT_FALSE(v.ok()) << name;
    EXPECT_NE(v.status().message().find("vocabulary file \"" + name + "\" is not a tokenizer file name"), std::string::npos)
        << v.status().message();
  }
}

TEST(Vocabulary, ChatPromptsAreOneRenderedUserTurn) {
  // Qwen3's real template (tests/data/chat_templates/qwen3.jinja): templates are accepted byte for byte.
  std::ifstream in(std::string(ECHELON_TEST_DATA) + "/chat_templates/qwen3.jinja", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string qwen3((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<Vocabulary> v = Vocabulary::FromFiles(
      Files(ByteLevelTokenizer(), {{"add_bos_token", false}, {"chat_template", qwen3}}), {258}, "v");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->chat_template(), qwen3);
  EXPECT_FALSE(v->chat());
  Result<Vocabulary> chat = v->WithChat(false);
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  EXPECT_TRUE(chat->chat());
  const std::vector<int64_t> want =
      chat->Encode("<|im_start|>user\n7+8=<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n").value();
  EXPECT_EQ(want.front(), 259);
  EXPECT_EQ(chat->EncodePrompt("7+8=").value(), want);
  EXPECT_EQ(v->EncodePrompt("7+8=").value(), (std::vector<int64_t>{'7', '+', '8', '='})) << "the original is unchanged";
  // A system message is a system turn with chat, and a line before the prompt without.
  EXPECT_EQ(chat->EncodePrompt("Be brief.", "7+8=").value(),
            chat->Encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n7+8=<|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n\n</think>\n\n")
                .value());
  EXPECT_EQ(v->EncodePrompt("S", "7+8=").value(), (std::vector<int64_t>{'S', '\n', '7', '+', '8', '='}));
  // The chat setting travels with the run spec.
  Result<Vocabulary> back = Vocabulary::FromJson(json::parse(chat->ToJson().dump()), "run spec");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->chat());
  EXPECT_EQ(back->EncodePrompt("7+8=").value(), want);
  // No template, or one of an unsupported family: refused.
  EXPECT_FALSE(Vocabulary::FromFiles(Files(ByteLevelTokenizer()), {258}, "v")->WithChat(false).ok());
  Result<Vocabulary> odd = Vocabulary::FromFiles(
      Files(ByteLevelTokenizer(), {{"chat_template", "{{ messages[0]['content'] }}"}}), {258}, "v");
  ASSERT_TRUE(odd.ok());
  EXPECT_FALSE(odd->WithChat(false).ok());
}

TEST(Vocabulary, CheckpointCarriesTheTokenizerFilesAndStopIds) {
  const std::string root = std::filesystem::temp_directory_path() / ("echelon_vocab_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  TokenizerFiles files = Files(ByteLevelTokenizer(), {{"add_bos_token", false}, {"pad_token", "<|endoftext|>"}});
  files["generation_config.json"] = json{{"temperature", 0.6}, {"top_p", 0.95}, {"eos_token_id", 1}}.dump();
  Result<Vocabulary> v = Vocabulary::FromFiles(files, {258, 257}, "v");
  ASSERT_TRUE(v.ok()) << v.status().message();
  ModelConfig c = TinyTestConfig(300, 32);
  c.bos_token_id = -1;
  c.eos_token_id = 258;
  c.pad_token_id = 257;
  Qwen3Model m(c);
  m->InitWeights(1);
  ASSERT_TRUE(SaveCheckpoint(root + "/ckpt", m, v.value()).ok());
  for (const auto& [name, bytes] : v->files())
    if (name != "generation_config.json") EXPECT_EQ(ReadFile(root + "/ckpt/" + name).value(), bytes) << name;
  // The source's sampling defaults stay; the ids are the vocabulary's.
  const json gen = json::parse(ReadFile(root + "/ckpt/generation_config.json").value());
  EXPECT_EQ(gen["temperature"], 0.6);
  EXPECT_EQ(gen["top_p"], 0.95);
  EXPECT_EQ(gen["eos_token_id"], json::array({258, 257}));
  EXPECT_EQ(gen["pad_token_id"], 257);
  EXPECT_FALSE(gen.contains("bos_token_id"));
  Result<TextModel> back = LoadModelDir(root + "/ckpt");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->format, "huggingface");
  EXPECT_EQ(back->stop_ids, (std::vector<int64_t>{258, 257}));
  EXPECT_DOUBLE_EQ(back->temperature, 0.6);
  ASSERT_TRUE(back->vocab);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(back->vocab->files().at(name), v->files().at(name)) << name;
  // A tokenizer with more ids than the model has rows is refused.
  ModelConfig small = TinyTestConfig(100, 32);
  Qwen3Model s(small);
  EXPECT_FALSE(SaveCheckpoint(root + "/small", s, v.value()).ok());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace echelon::model
