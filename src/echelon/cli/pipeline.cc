// Pipelines of processes, each holding a range of a model's layers (model/pipeline.h):
//
//   echelon stage --model DIR --layers 2:4 --listen 0.0.0.0:50062
//   echelon stage --model DIR --layers 1:2 --listen 0.0.0.0:50061 --next host2:50062
//   echelon generate --model DIR --layers 0:1 --next host1:50061 --prompts p.jsonl --micro-batches 2
//
// `stage` serves layers [A, B) (A > 0) to the stage before it and prints "stage layers A-B
// listening on HOST:PORT" once it accepts calls; SIGINT/SIGTERM stop it. `generate` samples
// completions of a JSONL file of prompts ({"ids": [...]} or {"text": "..."} with a tokenizer),
// with the whole model, or as the first stage of a pipeline (--layers 0:K --next ADDR); it
// writes one JSON line per row ({"row", "tokens", "logprobs", "eos"}) and, on stderr, a summary
// with tokens_per_s. Exit codes: 0 done (or stopped by a signal), 2 bad arguments, input or
// model, 1 generation failed (a stage unreachable or failing).
#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/common/fs.h"
#include "echelon/model/hf_model.h"
#include "echelon/model/pipeline.h"
#include "echelon/net/auth.h"
#include "echelon/net/pipeline_stage.h"

namespace echelon::cli {

std::optional<std::pair<int64_t, int64_t>> ParseIntPair(const std::string& text, char sep) {
  const size_t at = text.find(sep);
  if (at == std::string::npos) return std::nullopt;
  try {
    size_t used = 0;
    const int64_t a = std::stoll(text.substr(0, at), &used);
    if (used != at) return std::nullopt;
    const int64_t b = std::stoll(text.substr(at + 1), &used);
    if (used != text.size() - at - 1) return std::nullopt;
    return std::make_pair(a, b);
  } catch (const std::exception&) {  // not a number, or out of range
    return std::nullopt;
  }
}

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// "A:B" -> [A, B).
Result<model::LayerRange> ParseLayers(const std::string& text, int64_t layers) {
  const std::optional<std::pair<int64_t, int64_t>> pair = ParseIntPair(text, ':');
  if (!pair) return InvalidArgument("--layers \"" + text + "\": expected A:B, the layers [A, B)");
  const model::LayerRange r{pair->first, pair->second};
  if (r.first < 0 || r.first >= r.last || r.last > layers)
    return InvalidArgument("--layers " + text + ": the model has layers 0.." + std::to_string(layers - 1) +
                           " (A:B holds A..B-1)");
  return r;
}

// The stage of DIR holding `layers` ("A:B"; the first stage's must start at 0, a later one's
// not); the whole model's tensors are dropped once the range's are in.
Result<model::Qwen3Model> LoadStage(const std::string& dir, const std::string& layers, bool first,
                                    model::TextModel* text) {
  const std::string config_path = dir + "/config.json";
  ECHELON_ASSIGN_OR_RETURN(const std::string config_text, ReadFile(config_path));
  ECHELON_ASSIGN_OR_RETURN(const model::ModelConfig config, model::ModelConfig::FromJsonText(config_text, config_path));
  ECHELON_ASSIGN_OR_RETURN(const model::LayerRange range, ParseLayers(layers, config.num_hidden_layers));
  if (first && range.first != 0) return InvalidArgument("--layers " + layers + ": the first stage holds 0:K");
  if (!first && range.first == 0)
    return InvalidArgument("--layers " + layers + ": layer 0 is the first stage's (`echelon generate --layers 0:K`)");
  ECHELON_ASSIGN_OR_RETURN(*text, model::LoadModelDir(dir));
  model::Qwen3Model stage(text->config, range);
  ECHELON_RETURN_IF_ERROR(stage->LoadStateDict(stage->Own(text->model->StateDict()), dir));
  text->model = model::Qwen3Model(nullptr);
  return stage;
}

int Fail(const Status& s, int code) {
  spdlog::error("{}", s.message());
  return code;
}

Result<std::string> Token(const std::string& file) {
  if (file.empty()) return std::string();
  return net::LoadToken(file);
}

struct StageArgs {
  std::string model, layers, listen = "127.0.0.1:0", next, token_file;
  double timeout = 300, lane_idle_timeout = 300;
  int64_t max_lanes = 64;
};

int RunStage(const StageArgs& args) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  model::TextModel text;
  Result<model::Qwen3Model> stage = LoadStage(args.model, args.layers, /*first=*/false, &text);
  if (!stage.ok()) return Fail(stage.status(), 2);
  Result<std::string> token = Token(args.token_file);
  if (!token.ok()) return Fail(token.status(), 2);
  const model::LayerRange range = stage.value()->range();
  std::unique_ptr<net::RemoteStage> next;
  if (!args.next.empty()) next = net::RemoteStage::Connect(args.next, token.value(), args.timeout).value();
  model::StageServer server(stage.value(), next.get(), args.lane_idle_timeout);
  net::StageServiceOptions o;
  o.listen = args.listen;
  o.token = token.value();
  o.max_lanes = args.max_lanes;
  Result<std::unique_ptr<net::StageService>> service = net::StageService::Start(&server, text.config, o);
  if (!service.ok()) return Fail(service.status(), 2);
  const std::string host = args.listen.substr(0, args.listen.rfind(':'));
  std::cout << "stage layers " << range.first << "-" << range.last - 1 << " listening on " << host << ":"
            << service.value()->port() << (next ? " -> " + args.next : std::string(" (last)")) << std::endl;
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("stopping");
  return 0;
}

struct GenerateArgs {
  std::string model, prompts, layers, next, token_file;
  int64_t group_size = 1, max_new_tokens = 16, micro_batches = 1, slots = 0;
  double temperature = 1.0, top_p = 1.0, timeout = 300;
  uint64_t seed = 0;
};

// The rows: each line's prompt, group_size times.
Result<std::vector<std::vector<int64_t>>> ReadPrompts(const GenerateArgs& args, const model::TextModel& text) {
  std::ifstream in(args.prompts);
  if (!in) return NotFound(args.prompts + ": cannot open");
  std::vector<std::vector<int64_t>> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = args.prompts + ":" + std::to_string(n);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    std::vector<int64_t> ids;
    if (j.is_object() && j.contains("ids") && j["ids"].is_array()) {
      for (const auto& v : j["ids"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= text.config.vocab_size)
          return InvalidArgument(where + ": \"ids\" must hold token ids in 0.." + std::to_string(text.config.vocab_size - 1));
        ids.push_back(v.get<int64_t>());
      }
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      if (!text.vocab) return InvalidArgument(where + ": \"text\" needs a tokenizer.json in " + text.dir);
      ECHELON_ASSIGN_OR_RETURN(ids, text.vocab->Encode(j["text"].get<std::string>()));
    } else {
      return InvalidArgument(where + ": expected {\"ids\": [...]} or {\"text\": \"...\"}");
    }
    if (ids.empty()) return InvalidArgument(where + ": empty prompt");
    if (static_cast<int64_t>(ids.size()) + args.max_new_tokens > text.config.max_position_embeddings)
      return InvalidArgument(where + ": " + std::to_string(ids.size()) + " prompt tokens + --max-new-tokens exceed " +
                             std::to_string(text.config.max_position_embeddings) + " positions");
    for (int64_t g = 0; g < args.group_size; ++g) rows.push_back(ids);
  }
  if (rows.empty()) return InvalidArgument(args.prompts + ": no prompts");
  return rows;
}

int RunGenerate(const GenerateArgs& args) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  if (args.layers.empty() != args.next.empty())
    return Fail(InvalidArgument("--layers 0:K and --next ADDR go together (the first stage of a pipeline)"), 2);
  model::TextModel text;
  Result<model::Qwen3Model> first = model::Qwen3Model(nullptr);
  if (args.next.empty()) {
    Result<model::TextModel> whole = model::LoadModelDir(args.model);
    if (!whole.ok()) return Fail(whole.status(), 2);
    text = std::move(whole).value();
    first = text.model;
  } else {
    first = LoadStage(args.model, args.layers, /*first=*/true, &text);
    if (!first.ok()) return Fail(first.status(), 2);
  }
  Result<std::vector<std::vector<int64_t>>> rows = ReadPrompts(args, text);
  if (!rows.ok()) return Fail(rows.status(), 2);
  Result<std::string> token = Token(args.token_file);
  if (!token.ok()) return Fail(token.status(), 2);
  model::SamplingParams p;
  p.temperature = args.temperature;
  p.top_p = args.top_p;
  p.max_new_tokens = args.max_new_tokens;
  p.eos_token_id = text.config.eos_token_id;
  p.stop_token_ids = text.stop_ids;
  p.seed = args.seed;
  p.slots = args.slots;
  const model::StepCallback stop_on_signal = [](const std::vector<int64_t>&, const std::vector<int64_t>&,
                                         const std::vector<float>&) { return !g_stop.load(); };
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<model::Completion>> out = std::vector<model::Completion>();
  if (args.next.empty()) {
    out = model::Generate(first.value(), rows.value(), p, stop_on_signal);
  } else {
    std::unique_ptr<net::RemoteStage> next = net::RemoteStage::Connect(args.next, token.value(), args.timeout).value();
    out = model::PipelineGenerate(first.value(), *next, rows.value(), p, args.micro_batches, stop_on_signal);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!out.ok()) return Fail(out.status(), 1);
  int64_t tokens = 0;
  for (size_t r = 0; r < out->size(); ++r) {
    const model::Completion& c = out.value()[r];
    tokens += static_cast<int64_t>(c.tokens.size());
    std::cout << nlohmann::json{{"row", r}, {"tokens", c.tokens}, {"logprobs", c.logprobs}, {"eos", c.finished_eos}}.dump()
              << "\n";
  }
  std::cout.flush();
  std::cerr << nlohmann::json{{"rows", out->size()},
                              {"tokens", tokens},
                              {"seconds", seconds},
                              {"tokens_per_s", tokens / std::max(seconds, 1e-9)},
                              {"stages", args.next.empty() ? "whole" : "pipeline"},
                              {"micro_batches", args.next.empty() ? 1 : args.micro_batches}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

void AddStageCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<StageArgs>();
  CLI::App* cmd = app.add_subcommand("stage", "serve a range of a model's layers as a stage of a rollout pipeline");
  cmd->add_option("--model", args->model, "Hugging Face model directory or echelon checkpoint")->required();
  cmd->add_option("--layers", args->layers, "A:B, the layers [A, B) this stage holds (A > 0)")->required();
  cmd->add_option("--listen", args->listen, "HOST:PORT to serve on (port 0: any free port)")->capture_default_str();
  cmd->add_option("--next", args->next, "HOST:PORT of the next stage (none: this is the last)");
  cmd->add_option("--token-file", args->token_file, "bearer token the previous stage presents, and this one to the next");
  cmd->add_option("--timeout", args->timeout, "seconds a call to the next stage may take")->capture_default_str();
  cmd->add_option("--max-lanes", args->max_lanes, "micro-batch lanes held at once")->capture_default_str();
  cmd->add_option("--lane-idle-timeout", args->lane_idle_timeout,
                  "seconds after which a silent lane (its first stage gone) is closed")
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunStage(*args); });
}

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "sample completions of JSONL prompts, whole or as a pipeline's first stage");
  cmd->add_option("--model", args->model, "Hugging Face model directory or echelon checkpoint")->required();
  cmd->add_option("--prompts", args->prompts, "JSONL: {\"ids\": [...]} or {\"text\": \"...\"} per line")->required();
  cmd->add_option("--group-size", args->group_size, "samples per prompt")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "tokens per completion at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-p", args->top_p)->capture_default_str();
  cmd->add_option("--seed", args->seed)->capture_default_str();
  cmd->add_option("--slots", args->slots, "sequences decoded at once (0: every row)")->capture_default_str();
  cmd->add_option("--layers", args->layers, "0:K, this first stage's layers (with --next)");
  cmd->add_option("--next", args->next, "HOST:PORT of the second stage");
  cmd->add_option("--micro-batches", args->micro_batches, "lanes in flight through the pipeline")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--token-file", args->token_file, "bearer token the stages expect");
  cmd->add_option("--timeout", args->timeout, "seconds a call to the next stage may take")->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunGenerate(*args); });
}

}  // namespace echelon::cli
