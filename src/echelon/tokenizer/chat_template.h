// Chat templates: OpenAI-style messages -> the prompt text a model family was trained on.
//
//   ECHELON_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::FromRaw(raw_jinja, "<|begin_of_text|>"));
//   ECHELON_ASSIGN_OR_RETURN(std::string prompt, t.Render({{"user", "Hi!"}}, {}));
//
// There is no Jinja engine. A template is accepted only when its raw text (tokenizer_config.json
// `chat_template` or chat_template.jinja) is, byte for byte, one of the known templates below
// (by SHA-256), and rendered by hand exactly as Python's jinja2 renders it under transformers'
// settings (tests/chat_template_test.sh checks every known template on generated
// conversations). Every other template is refused with an error naming its digest and the
// known ones: a template that differs in any byte may render differently, and a model prompted
// in a format it was not trained on fails silently. The renderers:
//   qwen3   Qwen3: ChatML with <think> handling: an assistant turn after the last user query
//           keeps its reasoning as "<think>\n...\n</think>\n\n"; earlier turns lose it;
//           `enable_thinking: false` appends an empty think block to the generation prompt.
//   chatml  Qwen1.5 / Qwen2.5: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message; the default
//           system message written in the template ("You are Qwen, created by Alibaba Cloud.
//           ...") is inserted when the conversation has none.
//   llama3  Llama-3 Instruct: BOS, then "<|start_header_id|>ROLE<|end_header_id|>\n\n" +
//           CONTENT (Python str.strip()) + "<|eot_id|>" per message; the base tokenizer's
//           template, which never reads add_generation_prompt, always ends with the assistant
//           header, as it renders.
//   plain   no template (an echelon checkpoint, a base model): the message contents joined by
//           "\n", roles dropped, nothing appended for the generation prompt, so a character-
//           tokenizer model sees exactly the text it was trained on.
// Tool definitions and roles other than system/user/assistant (tool calls, tool results) are
// refused.
//
// Thread contract: immutable after construction; Render is safe for concurrent use.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::tokenizer {

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c, std::optional<std::string> reasoning = std::nullopt)
      : role(std::move(r)), content(std::move(c)), reasoning_content(std::move(reasoning)) {}

  std::string role;  // "system", "user" or "assistant"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant turns (Qwen3 thinking)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // unset: the template's default
};

enum class ChatFormat { kPlain, kChatMl, kQwen3, kLlama3 };

class ChatTemplate {
 public:
  ChatTemplate() = default;
  // `raw`: tokenizer_config.json's chat_template (empty: plain); `bos_token`: its bos_token.
  static Result<ChatTemplate> FromRaw(const std::string& raw, const std::string& bos_token = "");

  // Errors name the message (`messages[2].role`) that cannot be rendered.
  Result<std::string> Render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options = {}) const;

  ChatFormat format() const { return format_; }
  std::string name() const;  // "plain", "chatml", "qwen3" or "llama3"
  // ChatML: the system message the template inserts when there is none ("" if none).
  const std::string& default_system() const { return default_system_; }

 private:
  std::string RenderChatMl(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const;
  std::string RenderQwen3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const;
  std::string RenderLlama3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const;

  ChatFormat format_ = ChatFormat::kPlain;
  std::string default_system_;
  std::string bos_token_;
  bool reads_enable_thinking_ = false;      // qwen3
  bool reads_generation_prompt_ = true;     // llama3: false -> the assistant header is always added
};

// The models whose templates FromRaw accepts, comma-separated (for error messages and docs).
std::string KnownChatTemplates();

// Python's str.strip() / lstrip() / rstrip() without arguments: Unicode whitespace
// (str.isspace) at the ends of UTF-8 text.
std::string PyStrip(const std::string& s);

}  // namespace echelon::tokenizer
