#include "echelon/tokenizer/chat_template.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace echelon::tokenizer {
namespace {

// The real Qwen templates (tests/data/chat_templates, see its README); the expected strings
// below are what Python's jinja2 renders from them. tests/chat_template_test.sh repeats the
// comparison on generated conversations with every known template, the Llama-3 ones included.
std::string Raw(const std::string& name) {
  std::ifstream in(std::string(ECHELON_TEST_DATA) + "/chat_templates/" + name + ".jinja", std::ios::binary);
  EXPECT_TRUE(in) << name;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ChatTemplate Make(const std::string& name) {
  Result<ChatTemplate> t = ChatTemplate::FromRaw(Raw(name));
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? t.value() : ChatTemplate();
}

std::string RenderOk(const ChatTemplate& t, const std::vector<ChatMessage>& m, ChatRenderOptions o = {}) {
  Result<std::string> r = t.Render(m, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : "";
}

TEST(ChatTemplate, KnownTemplatesAreRecognisedByTheirBytes) {
  EXPECT_EQ(Make("qwen3").name(), "qwen3");
  EXPECT_EQ(Make("qwen2_5").name(), "chatml");
  EXPECT_EQ(Make("qwen1_5").name(), "chatml");
  EXPECT_EQ(Make("qwen1_5").default_system(), "You are a helpful assistant");
  EXPECT_EQ(ChatTemplate::FromRaw("").value().name(), "plain");
}

// A template is accepted only byte for byte: one more space, and it is refused with its digest
// and the templates echelon knows, rather than rendered as the family it resembles.
TEST(ChatTemplate, ATemplateThatDiffersInOneByteIsRefused) {
  for (const std::string& raw : {Raw("qwen3") + " ", Raw("qwen2_5").substr(1),
                                 std::string("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}")}) {
    Result<ChatTemplate> t = ChatTemplate::FromRaw(raw);
    ASSERT_FALSE(t.ok());
    const std::string& m = t.status().message();
    EXPECT_NE(m.find("unsupported chat template (sha256 "), std::string::npos) << m;
    EXPECT_NE(m.find("Qwen3 (thinking), Qwen2.5 Instruct, Qwen1.5 Chat, Llama-3 Instruct"), std::string::npos) << m;
  }
  EXPECT_NE(ChatTemplate::FromRaw("{{ bos_token }}[INST]").status().message().find("[INST]"), std::string::npos);
}

TEST(ChatTemplate, Qwen3MatchesTheRealTemplate) {
  const ChatTemplate t = Make("qwen3");
  EXPECT_EQ(RenderOk(t, {{"user", "Hi!"}}), "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderOk(t, {{"user", "Hi!"}}, {true, false}),
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(RenderOk(t, {{"user", "Hi!"}}, {false, std::nullopt}), "<|im_start|>user\nHi!<|im_end|>\n");
  // Reasoning of turns before the last user query is dropped.
  EXPECT_EQ(RenderOk(t, {{"system", "Be brief."},
                         {"user", "2+2?"},
                         {"assistant", "<think>\nadd\n</think>\n\n4"},
                         {"user", "  and 3+3? \n"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4"
            "<|im_end|>\n<|im_start|>user\n  and 3+3? \n<|im_end|>\n<|im_start|>assistant\n");
  // ... and kept after it.
  EXPECT_EQ(RenderOk(t, {{"user", "q"},
                         {"assistant", "<think>\nr1\n</think>\n\na1"},
                         {"user", "q2"},
                         {"assistant", "<think>\nr2\n</think>\n\na2"}},
                     {false, std::nullopt}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
  EXPECT_EQ(RenderOk(t, {{"user", "q"}, {"assistant", "a", std::string("\nr\n")}}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// The template strips with Python's str.lstrip('\n') / strip('\n'): newlines only, so other
// whitespace next to </think> stays.
TEST(ChatTemplate, Qwen3StripsNewlinesOnlyAsPythonDoes) {
  const ChatTemplate t = Make("qwen3");
  EXPECT_EQ(RenderOk(t, {{"user", "q"}, {"assistant", "<think>\n r \n</think>\n\n  a "}}, {false, std::nullopt}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n r \n</think>\n\n  a <|im_end|>\n");
}

TEST(ChatTemplate, ChatMlDefaultSystemMessageComesFromTheTemplate) {
  // Qwen2.5 writes a literal system turn used when the conversation has none.
  const ChatTemplate t = Make("qwen2_5");
  EXPECT_EQ(t.default_system(), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(RenderOk(t, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderOk(t, {{"system", "S"}, {"user", "Hi"}, {"assistant", "<think>x</think>y"}}, {false, std::nullopt}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>x</think>y<|im_end|>\n");
}

TEST(ChatTemplate, PlainFallbackJoinsContents) {
  const ChatTemplate t;
  EXPECT_EQ(RenderOk(t, {{"user", "37+48="}}), "37+48=");
  EXPECT_EQ(RenderOk(t, {{"system", "a"}, {"user", "b"}}), "a\nb");
}

TEST(ChatTemplate, BadMessagesAreNamed) {
  const ChatTemplate t = Make("qwen3");
  Result<std::string> r = t.Render({{"user", "x"}, {"tool", "y"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("messages[1].role: \"tool\""), std::string::npos) << r.status().message();
  EXPECT_FALSE(t.Render({}).ok());
}

TEST(ChatTemplate, PyStripUsesPythonWhitespace) {
  EXPECT_EQ(PyStrip(" \t\n x y \r\f\v"), "x y");
  EXPECT_EQ(PyStrip("\xC2\xA0\xE3\x80\x80x\xE2\x80\xA8\x1F"), "x");  // NBSP, ideographic space, LS, US
  EXPECT_EQ(PyStrip("\xE2\x80\x8Bx\xEF\xBB\xBF"), "\xE2\x80\x8Bx\xEF\xBB\xBF");  // ZWSP and BOM are not spaces
  EXPECT_EQ(PyStrip("   "), "");
  EXPECT_EQ(PyStrip(""), "");
}

// Renders the cases of a JSONL file for tests/chat_template_test.sh; skipped unless
// ECHELON_CHAT_CASES and ECHELON_CHAT_OUT are set. Each case: {"template", "bos_token",
// "messages": [{role, content, reasoning_content?}], "add_generation_prompt", "enable_thinking"?};
// each output line: {"text": ...} or {"error": ...}.
TEST(ChatTemplateDump, RendersCases) {
  const char* in_path = std::getenv("ECHELON_CHAT_CASES");
  const char* out_path = std::getenv("ECHELON_CHAT_OUT");
  if (in_path == nullptr || out_path == nullptr) GTEST_SKIP() << "ECHELON_CHAT_CASES / ECHELON_CHAT_OUT not set";
  std::ifstream in(in_path);
  std::ofstream out(out_path);
  ASSERT_TRUE(in && out);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const nlohmann::json c = nlohmann::json::parse(line);
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c.at("messages")) {
      ChatMessage msg{m.at("role").get<std::string>(), m.at("content").get<std::string>(), std::nullopt};
      if (m.contains("reasoning_content")) msg.reasoning_content = m.at("reasoning_content").get<std::string>();
      messages.push_back(std::move(msg));
    }
    ChatRenderOptions options;
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (c.contains("enable_thinking")) options.enable_thinking = c.at("enable_thinking").get<bool>();
    Result<ChatTemplate> t = ChatTemplate::FromRaw(c.at("template").get<std::string>(), c.value("bos_token", ""));
    Result<std::string> text = t.ok() ? t->Render(messages, options) : Result<std::string>(t.status());
    nlohmann::json o = text.ok() ? nlohmann::json{{"text", text.value()}} : nlohmann::json{{"error", text.status().message()}};
    out << o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    ++n;
  }
  EXPECT_GT(n, 0);
}

}  // namespace
}  // namespace echelon::tokenizer
