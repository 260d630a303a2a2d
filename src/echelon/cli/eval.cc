// `echelon eval --checkpoint DIR --data FILE.jsonl`: greedy accuracy of a checkpoint.
// `echelon eval --checkpoint DIR --task prompts --data RUN/heldout.jsonl --task-option reward=math`:
// the same on a prompts run's held-out rows (accuracy counts rewards >= 1).
// `echelon eval --checkpoint DIR --task poker --opponent NAME --hands N --seed S`: greedy
// duplicate-deal poker evaluation; last line {"mbb_per_hand", "ci95", "hands", ...}.
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/data/adapter.h"
#include "echelon/data/evaluate.h"
#include "echelon/data/poker/duplicate_eval.h"
#include "echelon/data/poker/poker_adapter.h"
#include "echelon/model/checkpoint.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::cli {
namespace {

struct EvalArgs {
  std::string checkpoint;
  std::string data;
  std::string task = "math";
  int64_t max_new_tokens = 8;
  int64_t batch = 256;
  bool chat = false;  // prompts as chat turns, for runs trained with rollout.chat
  std::string answer = "exact";  // math: how completions are matched (task option `answer`)
  std::vector<std::string> task_options;     // KEY=VALUE, as in the config's task: section
  std::string opponent = "calling-station";  // poker only
  int64_t hands = 2000;                      // poker only
  uint64_t seed = 0;                         // poker only
  std::string illegal_action = "fold";       // poker only
  double temperature = 0.0;                  // poker only: 0 = greedy, else sampled with --seed
};

// Greedy duplicate-deal poker evaluation (data/poker/duplicate_eval.h).
int RunPokerEval(const EvalArgs& args, data::Policy& policy) {
  Result<data::poker::OpponentKind> opponent = data::poker::ParseOpponent(args.opponent);
  Result<data::poker::IllegalAction> illegal = data::poker::ParseIllegalAction(args.illegal_action);
  if (!opponent.ok() || !illegal.ok()) {
    spdlog::error("--opponent/--illegal-action: {}", (!opponent.ok() ? opponent.status() : illegal.status()).message());
    return 2;
  }
  data::poker::DuplicateOptions o;
  o.opponent = opponent.value();
  o.hands = args.hands;
  o.seed = args.seed;
  o.illegal = illegal.value();
  o.max_batch = static_cast<size_t>(args.batch);
  Result<data::poker::DuplicateResult> r = data::poker::EvaluateDuplicate(policy, o);
  if (!r.ok()) {
    spdlog::error("{}", r.status().message());
    return 2;
  }
  std::cout << nlohmann::json{{"mbb_per_hand", r->mbb_per_hand}, {"ci95", {r->ci95_lo, r->ci95_hi}},
                              {"hands", r->hands},               {"deals", r->deals},
                              {"opponent", args.opponent},       {"seed", args.seed},
                              {"decisions", r->decisions},       {"illegal", r->illegal},
                              {"temperature", args.temperature}}
                   .dump()
            << std::endl;
  return 0;
}

int RunEval(const EvalArgs& args) {
  const bool poker = args.task == "poker";
  if (!poker && args.data.empty()) {
    spdlog::error("--data is required for task {}", args.task);
    return 2;
  }
  data::AdapterOptions task_options;
  if (!poker) task_options["eval_file"] = args.data;
  if (args.task == "math") task_options["answer"] = args.answer;
  for (const std::string& kv : args.task_options) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      spdlog::error("--task-option {}: expected KEY=VALUE", kv);
      return 2;
    }
    task_options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  Result<std::unique_ptr<data::TaskAdapter>> task = data::CreateAdapter(args.task, task_options);
  if (!task.ok()) {
    spdlog::error("{}", task.status().message());
    return 2;
  }
  Result<model::LoadedCheckpoint> ck = model::LoadCheckpoint(args.checkpoint);
  if (!ck.ok()) {
    spdlog::error("{}", ck.status().message());
    return 2;
  }
  model::Vocabulary vocab = ck->vocab;
  if (args.chat) {
    Result<model::Vocabulary> chat = vocab.WithChat(/*enable_thinking=*/false);
    if (!chat.ok()) {
      spdlog::error("{}: --chat: {}", args.checkpoint, chat.status().message());
      return 2;
    }
    vocab = std::move(chat).value();
  }
  model::SamplingParams sp;
  sp.temperature = poker ? args.temperature : 0.0;
  sp.max_new_tokens = args.max_new_tokens;
  rollout::ModelPolicy policy(ck->model, vocab, sp);
  if (poker) return RunPokerEval(args, policy);
  Result<data::EvalResult> r = data::EvaluateGreedy(*task.value(), task.value()->HeldOut(), policy, args.batch);
  if (!r.ok()) {
    spdlog::error("{}: {}", args.data, r.status().message());
    return 2;
  }
  std::cout << nlohmann::json{{"accuracy", r->accuracy}, {"n", r->n}}.dump() << std::endl;
  return 0;
}

}  // namespace

void AddEvalCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "greedy accuracy of a checkpoint on a JSONL problem set");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint directory (config.json, model.safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("--data", args->data,
                  "JSONL held-out set: a run's heldout.jsonl, or math's {\"question\": \"37+48\", \"answer\": \"85\"} lines");
  cmd->add_option("--task", args->task, "data-plane adapter that reads the file")->capture_default_str();
  cmd->add_option("--opponent", args->opponent, "poker: random, calling-station or tag")->capture_default_str();
  cmd->add_option("--hands", args->hands, "poker: hands played (even; each deal from both seats)")->capture_default_str();
  cmd->add_option("--seed", args->seed, "poker: evaluation deal seed")->capture_default_str();
  cmd->add_option("--illegal-action", args->illegal_action, "poker: fold or call on an illegal answer")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "poker: 0 plays greedily; above 0 samples (seeded by --seed)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "completion length limit")->capture_default_str();
  cmd->add_option("--answer", args->answer, "math: exact, or last_number (the last integer of the completion)")
      ->capture_default_str();
  cmd->add_option("--task-option", args->task_options,
                  "KEY=VALUE task option, repeatable, as in the run's task: section (prompts: reward=math)");
  cmd->add_flag("--chat", args->chat, "prompts as user turns of the model's chat template (runs with rollout.chat)");
  cmd->add_option("--batch", args->batch, "prompts per generation batch")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([args, exit_code] { *exit_code = RunEval(*args); });
}

}  // namespace echelon::cli
