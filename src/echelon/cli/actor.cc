// `echelon actor --learner HOST:PORT`: a rollout worker. Everything about the run (task, model
// shape, sampling) comes from the learner at registration; the actor brings only its compute.
#include <csignal>
#include <iostream>
#include <thread>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/cli/run_spec.h"
#include "echelon/net/auth.h"
#include "echelon/net/remote_learner.h"
#include "echelon/rollout/actor.h"

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
};

int RunActor(const ActorArgs& args) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  net::RemoteLearnerOptions ro;
  ro.address = args.learner;
  ro.name = args.name;
  ro.tls_ca_file = args.tls_ca;
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
  Result<ActorSetup> setup = ParseRunSpec(spec.value());
  if (!setup.ok()) {
    spdlog::error("{}", setup.status().message());
    return 1;
  }
  auto policy = std::make_unique<rollout::ModelPolicy>(model::Qwen3Model(setup->model), setup->tokenizer,
                                                       setup->sampling);
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
  cmd->callback([args, exit_code] { *exit_code = RunActor(*args); });
}

}  // namespace echelon::cli
