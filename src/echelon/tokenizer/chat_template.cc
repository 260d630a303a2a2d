#include "echelon/tokenizer/chat_template.h"

#include <cstdint>

#include "echelon/common/sha256.h"

namespace echelon::tokenizer {
namespace {

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Python's str.isspace() for one code point.
bool PySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for a stray byte).
size_t SeqLen(unsigned char lead) {
  if (lead >= 0xF0 && lead < 0xF8) return 4;
  if (lead >= 0xE0) return lead < 0xF0 ? 3 : 1;
  if (lead >= 0xC0) return 2;
  return 1;
}

uint32_t CodePointAt(const std::string& s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  if (len == 1) return b(0);
  if (len == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (len == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// Byte offset just past the leading whitespace.
size_t SkipSpaceForward(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = SeqLen(static_cast<unsigned char>(s[i]));
    if (i + len > s.size() || !PySpace(CodePointAt(s, i, len))) break;
    i += len;
  }
  return i;
}

// Byte offset of the start of the trailing whitespace (at least `floor`).
size_t SkipSpaceBackward(const std::string& s, size_t floor) {
  size_t end = s.size();
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    const size_t len = end - start;
    if (SeqLen(static_cast<unsigned char>(s[start])) != len || !PySpace(CodePointAt(s, start, len))) break;
    end = start;
  }
  return end;
}

std::string LStripChars(const std::string& s, char c) {
  size_t i = 0;
  while (i < s.size() && s[i] == c) ++i;
  return s.substr(i);
}

std::string RStripChars(const std::string& s, char c) {
  size_t n = s.size();
  while (n > 0 && s[n - 1] == c) --n;
  return s.substr(0, n);
}

// The body of a Jinja string literal with its escapes undone (\n, \t, \\, \', \").
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
  }
  return out;
}

// The system message a ChatML template writes out by itself: the literal text between
// "<|im_start|>system\n" and "<|im_end|>" inside one string literal (Qwen2, Qwen2.5). A
// template that only ever writes a message's own content there has none.
std::string DefaultSystem(const std::string& raw) {
  for (const std::string& head : {std::string("<|im_start|>system\\n"), std::string("<|im_start|>system\n")}) {
    for (size_t at = raw.find(head); at != std::string::npos; at = raw.find(head, at + 1)) {
      const size_t begin = at + head.size();
      const size_t end = raw.find("<|im_end|>", begin);
      if (end == std::string::npos || end == begin) continue;
      const std::string body = raw.substr(begin, end - begin);
      bool closes_literal = false;  // an unescaped quote: the literal ended before <|im_end|>
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\\') {
          ++i;
        } else if (body[i] == '\'' || body[i] == '"') {
          closes_literal = true;
          break;
        }
      }
      if (!closes_literal) return Unescape(body);
    }
  }
  return "";
}

std::string Describe(const std::string& raw) {
  std::string head = raw.substr(0, 80);
  for (char& c : head)
    if (c == '\n') c = ' ';
  return "\"" + head + (raw.size() > 80 ? "...\"" : "\"");
}

}  // namespace

std::string PyStrip(const std::string& s) {
  const size_t begin = SkipSpaceForward(s);
  return s.substr(begin, SkipSpaceBackward(s, begin) - begin);
}

namespace {

// The templates rendered byte for byte (by SHA-256 of the raw text; tests/chat_template_test.sh
// compares every one with Python's jinja2 on generated conversations).
struct KnownTemplate {
  const char* sha256;
  ChatFormat format;
  const char* models;
};
constexpr KnownTemplate kKnownTemplates[] = {
    {"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5", ChatFormat::kQwen3, "Qwen3 (thinking)"},
    {"cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f", ChatFormat::kChatMl, "Qwen2.5 Instruct"},
    {"af9c0233881b083b52ff773580215222b5440ac3d0beeeca99b76329b048f8db", ChatFormat::kChatMl, "Qwen1.5 Chat"},
    {"ba03a121d097859c7b5b9cd03af99aafe95275210d2876f642ad9929a150f122", ChatFormat::kLlama3, "Llama-3 Instruct"},
    {"b48c47f6443892716176eb200bf4ef108f64e06ca26ed0fa8ebc0a4b3992fcb2", ChatFormat::kLlama3,
     "Llama-3 (always ends with the assistant header)"},
};

}  // namespace

std::string KnownChatTemplates() {
  std::string out;
  for (const KnownTemplate& k : kKnownTemplates) out += std::string(out.empty() ? "" : ", ") + k.models;
  return out;
}

Result<ChatTemplate> ChatTemplate::FromRaw(const std::string& raw, const std::string& bos_token) {
  ChatTemplate t;
  t.bos_token_ = bos_token;
  if (raw.empty()) return t;
  const std::string digest = Sha256Hex(raw);
  const KnownTemplate* known = nullptr;
  for (const KnownTemplate& k : kKnownTemplates)
    if (digest == k.sha256) known = &k;
  if (known == nullptr)
    return InvalidArgument("unsupported chat template (sha256 " + digest.substr(0, 12) + ", " + Describe(raw) +
                           "): echelon renders only templates it reproduces byte for byte (" + KnownChatTemplates() +
                           "); a template that differs in any byte is refused rather than rendered differently "
                           "from how the model was trained");
  t.format_ = known->format;
  t.default_system_ = DefaultSystem(raw);
  t.reads_enable_thinking_ = Contains(raw, "enable_thinking");
  t.reads_generation_prompt_ = Contains(raw, "add_generation_prompt");
  return t;
}

std::string ChatTemplate::name() const {
  switch (format_) {
    case ChatFormat::kChatMl: return "chatml";
    case ChatFormat::kQwen3: return "qwen3";
    case ChatFormat::kLlama3: return "llama3";
    case ChatFormat::kPlain: break;
  }
  return "plain";
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& options) const {
  if (messages.empty()) return InvalidArgument("messages: at least one message is needed");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return InvalidArgument("messages[" + std::to_string(i) + "].role: \"" + role +
                             "\" is not supported (system, user or assistant)");
    }
  }
  switch (format_) {
    case ChatFormat::kChatMl: return RenderChatMl(messages, options);
    case ChatFormat::kQwen3: return RenderQwen3(messages, options);
    case ChatFormat::kLlama3: return RenderLlama3(messages, options);
    case ChatFormat::kPlain: break;
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) out += (i > 0 ? "\n" : "") + messages[i].content;
  return out;
}

std::string ChatTemplate::RenderChatMl(const std::vector<ChatMessage>& messages,
                                       const ChatRenderOptions& options) const {
  std::string out;
  if (!default_system_.empty() && messages[0].role != "system")
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string ChatTemplate::RenderQwen3(const std::vector<ChatMessage>& messages,
                                      const ChatRenderOptions& options) const {
  std::string out;
  if (messages[0].role == "system") out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  // The last user turn that is not a wrapped tool response (the template's last_query_index).
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    const bool tool_response = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                               c.compare(c.size() - 16, 16, "</tool_response>") == 0;
    if (messages[i].role == "user" && !tool_response) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content;
      std::string reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (Contains(m.content, "</think>")) {
        content = LStripChars(m.content.substr(m.content.rfind("</think>") + 8), '\n');
        std::string before = RStripChars(m.content.substr(0, m.content.find("</think>")), '\n');
        const size_t open = before.rfind("<think>");
        if (open != std::string::npos) before = before.substr(open + 7);
        reasoning = LStripChars(before, '\n');
      }
      const bool last = i + 1 == messages.size();
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + RStripChars(LStripChars(reasoning, '\n'), '\n') +
               "\n</think>\n\n" + LStripChars(content, '\n');
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (reads_enable_thinking_ && options.enable_thinking.has_value() && !*options.enable_thinking)
      out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string ChatTemplate::RenderLlama3(const std::vector<ChatMessage>& messages,
                                       const ChatRenderOptions& options) const {
  std::string out = bos_token_;
  for (const ChatMessage& m : messages)
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + PyStrip(m.content) + "<|eot_id|>";
  if (options.add_generation_prompt || !reads_generation_prompt_) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace echelon::tokenizer
