// OpenAiServer: an OpenAI-compatible HTTP server over one loaded model (`echelon serve`).
//
//   ECHELON_ASSIGN_OR_RETURN(auto server, OpenAiServer::Create(std::move(text_model), options));
//   ECHELON_RETURN_IF_ERROR(server->Start("127.0.0.1", 8000));
//   server->Wait();
//
// Routes: POST /v1/completions, POST /v1/chat/completions (both with `stream: true` as SSE
// `data: {...}` chunks ending with `data: [DONE]`), GET /v1/models, GET /health, GET /version,
// GET /metrics (Prometheus: requests by route and status, prompt and generated tokens, seconds
// spent, requests running), POST /tokenize ({"prompt"} or chat {"messages"}, as vLLM: replies
// {"count", "max_model_len", "tokens"}), POST /detokenize ({"tokens"} -> {"prompt"}), and
// POST /update_weights_from_disk {"model_path": DIR} (SGLang's name and reply shape
// {"success", "message"}), which loads DIR and swaps the weights in between requests; a model
// of another architecture or shape is refused (HTTP 400, naming the first differing field)
// and the old weights stay. The tokenizer and chat template are the ones loaded at start.
//
// With an API key, every route but /health, /version and /metrics needs the header
// `Authorization: Bearer KEY` (401 otherwise, compared in constant time).
//
// Scheduling: one request at a time holds the model (a mutex); within a request every prompt
// x `n` is one batch of `model::Generate`, so a request with `seed` draws exactly what
// `Generate(model, its prompts, sampling with that seed)` draws locally (the openai-http rollout
// backend relies on this). Streaming runs the generation inside the response, so a client that
// disconnects stops it at the next token.
//
// Prompts: text is encoded with the model's tokenizer after the prefix the model expects (BOS
// for echelon checkpoints and for tokenizers whose post-processor adds one, as Llama-3's does);
// token-id prompts are used as given. Chat messages are rendered with the chat template
// (tokenizer/chat_template.h) and encoded without a prefix (the template writes BOS itself),
// except for the plain fallback, which gets the text prefix. The output text leaves out EOS and
// stop-token ids (their tokens and log-probs are still reported); other special tokens show
// as written.
//
// Thread contract: handlers run on cpp-httplib's worker threads; `model_mu_` guards the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "echelon/common/listen_thread.h"
#include "echelon/common/status.h"
#include "echelon/model/hf_model.h"
#include "echelon/obs/metrics_http.h"
#include "echelon/serve/openai_protocol.h"
#include "echelon/tokenizer/chat_template.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace echelon::serve {

struct ServeOptions {
  std::string served_model_name;       // "" -> the base name of the model directory
  int64_t completion_max_tokens = 16;  // /v1/completions without max_tokens (OpenAI's default)
  std::string api_key;                 // "" -> no authentication
  std::string version;                 // what GET /version reports
  // Loads a directory for /update_weights_from_disk (model::LoadModelDir when empty).
  std::function<Result<model::TextModel>(const std::string&)> loader;
};

class OpenAiServer {
 public:
  // Fails when the model's chat template is not supported (naming it).
  static Result<std::unique_ptr<OpenAiServer>> Create(model::TextModel model, ServeOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Port 0 picks a free port (see port()).
  Status Start(const std::string& host, int port);
  int port() const { return port_; }
  void Stop();
  void Wait();

  const std::string& served_model_name() const { return name_; }
  const tokenizer::ChatTemplate& chat_template() const { return template_; }

 private:
  OpenAiServer() = default;

  struct Prepared;  // one request turned into rows of token ids and sampling parameters
  struct Row;

  void HandleCompletions(const httplib::Request& req, httplib::Response& res);
  void HandleChat(const httplib::Request& req, httplib::Response& res);
  void HandleModels(httplib::Response& res) const;
  void HandleUpdateWeights(const httplib::Request& req, httplib::Response& res);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  bool Authorized(const httplib::Request& req) const;

  bool CheckModel(const SamplingRequest& r, ApiError* e) const;
  bool Encode(const std::string& text, bool with_prefix, const std::string& param, std::vector<int64_t>* ids,
              ApiError* e) const;
  bool Prepare(const SamplingRequest& r, std::vector<std::vector<int64_t>> prompt_ids, int64_t default_max_tokens,
               Prepared* p, ApiError* e) const;
  // Runs the rows; `on_tokens(row)` after each token of a live row. Returns false when a
  // callback asked to stop (client gone). Finishes every row's text and finish_reason.
  bool Run(Prepared* p, const std::function<bool(size_t row, const std::string& delta)>& on_tokens);
  std::string DecodeIds(const std::vector<int64_t>& ids) const;

  model::TextModel model_;
  std::mutex model_mu_;  // guards model_.model (generation and weight swaps)
  mutable std::mutex dir_mu_;  // guards weights_dir_ (read by /v1/models while generation runs)
  std::string weights_dir_;    // where the weights in use came from
  ServeOptions options_;
  std::string name_;
  tokenizer::ChatTemplate template_;
  std::vector<int64_t> text_prefix_;  // ids put before an encoded text prompt
  int64_t created_ = 0;
  obs::MetricsRegistry metrics_;
  std::unique_ptr<httplib::Server> http_;
  ListenThread<httplib::Server> listen_;
  int port_ = 0;
};

}  // namespace echelon::serve
