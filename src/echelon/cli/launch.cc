#include "echelon/cli/launch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/cli/processes.h"
#include "echelon/cli/runtime.h"
#include "echelon/cli/train_config.h"
#include "echelon/common/fs.h"
#include "echelon/net/auth.h"

namespace echelon::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted = true; }

std::string DefaultRunDir(const std::string& config_path) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream ss;
  ss << "runs/" << std::filesystem::path(config_path).stem().string() << "-" << std::put_time(&tm, "%Y%m%d-%H%M%S");
  return ss.str();
}

std::string RandomToken() {
  std::random_device rd;
  std::ostringstream ss;
  for (int i = 0; i < 4; ++i) ss << std::hex << std::setw(8) << std::setfill('0') << rd();
  return ss.str();
}

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("echelon") : p.string();
}

void PrintSummary(const RunSummary& s) {
  std::cout << "held-out accuracy: warm-start " << std::fixed << std::setprecision(3) << s.warmstart_accuracy << " -> "
            << (s.interrupted ? "interrupted " : "final ") << s.final_accuracy << " (n=" << s.heldout_n << ", "
            << s.steps_done << " steps, " << std::setprecision(0) << s.wall_seconds << " s)\n";
  std::cout << "run directory: " << s.run_dir << " (config.yaml, metrics.jsonl, heldout.jsonl, checkpoints/)\n";
  nlohmann::json j = {{"run_dir", s.run_dir},           {"steps", s.steps_done},
                      {"warmstart_accuracy", s.warmstart_accuracy}, {"final_accuracy", s.final_accuracy},
                      {"heldout_n", s.heldout_n},       {"wall_s", s.wall_seconds},
                      {"interrupted", s.interrupted}};
  std::cout << j.dump() << std::endl;
}

}  // namespace

int Launch(const LaunchArgs& args, LaunchMode mode) {
  Result<Config> cfg = Config::Load(TrainSchema(), args.config, args.overrides);
  if (!cfg.ok()) {
    spdlog::error("{}", cfg.status().message());
    return 2;
  }
  Result<RunOptions> options = RunOptionsFromConfig(cfg.value());
  if (!options.ok()) {
    spdlog::error("{}", options.status().message());
    return 2;
  }
  const std::string run_dir = args.out.empty() ? DefaultRunDir(args.config) : args.out;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  NetworkOptions net;
  net.tls_cert_file = args.tls_cert;
  net.tls_key_file = args.tls_key;
  net.metrics_port = args.metrics_port;
  ProcessGroup actors;
  const bool local_processes = mode == LaunchMode::kLocalCluster && cfg->String("rollout.transport") == "processes";
  if (mode == LaunchMode::kLearnerOnly) {
    net.listen = args.listen;
    if (!args.token_file.empty()) {
      Result<std::string> token = net::LoadToken(args.token_file);
      if (!token.ok()) {
        spdlog::error("--token-file: {}", token.status().message());
        return 2;
      }
      net.token = token.value();
    } else {
      spdlog::warn("no --token-file: any host that reaches {} can join this run", args.listen);
    }
  } else if (local_processes) {
    // A local cluster: actors are child processes on loopback with a fresh token.
    net.listen = "127.0.0.1:0";
    net.token = RandomToken();
    const std::string exe = SelfExe();
    net.on_listening = [&, exe](int port) {
      const std::string dir = run_dir + "/actors";
      std::filesystem::create_directories(dir);
      const std::string token_path = dir + "/token";
      if (!WriteFileAtomic(token_path, net.token + "\n").ok() || ::chmod(token_path.c_str(), 0600) != 0)
        spdlog::error("cannot write {}", token_path);
      for (int64_t i = 0; i < options->actors; ++i) {
        const std::string name = "actor-" + std::to_string(i);
        std::vector<std::string> argv = {exe,      "actor",      "--learner",  "127.0.0.1:" + std::to_string(port),
                                         "--name", name,         "--token-file", token_path};
        const double slowdown = options->actor_slowdowns[i];
        if (slowdown > 1.0) {
          argv.push_back("--slowdown");
          argv.push_back(std::to_string(slowdown));
        }
        Status st = actors.Start(name, argv, dir + "/" + name + ".log");
        if (!st.ok()) spdlog::error("cannot start {}: {}", name, st.message());
      }
    };
  }
  const bool serve = mode == LaunchMode::kLearnerOnly || local_processes;
  Result<RunSummary> s =
      RunTraining(options.value(), run_dir, cfg->ToYaml(), &g_interrupted, std::cout, serve ? &net : nullptr);
  actors.StopAll(5.0);
  if (!s.ok()) {
    spdlog::error("{}", s.status().message());
    return 1;
  }
  PrintSummary(s.value());
  return s->interrupted ? 130 : 0;
}

}  // namespace echelon::cli
