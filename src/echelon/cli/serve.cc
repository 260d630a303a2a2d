// `echelon serve --model DIR --port P [--host H] [--served-model-name NAME] [--api-key KEY]`: an
// OpenAI-compatible HTTP server (serve/openai_server.h) over a Hugging Face model directory or
// an echelon checkpoint. Prints "serving NAME on http://HOST:PORT" once it accepts requests
// (--port 0 picks a free port); SIGINT/SIGTERM stop it. Exit codes: 0 stopped by a signal,
// 2 the model cannot be loaded or the port cannot be bound.
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <iostream>
#include <thread>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/model/hf_model.h"
#include "echelon/serve/openai_server.h"

namespace echelon::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int64_t completion_max_tokens = 16;
  std::string api_key;
};

int RunServe(const ServeArgs& args) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const auto t0 = std::chrono::steady_clock::now();
  Result<model::TextModel> m = model::LoadModelDir(args.model);
  if (!m.ok()) {
    spdlog::error("{}", m.status().message());
    return 2;
  }
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("loaded {} ({}, {} format, {} parameters) in {:.1f} s", args.model, m->architecture, m->format,
               m->config.NumParameters(), load_seconds);
  serve::ServeOptions o;
  o.served_model_name = args.served_model_name;
  o.completion_max_tokens = args.completion_max_tokens;
  o.api_key = args.api_key;
  if (o.api_key.empty())
    if (const char* env = std::getenv("ECHELON_API_KEY")) o.api_key = env;
  o.version = VersionLine();
  Result<std::unique_ptr<serve::OpenAiServer>> server = serve::OpenAiServer::Create(std::move(m).value(), o);
  if (!server.ok()) {
    spdlog::error("{}", server.status().message());
    return 2;
  }
  Status st = server.value()->Start(args.host, args.port);
  if (!st.ok()) {
    spdlog::error("{}", st.message());
    return 2;
  }
  spdlog::info("chat template: {}", server.value()->chat_template().name());
  std::cout << "serving " << server.value()->served_model_name() << " on http://" << args.host << ":"
            << server.value()->port() << std::endl;
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("stopping");
  server.value()->Stop();
  return 0;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  cmd->add_option("--model", args->model, "model directory (Hugging Face layout or echelon checkpoint)")->required();
  cmd->add_option("--host", args->host, "address to listen on (0.0.0.0 for every interface)")->capture_default_str();
  cmd->add_option("--port", args->port, "TCP port; 0 picks a free one")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--served-model-name", args->served_model_name,
                  "the model name clients use (default: the directory's name)");
  cmd->add_option("--default-max-tokens", args->completion_max_tokens,
                  "max_tokens of a /v1/completions request that sets none")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--api-key", args->api_key,
                  "require 'Authorization: Bearer KEY' on every route but /health, /version and /metrics "
                  "(default: $ECHELON_API_KEY; none: open)");
  cmd->callback([args, exit_code] { *exit_code = RunServe(*args); });
}

}  // namespace echelon::cli
