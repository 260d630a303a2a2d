#include "echelon/serve/openai_protocol.h"

#include <cmath>
#include <limits>
#include <set>

namespace echelon::serve {
namespace {

using nlohmann::json;

std::string TypeName(const json& v) { return v.is_number_float() ? "a float" : std::string("a ") + v.type_name(); }

// Each reader leaves *out alone when the field is absent or null, and fails naming the field.
bool ReadBool(const json& j, const char* key, bool* out, ApiError* e) {
  if (!j.contains(key) || j[key].is_null()) return true;
  if (!j[key].is_boolean()) {
    *e = BadField(key, std::string("'") + key + "' must be a boolean, got " + TypeName(j[key]));
    return false;
  }
  *out = j[key].get<bool>();
  return true;
}

bool ReadNumber(const json& j, const char* key, double lo, double hi, bool lo_open, std::optional<double>* out,
                ApiError* e) {
  if (!j.contains(key) || j[key].is_null()) return true;
  const json& v = j[key];
  if (!v.is_number()) {
    *e = BadField(key, std::string("'") + key + "' must be a number, got " + TypeName(v));
    return false;
  }
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    *e = BadField(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                           json(hi).dump() + "], got " + v.dump());
    return false;
  }
  *out = x;
  return true;
}

bool ReadInt(const json& j, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out, ApiError* e) {
  if (!j.contains(key) || j[key].is_null()) return true;
  const json& v = j[key];
  if (!v.is_number_integer()) {
    *e = BadField(key, std::string("'") + key + "' must be an integer, got " + TypeName(v));
    return false;
  }
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t x = too_big ? hi : v.get<int64_t>();
  if (too_big || x < lo || x > hi) {
    *e = BadField(key, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + v.dump());
    return false;
  }
  *out = x;
  return true;
}

// A token id list: non-empty integers >= 0 (the vocabulary bound is the engine's check).
bool ReadIds(const json& v, const std::string& where, std::vector<int64_t>* out, ApiError* e, const std::string& param) {
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || (v[i].is_number_integer() && !v[i].is_number_unsigned() && v[i].get<int64_t>() < 0)) {
      *e = BadField(param, where + "[" + std::to_string(i) + "] must be a non-negative integer token id, got " + v[i].dump());
      return false;
    }
    out->push_back(v[i].get<int64_t>());
  }
  return true;
}

bool Refuse(const json& j, ApiError* e) {
  auto present = [&](const char* k) {
    return j.contains(k) && !j[k].is_null() && !(j[k].is_object() && j[k].empty()) && !(j[k].is_array() && j[k].empty());
  };
  if (j.contains("best_of") && !j["best_of"].is_null() && !(j["best_of"].is_number_integer() && j["best_of"].get<int64_t>() == 1)) {
    *e = BadField("best_of", "'best_of' is not supported (only 1)");
    return false;
  }
  for (const char* k : {"logit_bias", "suffix", "tools", "functions", "response_format"}) {
    if (present(k)) {
      *e = BadField(k, std::string("'") + k + "' is not supported");
      return false;
    }
  }
  if (j.contains("echo") && j["echo"].is_boolean() && j["echo"].get<bool>()) {
    *e = BadField("echo", "'echo' is not supported");
    return false;
  }
  return true;
}

// Fields of both endpoints; bookkeeping fields OpenAI clients may send are read and ignored.
const std::set<std::string>& CommonFields() {
  static const std::set<std::string> kFields = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
      "frequency_penalty", "ignore_eos", "min_tokens", "n", "seed", "stop", "stop_token_ids", "stream",
      "stream_options", "return_token_ids", "return_tokens_as_token_ids", "logprobs", "best_of", "logit_bias",
      "user", "metadata", "store", "service_tier"};
  return kFields;
}

// A field neither CommonFields nor `extra` names is refused: a client must not believe a
// setting took effect when this server does not know it.
bool RefuseUnknown(const json& j, std::initializer_list<const char*> extra, ApiError* e) {
  for (const auto& [k, v] : j.items()) {
    if (CommonFields().count(k)) continue;
    bool known = false;
    for (const char* x : extra) known = known || k == x;
    if (!known) {
      *e = BadField(k, "'" + k + "' is not supported by this server");
      return false;
    }
  }
  return true;
}

bool ParseCommon(const json& j, SamplingRequest* r, ApiError* e, const char* max_tokens_key) {
  if (!Refuse(j, e)) return false;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) {
      *e = BadField("model", "'model' must be a string, got " + TypeName(j["model"]));
      return false;
    }
    r->model = j["model"].get<std::string>();
  }
  if (!ReadInt(j, max_tokens_key, 1, std::numeric_limits<int32_t>::max(), &r->max_tokens, e)) return false;
  if (!ReadNumber(j, "temperature", 0.0, 2.0, false, &r->temperature, e)) return false;
  if (!ReadNumber(j, "top_p", 0.0, 1.0, true, &r->top_p, e)) return false;
  if (!ReadInt(j, "top_k", -1, std::numeric_limits<int32_t>::max(), &r->top_k, e)) return false;
  if (!ReadNumber(j, "min_p", 0.0, 1.0, false, &r->min_p, e)) return false;
  if (!ReadNumber(j, "repetition_penalty", 0.0, 2.0, true, &r->repetition_penalty, e)) return false;
  std::optional<double> presence, frequency;
  if (!ReadNumber(j, "presence_penalty", -2.0, 2.0, false, &presence, e)) return false;
  if (!ReadNumber(j, "frequency_penalty", -2.0, 2.0, false, &frequency, e)) return false;
  r->presence_penalty = presence.value_or(0.0);
  r->frequency_penalty = frequency.value_or(0.0);
  if (!ReadBool(j, "ignore_eos", &r->ignore_eos, e)) return false;
  std::optional<int64_t> min_tokens;
  if (!ReadInt(j, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &min_tokens, e)) return false;
  r->min_tokens = min_tokens.value_or(0);
  if (r->max_tokens && r->min_tokens > *r->max_tokens) {
    *e = BadField("min_tokens", "'min_tokens' (" + std::to_string(r->min_tokens) + ") must be at most '" +
                                    max_tokens_key + "' (" + std::to_string(*r->max_tokens) + ")");
    return false;
  }
  std::optional<int64_t> n;
  if (!ReadInt(j, "n", 1, kMaxN, &n, e)) return false;
  r->n = static_cast<int>(n.value_or(1));
  if (j.contains("seed") && !j["seed"].is_null()) {
    const json& s = j["seed"];
    if (!s.is_number_integer() || (!s.is_number_unsigned() && s.get<int64_t>() < 0)) {
      *e = BadField("seed", "'seed' must be a non-negative integer, got " + s.dump());
      return false;
    }
    r->seed = s.get<uint64_t>();
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r->stop = {s.get<std::string>()};
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) {
          *e = BadField("stop", "'stop' must be a string or an array of strings, got an element " + x.dump());
          return false;
        }
        r->stop.push_back(x.get<std::string>());
      }
    } else {
      *e = BadField("stop", "'stop' must be a string or an array of strings, got " + TypeName(s));
      return false;
    }
    if (r->stop.size() > kMaxStop) {
      *e = BadField("stop", "'stop' holds " + std::to_string(r->stop.size()) + " strings; at most " +
                                std::to_string(kMaxStop));
      return false;
    }
    for (const std::string& x : r->stop) {
      if (x.empty()) {
        *e = BadField("stop", "'stop' strings must not be empty");
        return false;
      }
    }
  }
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null()) {
    if (!j["stop_token_ids"].is_array()) {
      *e = BadField("stop_token_ids", "'stop_token_ids' must be an array of token ids");
      return false;
    }
    if (!ReadIds(j["stop_token_ids"], "stop_token_ids", &r->stop_token_ids, e, "stop_token_ids")) return false;
  }
  if (!ReadBool(j, "stream", &r->stream, e)) return false;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!so.is_object()) {
      *e = BadField("stream_options", "'stream_options' must be an object");
      return false;
    }
    if (!r->stream) {
      *e = BadField("stream_options", "'stream_options' is only allowed with 'stream': true");
      return false;
    }
    if (!ReadBool(so, "include_usage", &r->include_usage, e)) {
      e->param = "stream_options.include_usage";
      return false;
    }
  }
  if (!ReadBool(j, "return_token_ids", &r->return_token_ids, e)) return false;
  return ReadBool(j, "return_tokens_as_token_ids", &r->return_tokens_as_token_ids, e);
}

bool ParseObject(const std::string& body, json* j, ApiError* e) {
  try {
    *j = json::parse(body);
  } catch (const json::exception& ex) {
    *e = BadField("", std::string("the request body is not valid JSON: ") + ex.what());
    return false;
  }
  if (!j->is_object()) {
    *e = BadField("", "the request body must be a JSON object, got " + TypeName(*j));
    return false;
  }
  return true;
}

// Message content: a string, null, or an array of {"type": "text", "text": ...} parts.
bool ReadContent(const json& m, size_t i, std::string* out, ApiError* e) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (!m.contains("content") || m["content"].is_null()) return true;
  const json& c = m["content"];
  if (c.is_string()) {
    *out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) {
    *e = BadField(where, "'" + where + "' must be a string or an array of text parts, got " + TypeName(c));
    return false;
  }
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      *e = BadField(where, "'" + where + "[" + std::to_string(k) +
                               "]' must be {\"type\": \"text\", \"text\": \"...\"} (only text is supported)");
      return false;
    }
    *out += part["text"].get<std::string>();
  }
  return true;
}

}  // namespace

bool ParseBody(const std::string& body, json* j, ApiError* e) { return ParseObject(body, j, e); }

json ErrorBody(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError BadField(const std::string& param, const std::string& message) {
  ApiError e;
  e.http_status = 400;
  e.param = param;
  e.message = message;
  return e;
}

bool ParseCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* e) {
  json j;
  if (!ParseObject(body, &j, e) || !RefuseUnknown(j, {"prompt", "echo", "suffix"}, e) ||
      !ParseCommon(j, out, e, "max_tokens"))
    return false;
  if (!j.contains("prompt") || j["prompt"].is_null()) {
    *e = BadField("prompt", "'prompt' is required");
    return false;
  }
  const json& p = j["prompt"];
  const std::string kShape = "'prompt' must be a string, an array of strings, an array of token ids or an array of "
                             "arrays of token ids";
  if (p.is_string()) {
    out->prompts.push_back({false, p.get<std::string>(), {}});
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    PromptInput in;
    in.is_ids = true;
    if (!ReadIds(p, "prompt", &in.ids, e, "prompt")) return false;
    out->prompts.push_back(std::move(in));
  } else if (p.is_array() && !p.empty()) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i].is_string()) {
        out->prompts.push_back({false, p[i].get<std::string>(), {}});
      } else if (p[i].is_array() && !p[i].empty()) {
        PromptInput in;
        in.is_ids = true;
        if (!ReadIds(p[i], "prompt[" + std::to_string(i) + "]", &in.ids, e, "prompt")) return false;
        out->prompts.push_back(std::move(in));
      } else {
        *e = BadField("prompt", kShape + "; prompt[" + std::to_string(i) + "] is " + p[i].dump());
        return false;
      }
    }
  } else {
    *e = BadField("prompt", kShape + (p.is_array() ? " (got an empty array)" : ", got " + TypeName(p)));
    return false;
  }
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    std::optional<int64_t> k;
    if (j["logprobs"].is_boolean()) {
      *e = BadField("logprobs", "'logprobs' must be an integer in [0, 20] on /v1/completions, got a boolean");
      return false;
    }
    if (!ReadInt(j, "logprobs", 0, kMaxLogprobs, &k, e)) return false;
    out->logprobs = static_cast<int>(*k);
  }
  return true;
}

bool ParseChatRequest(const std::string& body, ChatRequest* out, ApiError* e) {
  json j;
  if (!ParseObject(body, &j, e) ||
      !RefuseUnknown(j, {"messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt",
                         "chat_template_kwargs", "tools", "functions", "response_format", "tool_choice",
                         "parallel_tool_calls"},
                     e))
    return false;
  const char* max_key = j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()
                            ? "max_completion_tokens"
                            : "max_tokens";
  if (!ParseCommon(j, out, e, max_key)) return false;
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    *e = BadField("messages", "'messages' must be a non-empty array of {role, content} objects");
    return false;
  }
  const json& ms = j["messages"];
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!ms[i].is_object() || !ms[i].contains("role") || !ms[i]["role"].is_string()) {
      *e = BadField(where + ".role", "'" + where + "' must be an object with a string 'role'");
      return false;
    }
    tokenizer::ChatMessage m;
    m.role = ms[i]["role"].get<std::string>();
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "developer") {
      *e = BadField(where + ".role", "'" + where + ".role' \"" + m.role +
                                         "\" is not supported (system, developer, user or assistant)");
      return false;
    }
    if (m.role == "developer") m.role = "system";  // OpenAI's newer name for the system turn
    if (!ReadContent(ms[i], i, &m.content, e)) return false;
    if (ms[i].contains("reasoning_content") && !ms[i]["reasoning_content"].is_null()) {
      if (!ms[i]["reasoning_content"].is_string()) {
        *e = BadField(where + ".reasoning_content", "'" + where + ".reasoning_content' must be a string");
        return false;
      }
      m.reasoning_content = ms[i]["reasoning_content"].get<std::string>();
    }
    if (ms[i].contains("tool_calls") && !ms[i]["tool_calls"].is_null() && !ms[i]["tool_calls"].empty()) {
      *e = BadField(where + ".tool_calls", "'" + where + ".tool_calls' is not supported");
      return false;
    }
    out->messages.push_back(std::move(m));
  }
  if (!ReadBool(j, "logprobs", &out->logprobs, e)) return false;
  std::optional<int64_t> top;
  if (!ReadInt(j, "top_logprobs", 0, kMaxLogprobs, &top, e)) return false;
  if (top.value_or(0) > 0) {
    *e = BadField("top_logprobs", "'top_logprobs' > 0 is not supported: only the sampled tokens' log-probabilities "
                                  "are computed");
    return false;
  }
  if (!ReadBool(j, "add_generation_prompt", &out->render.add_generation_prompt, e)) return false;
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
    const json& kw = j["chat_template_kwargs"];
    if (!kw.is_object()) {
      *e = BadField("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      return false;
    }
    for (const auto& [k, v] : kw.items()) {
      if (k != "enable_thinking") {
        *e = BadField("chat_template_kwargs." + k, "'chat_template_kwargs." + k + "' is not supported (enable_thinking)");
        return false;
      }
      if (!v.is_boolean()) {
        *e = BadField("chat_template_kwargs.enable_thinking", "'chat_template_kwargs.enable_thinking' must be a boolean");
        return false;
      }
      out->render.enable_thinking = v.get<bool>();
    }
  }
  return true;
}

std::string TokenLabel(int64_t id, const std::string& text, bool as_token_id) {
  return as_token_id ? "token_id:" + std::to_string(id) : text;
}

size_t CodePoints(const std::string& utf8) {
  size_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}

json CompletionLogprobs(const ChoiceResult& c, size_t begin, size_t end, bool as_token_id, size_t* offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = begin; i < end; ++i) {
    tokens.push_back(TokenLabel(c.token_ids[i], c.token_texts[i], as_token_id));
    lps.push_back(c.logprobs[i]);
    tops.push_back(nullptr);
    offsets.push_back(*offset);
    *offset += CodePoints(c.token_texts[i]);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json ChatLogprobs(const ChoiceResult& c, size_t begin, size_t end, bool as_token_id) {
  json content = json::array();
  for (size_t i = begin; i < end; ++i) {
    const std::string label = TokenLabel(c.token_ids[i], c.token_texts[i], as_token_id);
    json bytes = json::array();
    for (unsigned char b : c.token_texts[i]) bytes.push_back(static_cast<int>(b));
    content.push_back({{"token", label}, {"logprob", c.logprobs[i]}, {"bytes", bytes}, {"top_logprobs", json::array()}});
  }
  return {{"content", content}};
}

json Usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

int64_t PromptTokens(const std::vector<std::vector<int64_t>>& prompt_ids) {
  int64_t n = 0;
  for (const auto& p : prompt_ids) n += static_cast<int64_t>(p.size());
  return n;
}

int64_t CompletionTokens(const std::vector<ChoiceResult>& choices) {
  int64_t n = 0;
  for (const ChoiceResult& c : choices) n += static_cast<int64_t>(c.token_ids.size());
  return n;
}

json Head(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

void AddTokenIds(const SamplingRequest& req, const ChoiceResult& c, const std::vector<std::vector<int64_t>>& prompt_ids,
                 json* choice) {
  if (!req.return_token_ids) return;
  (*choice)["token_ids"] = c.token_ids;
  (*choice)["prompt_token_ids"] = prompt_ids.at(c.prompt);
}

}  // namespace

json CompletionResponse(const ResponseMeta& meta, const CompletionRequest& req, const std::vector<ChoiceResult>& choices,
                        const std::vector<std::vector<int64_t>>& prompt_ids) {
  json out = Head(meta, "text_completion");
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    size_t offset = 0;
    json choice = {{"index", i},
                   {"text", c.text},
                   {"logprobs", req.logprobs ? CompletionLogprobs(c, 0, c.token_ids.size(),
                                                                  req.return_tokens_as_token_ids, &offset)
                                             : json(nullptr)},
                   {"finish_reason", c.finish_reason}};
    AddTokenIds(req, c, prompt_ids, &choice);
    cs.push_back(std::move(choice));
  }
  out["choices"] = std::move(cs);
  out["usage"] = Usage(PromptTokens(prompt_ids), CompletionTokens(choices));
  return out;
}

json ChatResponse(const ResponseMeta& meta, const ChatRequest& req, const std::vector<ChoiceResult>& choices,
                  const std::vector<std::vector<int64_t>>& prompt_ids) {
  json out = Head(meta, "chat.completion");
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i},
                   {"message", {{"role", "assistant"}, {"content", c.text}}},
                   {"logprobs", req.logprobs ? ChatLogprobs(c, 0, c.token_ids.size(), req.return_tokens_as_token_ids)
                                             : json(nullptr)},
                   {"finish_reason", c.finish_reason}};
    AddTokenIds(req, c, prompt_ids, &choice);
    cs.push_back(std::move(choice));
  }
  out["choices"] = std::move(cs);
  out["usage"] = Usage(PromptTokens(prompt_ids), CompletionTokens(choices));
  return out;
}

json CompletionChunk(const ResponseMeta& meta, const CompletionRequest& req, size_t index, const ChoiceResult& c,
                     const std::string& text, size_t begin, size_t end, const std::string& finish_reason,
                     size_t* offset) {
  json choice = {{"index", index},
                 {"text", text},
                 {"logprobs", req.logprobs ? CompletionLogprobs(c, begin, end, req.return_tokens_as_token_ids, offset)
                                           : json(nullptr)},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (req.return_token_ids) choice["token_ids"] = std::vector<int64_t>(c.token_ids.begin() + begin, c.token_ids.begin() + end);
  json out = Head(meta, "text_completion");
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json ChatChunk(const ResponseMeta& meta, const ChatRequest& req, size_t index, const ChoiceResult& c,
               const std::string& text, size_t begin, size_t end, const std::string& finish_reason, bool first) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!text.empty() || first) delta["content"] = text;
  json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", req.logprobs && end > begin
                                  ? ChatLogprobs(c, begin, end, req.return_tokens_as_token_ids)
                                  : json(nullptr)},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (req.return_token_ids) choice["token_ids"] = std::vector<int64_t>(c.token_ids.begin() + begin, c.token_ids.begin() + end);
  json out = Head(meta, "chat.completion.chunk");
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json UsageChunk(const ResponseMeta& meta, const std::string& object, int64_t prompt_tokens, int64_t completion_tokens) {
  json out = Head(meta, object.c_str());
  out["choices"] = json::array();
  out["usage"] = Usage(prompt_tokens, completion_tokens);
  return out;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseEvent(const json& j) { return "data: " + Dump(j) + "\n\n"; }

}  // namespace echelon::serve
