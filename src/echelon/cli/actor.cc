// `echelon actor --learner HOST:PORT`: a rollout worker. Everything about the run (task, model
// shape, sampling) comes from the learner at registration; the actor brings only its compute.
// With `--backend openai-http --backend-url URL` it generates through an OpenAI-compatible
// server instead of its own LibTorch model, and hands each snapshot to that server's reload
// hook (rollout/openai_http_policy.h).
//
// A pipelined worker (a model too large for one process's memory) is several actor processes
// of one --pipeline name, each given --stage I/K:
//
//   echelon actor --learner L --pipeline gpu-box --stage 2/3 --stage-listen 0.0.0.0:7801
//   echelon actor --learner L --pipeline gpu-box --stage 1/3 --stage-listen 0.0.0.0:7801
//   echelon actor --learner L --pipeline gpu-box --stage 0/3 --micro-batches 2
//
// The learner splits the layers over the stages (by --stage-memory-gb and
// --stage-seconds-per-layer when given), tells each stage where the next one listens, and
// sends each only its layers' tensors. Stage 0 (the head) embeds, samples and takes work;
// the others serve their layers (model/pipeline.h). A stage started again, or a spare of the
// same stage, re-forms the pipeline; groups in flight through a stage that died are re-issued.
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/common/fs.h"
#include "echelon/contract/run_spec.h"
#include "echelon/net/address.h"
#include "echelon/net/auth.h"
#include "echelon/net/pipeline_stage.h"
#include "echelon/net/protocol.h"
#include "echelon/net/remote_learner.h"
#include "echelon/rollout/actor.h"
#include "echelon/rollout/model_policy.h"
#include "echelon/rollout/openai_http_policy.h"
#include "echelon/rollout/pipeline_policy.h"

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
  double broadcast_upload_mbps = 0;
  std::string broadcast_advertise;
  bool no_broadcast = false;
  std::string backend = "builtin";
  std::string device = "cpu";  // builtin backend: where the model runs
  std::string backend_url;
  std::string backend_model;
  std::string backend_api_key_file;
  std::string backend_snapshot_dir;
  std::string backend_reload_path = "/update_weights_from_disk";
  // A stage of a pipelined worker.
  std::string pipeline;
  std::string stage;  // "I/K"
  std::string stage_listen = "0.0.0.0:0";
  std::string stage_advertise;
  int64_t micro_batches = 2;
  double stage_memory_gb = 0;
  double stage_seconds_per_layer = 0;
  double stage_timeout = 60;
  double lane_idle_timeout = 300;
};

// "I/K" -> the role's stage and stages.
Status ParseStage(const std::string& text, net::StageRole* role) {
  const std::optional<std::pair<int64_t, int64_t>> pair = ParseIntPair(text, '/');
  if (!pair) return InvalidArgument("--stage \"" + text + "\": expected I/K, stage I of K");
  if (pair->second < 2 || pair->second > net::kMaxPipelineStages || pair->first < 0 || pair->first >= pair->second)
    return InvalidArgument("--stage " + text + ": K in 2.." + std::to_string(net::kMaxPipelineStages) +
                           ", I in 0..K-1");
  role->stage = static_cast<int>(pair->first);
  role->stages = static_cast<int>(pair->second);
  return Status::Ok();
}

// The openai-http backend, encoding prompts exactly as ModelPolicy does (the run's vocabulary).
Result<std::unique_ptr<rollout::SnapshotPolicy>> HttpPolicy(const ActorArgs& args, const contract::ActorSetup& setup) {
  if (setup.verify_draws)
    return FailedPrecondition(
        "this run checks that every sampled token is the draw its seed gives (rollout.verify_draws), and an "
        "OpenAI-compatible server (--backend-url) cannot draw them; run the actor on echelon's own engine, or ask "
        "the run's owner to set rollout.verify_draws: false (its samples then go unchecked)");
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

// Registers and reads the run spec; returns -1 when joined, else the exit code.
int Join(net::RemoteLearner& learner, std::optional<contract::ActorSetup>* setup) {
  Result<std::string> spec = learner.Connect(g_stop);
  if (!spec.ok()) {
    spdlog::error("{}", spec.status().message());
    return g_stop.load() ? 0 : 1;
  }
  Result<contract::ActorSetup> parsed = contract::ParseRunSpec(spec.value());
  if (!parsed.ok()) {
    spdlog::error("{}", parsed.status().message());
    return 1;
  }
  *setup = std::move(parsed).value();
  return -1;
}

// A stage after the first: serves its layers to the stage before, follows the pipeline the
// learner forms (the next stage's address, its own layers) and loads each new snapshot's
// tensors of its layers. Runs until a signal or the end of the run.
int RunLaterStage(const ActorArgs& args, net::RemoteLearnerOptions ro) {
  const int stage = ro.role.stage, stages = ro.role.stages;
  const bool last = stage + 1 == stages;
  net::StageRoute next(ro.token, args.stage_timeout);
  model::StageServer server(model::Qwen3Model(nullptr), last ? nullptr : &next, args.lane_idle_timeout);
  net::StageServiceOptions so;
  so.listen = args.stage_listen;
  so.token = ro.token;  // the stages of a pipeline are one worker: its token
  if (!ro.tls_ca_pem.empty()) {
    // TLS with the learner: this stage serves with a certificate of its own, which the learner
    // hands to the stage before (the broadcast's scheme, net/tls.h).
    Result<net::TlsIdentity> me = net::SelfSignedIdentity();
    if (!me.ok()) {
      spdlog::error("pipeline stage: {}", me.status().message());
      return 1;
    }
    so.tls = std::move(me).value();
    ro.role.cert_pem = so.tls.cert_pem;
  }
  Result<std::unique_ptr<net::StageService>> service = net::StageService::Start(&server, std::nullopt, so);
  if (!service.ok()) {
    spdlog::error("--stage-listen: {}", service.status().message());
    return 2;
  }
  std::string host = !args.stage_advertise.empty() ? net::HostOf(args.stage_advertise) : net::HostOf(args.stage_listen);
  if (args.stage_advertise.empty() && net::IsWildcardHost(host)) {
    Result<std::string> ip = net::LocalAddressToward(ro.address);
    if (!ip.ok()) {
      spdlog::error("{}; give --stage-advertise HOST:PORT", ip.status().message());
      return 2;
    }
    host = ip.value();
  }
  ro.role.address = !args.stage_advertise.empty() ? args.stage_advertise
                                                  : host + ":" + std::to_string(service.value()->port());
  net::RemoteLearner learner(ro);
  std::optional<contract::ActorSetup> setup;
  if (int code = Join(learner, &setup); code >= 0) return code;
  service.value()->SetConfig(setup->model);
  std::cout << "pipeline " << args.pipeline << " stage " << stage << "/" << stages << " serving on "
            << ro.role.address << std::endl;
  uint64_t epoch = 0;
  int64_t held = -1;
  model::LayerRange layers{-1, -1};
  while (!g_stop.load() && !learner.done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    learner.KeepRegistered();
    const net::PipelineRoute route = learner.route();
    if (!route.complete) continue;
    if (!last) {
      const size_t after = static_cast<size_t>(stage + 1);
      if (Status st = next.Retarget(route.addresses[after], route.certs[after]); !st.ok()) {
        spdlog::error("pipeline {}: {}", args.pipeline, st.message());
        continue;
      }
    }
    if (route.epoch != epoch) {
      epoch = route.epoch;
      spdlog::info("pipeline {} (epoch {}): this stage holds layers {}-{}{}", args.pipeline, epoch,
                   route.layers[static_cast<size_t>(stage)].first, route.layers[static_cast<size_t>(stage)].last - 1,
                   last ? "" : ", the next is at " + route.addresses[static_cast<size_t>(stage + 1)]);
    }
    learner.Want(server.wanted());  // the head's snapshot, at once rather than at the next heartbeat
    const contract::Snapshot snap = learner.Latest();
    if (snap.version < 0 || !snap.weights) continue;
    const model::LayerRange want = route.layers[static_cast<size_t>(stage)];
    if (snap.version == held && want.first == layers.first && want.last == layers.last) continue;
    Result<model::StageSnapshot> got =
        model::LoadStageSnapshot(setup->model, *snap.weights, "snapshot v" + std::to_string(snap.version));
    if (!got.ok()) {
      spdlog::error("pipeline {}: {}", args.pipeline, got.status().message());
      continue;
    }
    if (got->layers.first != want.first || got->layers.last != want.last) continue;  // the route moved meanwhile
    server.SetModel(got->model, snap.version);
    held = snap.version;
    layers = want;
  }
  learner.Close();
  spdlog::info("pipeline {} stage {}/{} stopping ({})", args.pipeline, stage, stages,
               learner.done() ? "run finished" : "signal");
  return 0;
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
  if (args.pipeline.empty() != args.stage.empty()) {
    spdlog::error("--pipeline NAME and --stage I/K go together");
    return 2;
  }
  if (!args.pipeline.empty()) {
    if (args.backend != "builtin") {
      spdlog::error("--pipeline: pipeline stages run the builtin backend");
      return 2;
    }
    if (Status st = ParseStage(args.stage, &ro.role); !st.ok()) {
      spdlog::error("{}", st.message());
      return 2;
    }
    ro.role.pipeline = args.pipeline;
    ro.role.memory_bytes = args.stage_memory_gb * 1e9;
    ro.role.seconds_per_layer = args.stage_seconds_per_layer;
  }
  ro.broadcast = !args.no_broadcast;
  ro.broadcast_listen = args.broadcast_listen;
  ro.broadcast_advertise = args.broadcast_advertise;
  ro.broadcast_upload_bps = args.broadcast_upload_mbps * 1e6 / 8;
  if (!args.token_file.empty()) {
    Result<std::string> token = net::LoadToken(args.token_file);
    if (!token.ok()) {
      spdlog::error("--token-file: {}", token.status().message());
      return 2;
    }
    ro.token = token.value();
  }
  if (ro.role.stage > 0) return RunLaterStage(args, std::move(ro));
  net::RemoteLearner learner(ro);
  std::optional<contract::ActorSetup> setup;
  if (int code = Join(learner, &setup); code >= 0) return code;
  std::unique_ptr<rollout::SnapshotPolicy> policy;
  // The head of a pipeline: the next stage is where the learner last said (Retarget is a no-op
  // while it stays), checked whenever the actor looks at its snapshot, before every group.
  net::StageRoute next(ro.token, args.stage_timeout);
  if (ro.role.stage == 0) {
    auto layers = [&learner, &next]() -> std::optional<model::LayerRange> {
      const net::PipelineRoute r = learner.route();
      if (!r.complete || !next.Retarget(r.addresses[1], r.certs[1]).ok()) return std::nullopt;
      return r.layers[0];
    };
    policy = std::make_unique<rollout::PipelinePolicy>(setup->model, setup->vocab, setup->sampling, &next,
                                                       args.micro_batches, layers);
    spdlog::info("{}: head of pipeline {} ({} stages, {} micro-batches)", args.name, args.pipeline, ro.role.stages,
                 args.micro_batches);
  } else if (args.backend == "openai-http") {
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
  ao.slowdown = args.slowdown;
  ao.partial = setup->partial;
  if (ao.partial && args.backend == "openai-http")
    spdlog::warn("{}: rollout.partial needs the builtin backend; an openai-http actor generates each group on one "
                 "snapshot", args.name);
  rollout::Actor actor(ao, &learner, &learner, &learner, setup->task.get(), std::move(policy));
  actor.set_episode_host(&learner);
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
                  "where this actor serves snapshot chunks to other actors (peer-assisted broadcast); none: "
                  "nowhere (behind NAT: it receives every snapshot by dialling out, and never relays)")
      ->capture_default_str();
  cmd->add_option("--broadcast-advertise", args->broadcast_advertise,
                  "HOST:PORT other actors dial for chunks (default: this host's address toward the learner)");
  cmd->add_option("--broadcast-upload-mbps", args->broadcast_upload_mbps,
                  "this host's upload rate, Mbit/s: the broadcast's first estimate until it measures one, and "
                  "chunks it serves are paced to 95% of it (0: not declared: paced as its sockets show)")
      ->check(CLI::Range(0.0, 100000.0))
      ->capture_default_str();
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
  cmd->add_option("--pipeline", args->pipeline, "this process is one stage of the pipelined worker of this name");
  cmd->add_option("--stage", args->stage, "I/K: this process is stage I of the pipeline's K (0: the head, which samples)");
  cmd->add_option("--stage-listen", args->stage_listen, "stage I > 0: HOST:PORT the stage before dials")
      ->capture_default_str();
  cmd->add_option("--stage-advertise", args->stage_advertise,
                  "stage I > 0: HOST:PORT to tell the learner (default: this host's address toward it)");
  cmd->add_option("--micro-batches", args->micro_batches, "head: lanes in flight through the pipeline")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--stage-memory-gb", args->stage_memory_gb, "what this stage may fill (the learner's layer split)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--stage-seconds-per-layer", args->stage_seconds_per_layer,
                  "this stage's time per layer, relative to the others' (the learner's layer split)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--stage-timeout", args->stage_timeout, "seconds a call to the next stage may take")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunActor(*args); });
}

}  // namespace echelon::cli
