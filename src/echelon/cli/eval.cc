// `echelon eval --checkpoint DIR --data FILE.jsonl`: greedy accuracy of a checkpoint.
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/data/adapter.h"
#include "echelon/model/checkpoint.h"
#include "echelon/rollout/evaluate.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::cli {
namespace {

struct EvalArgs {
  std::string checkpoint;
  std::string data;
  std::string task = "math";
  int64_t max_new_tokens = 8;
  int64_t batch = 256;
};

int RunEval(const EvalArgs& args) {
  Result<std::unique_ptr<data::TaskAdapter>> task = data::CreateAdapter(args.task, {{"eval_file", args.data}});
  if (!task.ok()) {
    spdlog::error("{}", task.status().message());
    return 2;
  }
  Result<model::LoadedCheckpoint> ck = model::LoadCheckpoint(args.checkpoint);
  if (!ck.ok()) {
    spdlog::error("{}", ck.status().message());
    return 2;
  }
  model::SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = args.max_new_tokens;
  sp.eos_token_id = ck->config.eos_token_id >= 0 ? ck->config.eos_token_id : model::CharTokenizer::kEos;
  rollout::ModelPolicy policy(ck->model, ck->tokenizer, sp);
  rollout::EvalResult r;
  try {
    r = rollout::EvaluateGreedy(*task.value(), task.value()->HeldOut(), policy, args.batch);
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", args.data, e.what());
    return 2;
  }
  std::cout << nlohmann::json{{"accuracy", r.accuracy}, {"n", r.n}}.dump() << std::endl;
  return 0;
}

}  // namespace

void AddEvalCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "greedy accuracy of a checkpoint on a JSONL problem set");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint directory (config.json, model.safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("--data", args->data, "JSONL, one {\"question\": \"37+48\", \"answer\": \"85\"} per line")->required();
  cmd->add_option("--task", args->task, "data-plane adapter that reads the file")->capture_default_str();
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "completion length limit")->capture_default_str();
  cmd->add_option("--batch", args->batch, "prompts per generation batch")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([args, exit_code] { *exit_code = RunEval(*args); });
}

}  // namespace echelon::cli
