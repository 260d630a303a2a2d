#include "echelon/serve/openai_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <random>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/model/generate.h"
#include "echelon/serve/text_stream.h"

namespace echelon::serve {
namespace {

using nlohmann::json;

constexpr size_t kMaxBodyBytes = 64u << 20;  // token-id prompts of a large batch fit

std::string RandomHex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s) c = kHex[rng() & 15];
  return s;
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void ReplyJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void ReplyError(httplib::Response& res, const ApiError& e) { ReplyJson(res, e.http_status, ErrorBody(e)); }


// The first top-level field where two config.json objects differ, or "".
std::string FirstDifference(const json& a, const json& b) {
  for (const auto& [k, v] : a.items()) {
    if (!b.contains(k) || b[k] != v) return k + " (" + v.dump() + " vs " + (b.contains(k) ? b[k].dump() : "absent") + ")";
  }
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) return k + " (absent vs " + v.dump() + ")";
  return "";
}

// Runs a streaming generation; an exception becomes an error event (the status line is gone).
bool RunStreaming(httplib::DataSink& sink, const std::function<bool()>& run) {
  try {
    return run();
  } catch (const std::exception& ex) {
    ApiError e;
    e.http_status = 500;
    e.type = "internal_error";
    e.message = ex.what();
    spdlog::error("generation failed: {}", ex.what());
    const std::string event = SseEvent(ErrorBody(e));
    sink.write(event.data(), event.size());
    return false;
  }
}

}  // namespace

struct OpenAiServer::Row {
  Row(size_t prompt_index, TextStream s) : stream(std::move(s)) { result.prompt = prompt_index; }
  ChoiceResult result;
  TextStream stream;
  bool done = false;
  size_t sent = 0;    // tokens already streamed
  size_t offset = 0;  // completions text_offset of the next streamed token
};

struct OpenAiServer::Prepared {
  std::vector<std::vector<int64_t>> prompt_ids;   // per prompt
  std::vector<std::vector<int64_t>> row_prompts;  // per row (prompt x n)
  std::vector<Row> rows;
  std::set<int64_t> stop_ids;    // end a row
  std::set<int64_t> hidden_ids;  // show no text: the model's end ids (even with ignore_eos) and stop_ids
  model::SamplingParams sampling;
};

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::Create(model::TextModel model, ServeOptions options) {
  std::unique_ptr<OpenAiServer> s(new OpenAiServer());
  s->name_ = !options.served_model_name.empty() ? options.served_model_name
                                                 : std::filesystem::path(model.dir).filename().string();
  if (s->name_.empty()) s->name_ = std::filesystem::path(model.dir).parent_path().filename().string();
  if (s->name_.empty()) s->name_ = "model";
  const std::string& raw = model.chat_template;
  const std::string bos = model.vocab ? model.vocab->bos_text() : "";
  Result<tokenizer::ChatTemplate> t = tokenizer::ChatTemplate::FromRaw(raw, bos);
  if (!t.ok()) return t.status().WithContext(model.dir.empty() ? "chat template" : model.dir + " chat template");
  s->template_ = t.value();
  if (model.vocab) s->text_prefix_ = model.vocab->prompt_prefix();
  s->weights_dir_ = model.dir;
  s->model_ = std::move(model);
  s->options_ = std::move(options);
  if (!s->options_.loader) s->options_.loader = [](const std::string& dir) { return model::LoadModelDir(dir); };
  s->created_ = NowSeconds();
  using obs::MetricType;
  obs::MetricsRegistry& m = s->metrics_;
  m.Describe("echelon_serve_requests_total", MetricType::kCounter, "HTTP requests answered, by route and status");
  m.Describe("echelon_serve_requests_running", MetricType::kGauge, "generation requests running or waiting for the model");
  m.Describe("echelon_serve_prompt_tokens_total", MetricType::kCounter, "prompt tokens of generation requests");
  m.Describe("echelon_serve_generation_tokens_total", MetricType::kCounter, "tokens generated");
  m.Describe("echelon_serve_generation_seconds_total", MetricType::kCounter, "seconds spent generating");
  m.Describe("echelon_serve_weight_updates_total", MetricType::kCounter, "weights swapped in by /update_weights_from_disk");
  for (const char* name : {"echelon_serve_requests_running", "echelon_serve_prompt_tokens_total",
                           "echelon_serve_generation_tokens_total", "echelon_serve_generation_seconds_total",
                           "echelon_serve_weight_updates_total"})
    m.Set(name, 0);
  return s;
}

OpenAiServer::~OpenAiServer() { Stop(); }

Status OpenAiServer::Start(const std::string& host, int port) {
  http_ = std::make_unique<httplib::Server>();
  http_->set_payload_max_length(kMaxBodyBytes);
  http_->Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { HandleCompletions(q, r); });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { HandleChat(q, r); });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) { HandleModels(r); });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& r) { ReplyJson(r, 200, {{"status", "ok"}}); });
  http_->Get("/version", [this](const httplib::Request&, httplib::Response& r) {
    ReplyJson(r, 200, {{"version", options_.version}});
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    r.set_content(metrics_.Render(), obs::kPrometheusContentType);
  });
  http_->Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) { HandleTokenize(q, r); });
  http_->Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) { HandleDetokenize(q, r); });
  http_->set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& r) {
    if (Authorized(q)) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = 401;
    e.type = "authentication_error";
    e.message = "a valid API key is required: send 'Authorization: Bearer KEY'";
    ReplyError(r, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  // After every request (the response is written): the counts of GET /metrics.
  http_->set_logger([this](const httplib::Request& q, const httplib::Response& r) {
    metrics_.Add("echelon_serve_requests_total", 1, {{"route", r.status == 404 ? "other" : q.path},
                                                    {"status", std::to_string(r.status)}});
  });
  http_->Post("/update_weights_from_disk",
              [this](const httplib::Request& q, httplib::Response& r) { HandleUpdateWeights(q, r); });
  http_->set_error_handler([](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return;
    ApiError e;
    e.http_status = r.status;
    e.type = r.status == 404 ? "not_found_error" : "invalid_request_error";
    e.message = r.status == 404 ? "no route " + q.method + " " + q.path : "HTTP " + std::to_string(r.status);
    ReplyError(r, e);
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    ApiError e;
    e.http_status = 500;
    e.type = "internal_error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      e.message = ex.what();
    } catch (...) {
      e.message = "unknown error";
    }
    ReplyError(r, e);
  });
  port_ = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) return Internal("cannot listen on " + host + ":" + std::to_string(port) + " (in use?)");
  listen_.Start(http_.get());
  return Status::Ok();
}

void OpenAiServer::Stop() { listen_.Stop(); }

void OpenAiServer::Wait() { listen_.Wait(); }

void OpenAiServer::HandleModels(httplib::Response& res) const {
  std::string root;
  {
    std::lock_guard<std::mutex> lock(dir_mu_);
    root = weights_dir_;
  }
  json m = {{"id", name_},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "echelon"},
            {"root", root},
            {"max_model_len", model_.config.max_position_embeddings}};
  ReplyJson(res, 200, {{"object", "list"}, {"data", json::array({m})}});
}

bool OpenAiServer::CheckModel(const SamplingRequest& r, ApiError* e) const {
  if (r.model.empty() || r.model == name_) return true;
  e->http_status = 404;
  e->param = "model";
  e->code = "model_not_found";
  e->message = "The model `" + r.model + "` does not exist; this server serves `" + name_ + "`.";
  return false;
}

std::string OpenAiServer::DecodeIds(const std::vector<int64_t>& ids) const {
  if (!model_.vocab || ids.empty()) return "";
  const model::TextCodec& codec = model_.vocab->codec();
  Result<std::string> text = codec.Decode(ids);
  if (text.ok()) return text.value();
  // Ids the model can produce but the tokenizer lacks (vocab_size above the tokenizer's) show
  // as nothing.
  std::vector<int64_t> known;
  for (int64_t id : ids)
    if (codec.Decode({id}).ok()) known.push_back(id);
  Result<std::string> rest = codec.Decode(known);
  return rest.ok() ? rest.value() : "";
}

bool OpenAiServer::Encode(const std::string& text, bool with_prefix, const std::string& param,
                          std::vector<int64_t>* ids, ApiError* e) const {
  if (!model_.vocab) {
    *e = BadField(param, "this model has no tokenizer (no tokenizer.json in " + model_.dir +
                             "): send the prompt as token ids to /v1/completions");
    return false;
  }
  Result<std::vector<int64_t>> enc = model_.vocab->Encode(text);
  if (!enc.ok()) {
    *e = BadField(param, "'" + param + "' cannot be tokenized: " + enc.status().message());
    return false;
  }
  *ids = with_prefix ? text_prefix_ : std::vector<int64_t>{};
  ids->insert(ids->end(), enc.value().begin(), enc.value().end());
  return true;
}

bool OpenAiServer::Prepare(const SamplingRequest& r, std::vector<std::vector<int64_t>> prompt_ids,
                           int64_t default_max_tokens, Prepared* p, ApiError* e) const {
  const int64_t vocab = model_.config.vocab_size, context = model_.config.max_position_embeddings;
  int64_t longest = 0;
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    const std::string where = prompt_ids.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt";
    if (prompt_ids[i].empty()) {
      *e = BadField("prompt", where + " is empty: at least one token is needed");
      return false;
    }
    for (int64_t id : prompt_ids[i]) {
      if (id >= vocab) {
        *e = BadField("prompt", where + " holds token id " + std::to_string(id) + ", outside the vocabulary (size " +
                                    std::to_string(vocab) + ")");
        return false;
      }
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt_ids[i].size()));
  }
  const int64_t max_tokens = r.max_tokens.value_or(default_max_tokens > 0 ? default_max_tokens : context - longest);
  if (longest + max_tokens > context) {
    *e = BadField(r.max_tokens ? "max_tokens" : "prompt",
                  "this model's maximum context length is " + std::to_string(context) + " tokens; the request needs " +
                      std::to_string(longest + max_tokens) + " (" + std::to_string(longest) + " in the prompt, " +
                      std::to_string(max_tokens) + " to generate)");
    return false;
  }
  for (int64_t id : r.stop_token_ids) {
    if (id >= vocab) {
      *e = BadField("stop_token_ids", "stop_token_ids holds " + std::to_string(id) + ", outside the vocabulary (size " +
                                          std::to_string(vocab) + ")");
      return false;
    }
  }
  model::SamplingParams& sp = p->sampling;
  sp.temperature = r.temperature.value_or(model_.temperature);
  sp.top_p = r.top_p.value_or(model_.top_p);
  sp.top_k = r.top_k.value_or(model_.top_k);
  sp.min_p = r.min_p.value_or(model_.min_p);
  sp.repetition_penalty = r.repetition_penalty.value_or(model_.repetition_penalty);
  sp.presence_penalty = r.presence_penalty;
  sp.frequency_penalty = r.frequency_penalty;
  sp.min_tokens = std::min(r.min_tokens, max_tokens);
  sp.max_new_tokens = max_tokens;
  // The model's end ids: the first is EOS, the rest stop tokens; ignore_eos ignores them all
  // (the request's own stop_token_ids still end a row).
  sp.ignore_eos = r.ignore_eos;
  sp.eos_token_id = model_.stop_ids.empty() ? -1 : model_.stop_ids[0];
  sp.stop_token_ids.clear();
  p->stop_ids.clear();
  if (!r.ignore_eos) {
    for (size_t i = 1; i < model_.stop_ids.size(); ++i) sp.stop_token_ids.push_back(model_.stop_ids[i]);
    p->stop_ids.insert(model_.stop_ids.begin(), model_.stop_ids.end());
  }
  sp.stop_token_ids.insert(sp.stop_token_ids.end(), r.stop_token_ids.begin(), r.stop_token_ids.end());
  sp.seed = r.seed ? *r.seed : std::random_device{}() * 0x100000000ULL + std::random_device{}();
  p->stop_ids.insert(r.stop_token_ids.begin(), r.stop_token_ids.end());
  p->hidden_ids = p->stop_ids;
  p->hidden_ids.insert(model_.stop_ids.begin(), model_.stop_ids.end());
  p->prompt_ids = std::move(prompt_ids);
  const auto decode = [this](const std::vector<int64_t>& ids) { return DecodeIds(ids); };
  for (size_t i = 0; i < p->prompt_ids.size(); ++i) {
    for (int k = 0; k < r.n; ++k) {
      p->row_prompts.push_back(p->prompt_ids[i]);
      p->rows.emplace_back(i, TextStream(decode, r.stop, p->hidden_ids));
    }
  }
  return true;
}

bool OpenAiServer::Run(Prepared* p, const std::function<bool(size_t row, const std::string& delta)>& on_tokens) {
  bool keep_going = true;
  auto step = [&](const std::vector<int64_t>& rows, const std::vector<int64_t>& tokens, const std::vector<float>& lps) {
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t i = static_cast<size_t>(rows[k]);
      Row& row = p->rows[i];
      if (row.done) continue;
      row.result.token_ids.push_back(tokens[k]);
      row.result.logprobs.push_back(lps[k]);
      row.result.token_texts.push_back(DecodeIds({tokens[k]}));
      std::string delta = row.stream.Push(tokens[k]);
      if (row.stream.stopped() || p->stop_ids.count(tokens[k]) > 0) {
        delta += row.stream.Finish();
        row.done = true;
        row.result.finish_reason = "stop";
      }
      if (keep_going && on_tokens && !on_tokens(i, delta)) keep_going = false;
    }
    bool all_done = true;
    for (const Row& row : p->rows) all_done = all_done && row.done;
    return keep_going && !all_done;
  };
  const auto t0 = std::chrono::steady_clock::now();
  metrics_.Add("echelon_serve_requests_running", 1);
  try {
    std::lock_guard<std::mutex> lock(model_mu_);
    model_.model->eval();
    model::Generate(model_.model, p->row_prompts, p->sampling, step);
  } catch (...) {
    metrics_.Add("echelon_serve_requests_running", -1);
    throw;
  }
  metrics_.Add("echelon_serve_requests_running", -1);
  int64_t prompt_tokens = 0, generated = 0;
  for (const auto& ids : p->row_prompts) prompt_tokens += static_cast<int64_t>(ids.size());
  for (const Row& row : p->rows) generated += static_cast<int64_t>(row.result.token_ids.size());
  metrics_.Add("echelon_serve_prompt_tokens_total", static_cast<double>(prompt_tokens));
  metrics_.Add("echelon_serve_generation_tokens_total", static_cast<double>(generated));
  metrics_.Add("echelon_serve_generation_seconds_total",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  for (size_t i = 0; i < p->rows.size(); ++i) {
    Row& row = p->rows[i];
    if (row.done) {
      row.result.text = row.stream.text();
      continue;
    }
    const std::string delta = row.stream.Finish();
    row.done = true;
    row.result.finish_reason = "length";
    row.result.text = row.stream.text();
    if (keep_going && on_tokens && !on_tokens(i, delta)) keep_going = false;
  }
  return keep_going;
}

void OpenAiServer::HandleCompletions(const httplib::Request& http_req, httplib::Response& res) {
  auto req = std::make_shared<CompletionRequest>();
  ApiError e;
  if (!ParseCompletionRequest(http_req.body, req.get(), &e) || !CheckModel(*req, &e)) return ReplyError(res, e);
  std::vector<std::vector<int64_t>> prompt_ids;
  for (size_t i = 0; i < req->prompts.size(); ++i) {
    const PromptInput& in = req->prompts[i];
    std::vector<int64_t> ids = in.ids;
    if (!in.is_ids && !Encode(in.text, true, "prompt", &ids, &e)) return ReplyError(res, e);
    prompt_ids.push_back(std::move(ids));
  }
  auto p = std::make_shared<Prepared>();
  if (!Prepare(*req, std::move(prompt_ids), options_.completion_max_tokens, p.get(), &e)) return ReplyError(res, e);
  const ResponseMeta meta{"cmpl-" + RandomHex(24), NowSeconds(), name_};
  if (!req->stream) {
    Run(p.get(), {});
    std::vector<ChoiceResult> choices;
    for (Row& row : p->rows) choices.push_back(std::move(row.result));
    return ReplyJson(res, 200, CompletionResponse(meta, *req, choices, p->prompt_ids));
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, req, p, meta](size_t, httplib::DataSink& sink) {
    auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
    const bool detail = req->logprobs.has_value() || req->return_token_ids;
    const bool finished = RunStreaming(sink, [&] { return Run(p.get(), [&](size_t i, const std::string& delta) {
      Row& row = p->rows[i];
      if (delta.empty() && !row.done && !detail) return sink.is_writable();
      const size_t end = row.result.token_ids.size();
      const json chunk = CompletionChunk(meta, *req, i, row.result, delta, row.sent, end,
                                         row.done ? row.result.finish_reason : "", &row.offset);
      row.sent = end;
      return write(SseEvent(chunk));
    }); });
    if (finished) {
      if (req->include_usage) {
        int64_t prompt_tokens = 0, completion_tokens = 0;
        for (const auto& ids : p->prompt_ids) prompt_tokens += static_cast<int64_t>(ids.size());
        for (const Row& row : p->rows) completion_tokens += static_cast<int64_t>(row.result.token_ids.size());
        write(SseEvent(UsageChunk(meta, "text_completion", prompt_tokens, completion_tokens)));
      }
      write("data: [DONE]\n\n");
    }
    sink.done();
    return true;
  });
}

void OpenAiServer::HandleChat(const httplib::Request& http_req, httplib::Response& res) {
  auto req = std::make_shared<ChatRequest>();
  ApiError e;
  if (!ParseChatRequest(http_req.body, req.get(), &e) || !CheckModel(*req, &e)) return ReplyError(res, e);
  Result<std::string> text = template_.Render(req->messages, req->render);
  if (!text.ok()) return ReplyError(res, BadField("messages", text.status().message()));
  std::vector<int64_t> ids;
  const bool plain = template_.format() == tokenizer::ChatFormat::kPlain;
  if (!Encode(text.value(), plain, "messages", &ids, &e)) return ReplyError(res, e);
  auto p = std::make_shared<Prepared>();
  if (!Prepare(*req, {ids}, 0, p.get(), &e)) {
    if (e.param == "prompt") e.param = "messages";
    return ReplyError(res, e);
  }
  const ResponseMeta meta{"chatcmpl-" + RandomHex(24), NowSeconds(), name_};
  if (!req->stream) {
    Run(p.get(), {});
    std::vector<ChoiceResult> choices;
    for (Row& row : p->rows) choices.push_back(std::move(row.result));
    return ReplyJson(res, 200, ChatResponse(meta, *req, choices, p->prompt_ids));
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, req, p, meta](size_t, httplib::DataSink& sink) {
    auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
    for (size_t i = 0; i < p->rows.size(); ++i) {
      if (!write(SseEvent(ChatChunk(meta, *req, i, p->rows[i].result, "", 0, 0, "", true)))) {
        sink.done();
        return true;
      }
    }
    const bool detail = req->logprobs || req->return_token_ids;
    const bool finished = RunStreaming(sink, [&] { return Run(p.get(), [&](size_t i, const std::string& delta) {
      Row& row = p->rows[i];
      if (delta.empty() && !row.done && !detail) return sink.is_writable();
      const size_t end = row.result.token_ids.size();
      const json chunk =
          ChatChunk(meta, *req, i, row.result, delta, row.sent, end, row.done ? row.result.finish_reason : "", false);
      row.sent = end;
      return write(SseEvent(chunk));
    }); });
    if (finished) {
      if (req->include_usage) {
        int64_t completion_tokens = 0;
        for (const Row& row : p->rows) completion_tokens += static_cast<int64_t>(row.result.token_ids.size());
        write(SseEvent(UsageChunk(meta, "chat.completion.chunk", static_cast<int64_t>(p->prompt_ids[0].size()),
                                  completion_tokens)));
      }
      write("data: [DONE]\n\n");
    }
    sink.done();
    return true;
  });
}

void OpenAiServer::HandleUpdateWeights(const httplib::Request& http_req, httplib::Response& res) {
  auto fail = [&res](int status, const std::string& message) {
    spdlog::warn("update_weights_from_disk refused: {}", message);
    ReplyJson(res, status, {{"success", false}, {"message", message}});
  };
  json body;
  try {
    body = json::parse(http_req.body);
  } catch (const json::exception& ex) {
    return fail(400, std::string("the request body is not valid JSON: ") + ex.what());
  }
  if (!body.is_object() || !body.contains("model_path") || !body["model_path"].is_string() ||
      body["model_path"].get<std::string>().empty()) {
    return fail(400, "'model_path' (a model directory) is required");
  }
  const std::string dir = body["model_path"].get<std::string>();
  const auto t0 = std::chrono::steady_clock::now();
  Result<model::TextModel> loaded = options_.loader(dir);
  if (!loaded.ok()) return fail(400, "cannot load " + dir + ": " + loaded.status().message() + "; the old weights stay");
  if (loaded->architecture != model_.architecture) {
    return fail(400, dir + " is a " + loaded->architecture + ", the served model a " + model_.architecture +
                         "; the old weights stay");
  }
  const std::string diff = FirstDifference(model_.config.ToJson(), loaded->config.ToJson());
  if (!diff.empty()) {
    return fail(400, dir + " does not match the served model: config.json field " + diff + "; the old weights stay");
  }
  {
    std::lock_guard<std::mutex> lock(model_mu_);
    model_.model = loaded->model;
  }
  {
    std::lock_guard<std::mutex> lock(dir_mu_);
    weights_dir_ = dir;
  }
  metrics_.Add("echelon_serve_weight_updates_total", 1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("weights updated from {} in {:.2f} s", dir, seconds);
  ReplyJson(res, 200, {{"success", true}, {"message", "weights updated from " + dir}});
}

bool OpenAiServer::Authorized(const httplib::Request& req) const {
  if (options_.api_key.empty() || req.path == "/health" || req.path == "/version" || req.path == "/metrics") return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string expected = "Bearer " + options_.api_key;
  if (header.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < header.size(); ++i) diff |= static_cast<unsigned char>(header[i] ^ expected[i]);
  return diff == 0;
}

void OpenAiServer::HandleTokenize(const httplib::Request& http_req, httplib::Response& res) {
  json j;
  ApiError e;
  if (!ParseBody(http_req.body, &j, &e)) return ReplyError(res, e);
  for (const auto& [k, v] : j.items()) {
    if (k != "model" && k != "prompt" && k != "messages" && k != "add_special_tokens" && k != "add_generation_prompt")
      return ReplyError(res, BadField(k, "'" + k + "' is not supported by /tokenize"));
  }
  if (j.contains("model") && !j["model"].is_null()) {
    SamplingRequest r;
    r.model = j["model"].is_string() ? j["model"].get<std::string>() : "";
    if (!j["model"].is_string()) return ReplyError(res, BadField("model", "'model' must be a string"));
    if (!CheckModel(r, &e)) return ReplyError(res, e);
  }
  bool special = true;
  if (j.contains("add_special_tokens") && !j["add_special_tokens"].is_null()) {
    if (!j["add_special_tokens"].is_boolean())
      return ReplyError(res, BadField("add_special_tokens", "'add_special_tokens' must be a boolean"));
    special = j["add_special_tokens"].get<bool>();
  }
  std::vector<int64_t> ids;
  if (j.contains("messages")) {
    // The chat form: the messages as /v1/chat/completions renders them.
    json chat = {{"messages", j["messages"]}};
    if (j.contains("add_generation_prompt")) chat["add_generation_prompt"] = j["add_generation_prompt"];
    ChatRequest req;
    if (!ParseChatRequest(chat.dump(), &req, &e)) return ReplyError(res, e);
    Result<std::string> text = template_.Render(req.messages, req.render);
    if (!text.ok()) return ReplyError(res, BadField("messages", text.status().message()));
    const bool plain = template_.format() == tokenizer::ChatFormat::kPlain;
    if (!Encode(text.value(), plain && special, "messages", &ids, &e)) return ReplyError(res, e);
  } else {
    if (!j.contains("prompt") || !j["prompt"].is_string())
      return ReplyError(res, BadField("prompt", "'prompt' (a string) or 'messages' is required"));
    if (!Encode(j["prompt"].get<std::string>(), special, "prompt", &ids, &e)) return ReplyError(res, e);
  }
  ReplyJson(res, 200, {{"count", ids.size()}, {"max_model_len", model_.config.max_position_embeddings}, {"tokens", ids}});
}

void OpenAiServer::HandleDetokenize(const httplib::Request& http_req, httplib::Response& res) {
  json j;
  ApiError e;
  if (!ParseBody(http_req.body, &j, &e)) return ReplyError(res, e);
  for (const auto& [k, v] : j.items())
    if (k != "model" && k != "tokens") return ReplyError(res, BadField(k, "'" + k + "' is not supported by /detokenize"));
  if (!j.contains("tokens") || !j["tokens"].is_array())
    return ReplyError(res, BadField("tokens", "'tokens' (an array of token ids) is required"));
  std::vector<int64_t> ids;
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    const json& v = j["tokens"][i];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
        v.get<int64_t>() >= model_.config.vocab_size)
      return ReplyError(res, BadField("tokens", "tokens[" + std::to_string(i) + "] is not a token id of this model (0.." +
                                                    std::to_string(model_.config.vocab_size - 1) + "): " + v.dump()));
    ids.push_back(v.get<int64_t>());
  }
  if (!model_.vocab) return ReplyError(res, BadField("tokens", "this model has no tokenizer (no tokenizer.json)"));
  ReplyJson(res, 200, {{"prompt", DecodeIds(ids)}});
}

}  // namespace echelon::serve
