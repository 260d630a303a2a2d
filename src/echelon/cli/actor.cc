// `echelon actor --learner HOST:PORT`: a rollout worker. Everything about the run (task, model
// shape, sampling) comes from the learner at registration; the actor brings only its compute.
// With `--backend openai-http --backend-url URL` it generates through an OpenAI-compatible
// server instead of its own LibTorch model, and hands each snapshot to that server's reload
// hook (rollout/openai_http_policy.h).
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/common/fs.h"
#include "echelon/rollout/run_spec.h"
#include "echelon/net/auth.h"
#include "echelon/net/remote_learner.h"
#include "echelon/rollout/actor.h"
#include "echelon/rollout/model_policy.h"
#include "echelon/rollout/openai_http_policy.h"

namespace echelon::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct ActorArgs {
  std::string learner;
  std::string name = "actor";
  std::string token_file;
  std::string tls_ca;
  double slowdown = 1.0;
  std::string broadcast_listen = "0.0.0.0:0";
  std::string broadcast_advertise;
  bool no_broadcast = false;
  std::string backend = "builtin";
  std::string device = "cpu";  // builtin backend: where the model runs
  std::string backend_url;
  std::string backend_model;
  std::string backend_api_key_file;
  std::string backend_snapshot_dir;
  std::string backend_reload_path = "/update_weights_from_disk";
};

// The openai-http backend, encoding prompts exactly as ModelPolicy does (the run's vocabulary).
Result<std::unique_ptr<rollout::SnapshotPolicy>> HttpPolicy(const ActorArgs& args, const rollout::ActorSetup& setup) {
  rollout::OpenAiHttpOptions o;
  o.url = args.backend_url;
  o.model = args.backend_model;
  o.reload_path = args.backend_reload_path;
  if (!args.backend_api_key_file.empty()) {
    ECHELON_ASSIGN_OR_RETURN(o.api_key, net::LoadToken(args.backend_api_key_file));
  }
  o.snapshot_dir = !args.backend_snapshot_dir.empty()
                       ? args.backend_snapshot_dir
                       : (std::filesystem::temp_directory_path() /
                          ("echelon-" + args.name + "-" + std::to_string(::getpid()) + "-snapshots"))
                             .string();
  nlohmann::json config = setup.model.ToJson();
  if (!setup.vocab.stop_ids().empty()) config["eos_token_id"] = setup.vocab.eos_json();
  o.snapshot_files = setup.vocab.files();
  o.snapshot_files["config.json"] = config.dump(2) + "\n";
  const model::Vocabulary vocab = setup.vocab;
  rollout::PromptEncoder encode = [vocab](const data::PolicyPrompt& p) { return vocab.EncodePrompt(p.system, p.user); };
  rollout::TokenDecoder decode = [vocab](const std::vector<int64_t>& ids) { return vocab.DecodeCompletion(ids); };
  spdlog::info("{}: generating through {} (snapshots written to {})", args.name, o.url, o.snapshot_dir);
  return std::unique_ptr<rollout::SnapshotPolicy>(
      std::make_unique<rollout::OpenAiHttpPolicy>(o, encode, decode, setup.sampling));
}

int RunActor(const ActorArgs& args) {
  if (args.backend == "openai-http" && args.backend_url.empty()) {
    spdlog::error("--backend openai-http needs --backend-url http://HOST:PORT");
    return 2;
  }
  if (Status st = model::CheckDevice(args.device); !st.ok()) {
    spdlog::error("--device: {}", st.message());
    return 2;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  net::RemoteLearnerOptions ro;
  ro.address = args.learner;
  ro.name = args.name;
  if (!args.tls_ca.empty()) {
    // Never fall back to the system's roots: the learner's CA is the one the user named.
    Result<std::string> ca = ReadFile(args.tls_ca);
    if (!ca.ok() || ca->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      spdlog::error("--tls-ca {}: {}", args.tls_ca, ca.ok() ? "no PEM certificate in it" : ca.status().message());
      return 2;
    }
    ro.tls_ca_pem = std::move(ca).value();
  }
  ro.broadcast = !args.no_broadcast;
  ro.broadcast_listen = args.broadcast_listen;
  ro.broadcast_advertise = args.broadcast_advertise;
  if (!args.token_file.empty()) {
    Result<std::string> token = net::LoadToken(args.token_file);
    if (!token.ok()) {
      spdlog::error("--token-file: {}", token.status().message());
      return 2;
    }
    ro.token = token.value();
  }
  net::RemoteLearner learner(ro);
  Result<std::string> spec = learner.Connect(g_stop);
  if (!spec.ok()) {
    spdlog::error("{}", spec.status().message());
    return g_stop.load() ? 0 : 1;
  }
  Result<rollout::ActorSetup> setup = rollout::ParseRunSpec(spec.value());
  if (!setup.ok()) {
    spdlog::error("{}", setup.status().message());
    return 1;
  }
  std::unique_ptr<rollout::SnapshotPolicy> policy;
  if (args.backend == "openai-http") {
    Result<std::unique_ptr<rollout::SnapshotPolicy>> http = HttpPolicy(args, setup.value());
    if (!http.ok()) {
      spdlog::error("{}", http.status().message());
      return 2;
    }
    policy = std::move(http).value();
  } else {
    model::Qwen3Model model(setup->model);
    model->to(at::Device(args.device));
    policy = std::make_unique<rollout::ModelPolicy>(model, setup->vocab, setup->sampling);
  }
  rollout::ActorOptions ao;
  ao.name = args.name;
  ao.seed = setup->seed;
  ao.slowdown = args.slowdown;
  rollout::Actor actor(ao, &learner, &learner, &learner, setup->task.get(), std::move(policy));
  std::atomic<bool> stop{false};
  std::thread worker([&] { actor.Run(stop); });
  while (!g_stop.load() && !learner.done()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  worker.join();
  learner.Close();
  spdlog::info("{} stopping: {} groups, {} tokens submitted, {} refused, {} errors ({})", args.name,
               actor.stats().groups.load(), actor.stats().tokens.load(), actor.stats().refused.load(),
               actor.stats().errors.load(), learner.done() ? "run finished" : "signal");
  return 0;
}

}  // namespace

void AddActorCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ActorArgs>();
  CLI::App* cmd = app.add_subcommand("actor", "rollout worker: joins a learner, generates and submits rollouts");
  cmd->add_option("--learner", args->learner, "learner address HOST:PORT")->required();
  cmd->add_option("--name", args->name, "name shown in the learner's metrics")->capture_default_str();
  cmd->add_option("--token-file", args->token_file, "file holding the bearer token the learner expects");
  cmd->add_option("--tls-ca", args->tls_ca, "PEM of the CA that signed the learner's certificate (enables TLS)");
  cmd->add_option("--slowdown", args->slowdown, "take this many times longer per group (heterogeneity experiments)")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  cmd->add_option("--broadcast-listen", args->broadcast_listen,
                  "where this actor serves snapshot chunks to other actors (peer-assisted broadcast)")
      ->capture_default_str();
  cmd->add_option("--broadcast-advertise", args->broadcast_advertise,
                  "HOST:PORT other actors dial for chunks (default: this host's address toward the learner)");
  cmd->add_flag("--no-broadcast", args->no_broadcast, "pull every snapshot from the learner instead");
  cmd->add_option("--backend", args->backend,
                  "inference backend: builtin (LibTorch in this process) or openai-http (an OpenAI-compatible server)")
      ->check(CLI::IsMember({"builtin", "openai-http"}))
      ->capture_default_str();
  cmd->add_option("--device", args->device, "builtin backend: where the model runs (cpu, cuda, cuda:N)")
      ->capture_default_str();
  cmd->add_option("--backend-url", args->backend_url,
                              "openai-http: the server, http://HOST:PORT (vLLM, SGLang, echelon serve...)");
  cmd->add_option("--backend-model", args->backend_model, "openai-http: the model name in requests (default: the server's first)");
  cmd->add_option("--backend-api-key-file", args->backend_api_key_file, "openai-http: file holding the server's API key");
  cmd->add_option("--backend-snapshot-dir", args->backend_snapshot_dir,
                  "openai-http: where snapshots are written for the server to load (it must read this path)");
  cmd->add_option("--backend-reload-path", args->backend_reload_path,
                  "openai-http: the server's load-weights-from-directory route")
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunActor(*args); });
}

}  // namespace echelon::cli
