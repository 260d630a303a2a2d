// The OpenAI wire format of `echelon serve`: request parsing and validation, and the JSON of
// responses and stream chunks for /v1/completions and /v1/chat/completions. No model here, so
// it is tested without LibTorch or sockets.
//
//   CompletionRequest req;
//   ApiError err;
//   if (!ParseCompletionRequest(body, &req, &err)) reply(err.http_status, ErrorBody(err));
//
// Accepted beyond the OpenAI fields (`presence_penalty` and `frequency_penalty` included), as
// vLLM spells them: `top_k` (0 or -1: off), `min_p`, `repetition_penalty`, `ignore_eos`,
// `min_tokens`, `stop_token_ids`, `return_token_ids` (choices carry `token_ids` and
// `prompt_token_ids`), `return_tokens_as_token_ids` (logprob tokens written "token_id:N"), chat
// `chat_template_kwargs.enable_thinking` and `add_generation_prompt`. Refused with a 400 naming
// the field: `echo`, `best_of` > 1, `logit_bias`, `suffix`, chat `top_logprobs` > 0, tools, and
// any field this server does not know (a client must not believe a setting took effect when it
// did not). Completions `logprobs: k` returns the sampled tokens' log-probs with
// `top_logprobs: null` (alternatives are not computed).
//
// Thread contract: free functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/tokenizer/chat_template.h"

namespace echelon::serve {

// An error for the client: HTTP status and the OpenAI error object.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field; "" when none
  std::string code;   // e.g. "model_not_found"; "" -> null
};
nlohmann::json ErrorBody(const ApiError& e);
// A request body that must be a JSON object; the error says what it was instead.
bool ParseBody(const std::string& body, nlohmann::json* j, ApiError* e);
ApiError BadField(const std::string& param, const std::string& message);

// Fields both endpoints share. Unset optionals take the model's defaults
// (generation_config.json for temperature, top_p, top_k, min_p and repetition_penalty).
struct SamplingRequest {
  std::string model;  // "" when absent
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  bool ignore_eos = false;
  int64_t min_tokens = 0;
  int n = 1;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_token_ids = false;
  bool return_tokens_as_token_ids = false;
};

// One prompt of /v1/completions: text, or token ids used as they are.
struct PromptInput {
  bool is_ids = false;
  std::string text;
  std::vector<int64_t> ids;
};

struct CompletionRequest : SamplingRequest {
  std::vector<PromptInput> prompts;
  std::optional<int> logprobs;  // null/absent: none
};

struct ChatRequest : SamplingRequest {
  std::vector<tokenizer::ChatMessage> messages;
  bool logprobs = false;
  tokenizer::ChatRenderOptions render;
};

constexpr int kMaxN = 128;
constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStop = 16;

// Fill *out or *error (naming the field); return whether the request is valid.
bool ParseCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error);
bool ParseChatRequest(const std::string& body, ChatRequest* out, ApiError* error);

// What generation produced for one choice.
struct ChoiceResult {
  std::string text;
  std::vector<int64_t> token_ids;
  std::vector<float> logprobs;          // one per token id
  std::vector<std::string> token_texts;  // each token decoded alone
  std::string finish_reason;            // "stop" or "length"
  size_t prompt = 0;                    // index of the prompt it continues
};

// The string a logprob entry shows for a token.
std::string TokenLabel(int64_t id, const std::string& text, bool as_token_id);
// Unicode code points of UTF-8 text (text_offset counts these, as Python's len()).
size_t CodePoints(const std::string& utf8);

// Completions `logprobs` of tokens [begin, end) of a choice; `offset` is the text_offset of the
// first one and is advanced past them.
nlohmann::json CompletionLogprobs(const ChoiceResult& c, size_t begin, size_t end, bool as_token_id,
                                  size_t* offset);
// Chat `logprobs` ({"content": [...]}) of tokens [begin, end).
nlohmann::json ChatLogprobs(const ChoiceResult& c, size_t begin, size_t end, bool as_token_id);

nlohmann::json Usage(int64_t prompt_tokens, int64_t completion_tokens);

struct ResponseMeta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

nlohmann::json CompletionResponse(const ResponseMeta& meta, const CompletionRequest& req,
                                  const std::vector<ChoiceResult>& choices,
                                  const std::vector<std::vector<int64_t>>& prompt_ids);
nlohmann::json ChatResponse(const ResponseMeta& meta, const ChatRequest& req, const std::vector<ChoiceResult>& choices,
                            const std::vector<std::vector<int64_t>>& prompt_ids);

// One stream chunk of one choice: `text` is new text, tokens [begin, end) the new tokens
// (their logprobs and ids when asked), `finish_reason` "" while running.
nlohmann::json CompletionChunk(const ResponseMeta& meta, const CompletionRequest& req, size_t index,
                               const ChoiceResult& c, const std::string& text, size_t begin, size_t end,
                               const std::string& finish_reason, size_t* offset);
// Chat chunks; the first one of a choice carries the role (`first`).
nlohmann::json ChatChunk(const ResponseMeta& meta, const ChatRequest& req, size_t index, const ChoiceResult& c,
                         const std::string& text, size_t begin, size_t end, const std::string& finish_reason,
                         bool first);
// The last chunk before [DONE] when stream_options.include_usage is set.
nlohmann::json UsageChunk(const ResponseMeta& meta, const std::string& object, int64_t prompt_tokens,
                          int64_t completion_tokens);

// "data: {json}\n\n" with invalid UTF-8 replaced.
std::string SseEvent(const nlohmann::json& j);
// JSON text with invalid UTF-8 replaced by U+FFFD (decoded text can hold a partial character).
std::string Dump(const nlohmann::json& j);

}  // namespace echelon::serve
