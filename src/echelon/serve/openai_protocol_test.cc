#include "echelon/serve/openai_protocol.h"

#include <gtest/gtest.h>

namespace echelon::serve {
namespace {

using nlohmann::json;

ApiError CompletionError(const json& body) {
  CompletionRequest r;
  ApiError e;
  EXPECT_FALSE(ParseCompletionRequest(body.dump(), &r, &e)) << body.dump();
  return e;
}

ApiError ChatError(const json& body) {
  ChatRequest r;
  ApiError e;
  EXPECT_FALSE(ParseChatRequest(body.dump(), &r, &e)) << body.dump();
  return e;
}

TEST(OpenAiProtocol, ParsesEveryPromptShape) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model": "m", "prompt": "hi"})", &r, &e)) << e.message;
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_ids);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.logprobs.has_value());

  CompletionRequest ids;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": [1, 5, 7]})", &ids, &e)) << e.message;
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_ids);
  EXPECT_EQ(ids.prompts[0].ids, (std::vector<int64_t>{1, 5, 7}));

  CompletionRequest many;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": [[1, 2], "x", [3]]})", &many, &e)) << e.message;
  ASSERT_EQ(many.prompts.size(), 3u);
  EXPECT_EQ(many.prompts[0].ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(many.prompts[1].text, "x");
  EXPECT_EQ(many.prompts[2].ids, (std::vector<int64_t>{3}));
}

TEST(OpenAiProtocol, ParsesSamplingFields) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"prompt": "x", "max_tokens": 7, "temperature": 0, "top_p": 0.5, "n": 3, "seed": 18446744073709551615,
          "stop": ["a", "bb"], "stop_token_ids": [2], "stream": true, "stream_options": {"include_usage": true},
          "logprobs": 2, "return_token_ids": true, "return_tokens_as_token_ids": true, "user": "ignored"})",
      &r, &e))
      << e.message;
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(*r.temperature, 0.0);
  EXPECT_EQ(*r.top_p, 0.5);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(*r.seed, 18446744073709551615ULL);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<int64_t>{2}));
  EXPECT_TRUE(r.stream && r.include_usage && r.return_token_ids && r.return_tokens_as_token_ids);
  EXPECT_EQ(*r.logprobs, 2);
  EXPECT_FALSE(r.top_k || r.min_p || r.repetition_penalty);
  EXPECT_EQ(r.presence_penalty, 0.0);
  EXPECT_FALSE(r.ignore_eos);

  CompletionRequest vllm;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"prompt": "x", "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": -0.5,
          "frequency_penalty": 1.5, "ignore_eos": true, "min_tokens": 3})",
      &vllm, &e))
      << e.message;
  EXPECT_EQ(*vllm.top_k, 20);
  EXPECT_EQ(*vllm.min_p, 0.05);
  EXPECT_EQ(*vllm.repetition_penalty, 1.1);
  EXPECT_EQ(vllm.presence_penalty, -0.5);
  EXPECT_EQ(vllm.frequency_penalty, 1.5);
  EXPECT_TRUE(vllm.ignore_eos);
  EXPECT_EQ(vllm.min_tokens, 3);

  CompletionRequest single;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x", "stop": "\n", "temperature": null})", &single, &e));
  EXPECT_EQ(single.stop, (std::vector<std::string>{"\n"}));
  EXPECT_FALSE(single.temperature.has_value());
}

TEST(OpenAiProtocol, BadFieldsAreNamed) {
  struct Case {
    json body;
    std::string param;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "x"}, {"temperature", 3}}, "temperature", "'temperature' must be in [0.0, 2.0], got 3"},
      {{{"prompt", "x"}, {"temperature", "hot"}}, "temperature", "must be a number, got a string"},
      {{{"prompt", "x"}, {"top_p", 0}}, "top_p", "(0.0, 1.0]"},
      {{{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens", "[1, "},
      {{{"prompt", "x"}, {"max_tokens", 1.5}}, "max_tokens", "must be an integer, got a float"},
      {{{"prompt", "x"}, {"n", 0}}, "n", "[1, 128]"},
      {{{"prompt", "x"}, {"seed", -1}}, "seed", "non-negative"},
      {{{"prompt", "x"}, {"stop", json::array({1})}}, "stop", "an element 1"},
      {{{"prompt", "x"}, {"stop", ""}}, "stop", "must not be empty"},
      {{{"prompt", "x"}, {"logprobs", true}}, "logprobs", "got a boolean"},
      {{{"prompt", "x"}, {"logprobs", 21}}, "logprobs", "[0, 20]"},
      {{{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, "stream_options", "only allowed with"},
      {{{"prompt", "x"}, {"echo", true}}, "echo", "not supported"},
      {{{"prompt", "x"}, {"best_of", 2}}, "best_of", "not supported"},
      {{{"prompt", "x"}, {"presence_penalty", 2.5}}, "presence_penalty", "[-2.0, 2.0]"},
      {{{"prompt", "x"}, {"repetition_penalty", 0}}, "repetition_penalty", "(0.0, 2.0]"},
      {{{"prompt", "x"}, {"top_k", -2}}, "top_k", "[-1, "},
      {{{"prompt", "x"}, {"min_p", 1.5}}, "min_p", "[0.0, 1.0]"},
      {{{"prompt", "x"}, {"ignore_eos", 1}}, "ignore_eos", "must be a boolean"},
      {{{"prompt", "x"}, {"max_tokens", 4}, {"min_tokens", 5}}, "min_tokens", "at most 'max_tokens' (4)"},
      {{{"prompt", "x"}, {"typical_p", 0.9}}, "typical_p", "'typical_p' is not supported by this server"},
      {{{"prompt", "x"}, {"logit_bias", {{"5", 1}}}}, "logit_bias", "not supported"},
      {{{"prompt", json::array()}}, "prompt", "empty array"},
      {{{"prompt", json::array({1, -2})}}, "prompt", "prompt[1] must be a non-negative integer"},
      {{{"prompt", 5}}, "prompt", "got a number"},
      {{{"max_tokens", 3}}, "prompt", "'prompt' is required"},
      {{{"prompt", "x"}, {"stream", "yes"}}, "stream", "must be a boolean"},
  };
  for (const Case& c : cases) {
    const ApiError e = CompletionError(c.body);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, c.param) << c.body.dump();
    EXPECT_NE(e.message.find(c.message_part), std::string::npos) << c.body.dump() << " -> " << e.message;
  }
  CompletionRequest r;
  ApiError e;
  EXPECT_FALSE(ParseCompletionRequest("{not json", &r, &e));
  EXPECT_NE(e.message.find("not valid JSON"), std::string::npos);
  EXPECT_FALSE(ParseCompletionRequest("[1]", &r, &e));
  EXPECT_NE(e.message.find("must be a JSON object"), std::string::npos);
}

TEST(OpenAiProtocol, ParsesChatMessages) {
  ChatRequest r;
  ApiError e;
  ASSERT_TRUE(ParseChatRequest(
      R"({"messages": [{"role": "developer", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null, "reasoning_content": "r"}],
          "logprobs": true, "top_logprobs": 0, "max_completion_tokens": 9,
          "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": false})",
      &r, &e))
      << e.message;
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(*r.messages[2].reasoning_content, "r");
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_FALSE(*r.render.enable_thinking);
  EXPECT_FALSE(r.render.add_generation_prompt);
}

TEST(OpenAiProtocol, BadChatFieldsAreNamed) {
  EXPECT_EQ(ChatError({{"messages", json::array()}}).param, "messages");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}).param, "messages[0].role");
  EXPECT_EQ(ChatError({{"messages", {{{"content", "x"}}}}}).param, "messages[0].role");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", 5}}}}}).param, "messages[0].content");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}).param,
            "messages[0].content");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 3}}).param,
            "top_logprobs");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"logprobs", 1}}).param, "logprobs");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"chat_template_kwargs", {{"x", 1}}}}).param,
            "chat_template_kwargs.x");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", {{{"type", "function"}}}}}).param,
            "tools");
}

TEST(OpenAiProtocol, ErrorBodyHasTheOpenAiShape) {
  ApiError e = BadField("temperature", "too hot");
  const json body = ErrorBody(e);
  EXPECT_EQ(body["error"]["message"], "too hot");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "temperature");
  EXPECT_TRUE(body["error"]["code"].is_null());
}

ChoiceResult Choice() {
  ChoiceResult c;
  c.text = "h\xC3\xA9!";
  c.token_ids = {7, 8, 9};
  c.logprobs = {-0.5f, -1.25f, 0.0f};
  c.token_texts = {"h", "\xC3\xA9", "!"};
  c.finish_reason = "length";
  return c;
}

TEST(OpenAiProtocol, CompletionResponseCarriesLogprobsOffsetsAndUsage) {
  CompletionRequest req;
  req.logprobs = 0;
  req.return_token_ids = true;
  const json r = CompletionResponse({"cmpl-1", 100, "m"}, req, {Choice()}, {{1, 2, 3, 4}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "m");
  const json& c = r["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["text"], "h\xC3\xA9!");
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["tokens"], json({"h", "\xC3\xA9", "!"}));
  EXPECT_EQ(c["logprobs"]["token_logprobs"], json({-0.5, -1.25, 0.0}));
  EXPECT_EQ(c["logprobs"]["text_offset"], json({0, 1, 2}));  // code points, not bytes
  EXPECT_EQ(c["logprobs"]["top_logprobs"], json({nullptr, nullptr, nullptr}));
  EXPECT_EQ(c["token_ids"], json({7, 8, 9}));
  EXPECT_EQ(c["prompt_token_ids"], json({1, 2, 3, 4}));
  EXPECT_EQ(r["usage"], json({{"prompt_tokens", 4}, {"completion_tokens", 3}, {"total_tokens", 7}}));

  req.logprobs.reset();
  req.return_token_ids = false;
  const json plain = CompletionResponse({"cmpl-1", 100, "m"}, req, {Choice()}, {{1}});
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(plain["choices"][0].contains("token_ids"));
}

TEST(OpenAiProtocol, ChatLogprobsCarryBytesAndTokenIdLabels) {
  ChatRequest req;
  req.logprobs = true;
  req.return_tokens_as_token_ids = true;
  const json r = ChatResponse({"chatcmpl-1", 5, "m"}, req, {Choice()}, {{1, 2}});
  EXPECT_EQ(r["object"], "chat.completion");
  const json& c = r["choices"][0];
  EXPECT_EQ(c["message"], json({{"role", "assistant"}, {"content", "h\xC3\xA9!"}}));
  const json& content = c["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[1]["token"], "token_id:8");
  EXPECT_EQ(content[1]["logprob"], -1.25);
  EXPECT_EQ(content[1]["bytes"], json({0xC3, 0xA9}));
  EXPECT_EQ(content[1]["top_logprobs"], json::array());
}

TEST(OpenAiProtocol, ChunksHaveTheStreamShape) {
  CompletionRequest req;
  req.logprobs = 0;
  const ChoiceResult c = Choice();
  size_t offset = 1;
  const json chunk = CompletionChunk({"cmpl-1", 5, "m"}, req, 2, c, "\xC3\xA9", 1, 2, "", &offset);
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["text"], "\xC3\xA9");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"], json({1}));
  EXPECT_EQ(offset, 2u);

  ChatRequest chat;
  const json first = ChatChunk({"chatcmpl-1", 5, "m"}, chat, 0, c, "", 0, 0, "", true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  const json last = ChatChunk({"chatcmpl-1", 5, "m"}, chat, 0, c, "", 3, 3, "stop", false);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json usage = UsageChunk({"chatcmpl-1", 5, "m"}, "chat.completion.chunk", 4, 3);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(OpenAiProtocol, InvalidUtf8IsReplacedInJson) {
  EXPECT_EQ(Dump(json("a\xFF")), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace echelon::serve
