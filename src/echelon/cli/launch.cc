#include "echelon/cli/launch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "echelon/cli/commands.h"
#include "echelon/cli/processes.h"
#include "echelon/cli/thread_actors.h"
#include "echelon/cli/train_config.h"
#include "echelon/common/fs.h"
#include "echelon/learn/learner_run.h"
#include "echelon/learn/run_start.h"
#include "echelon/net/address.h"
#include "echelon/net/auth.h"
#include "echelon/net/grpc_actors.h"
#include "echelon/plan/pipeline_split.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted = true; }
// SIGHUP: the learner re-reads its --token-file (revocation without a restart).
std::atomic<bool> g_reload_tokens{false};
void OnHangup(int) { g_reload_tokens = true; }
const RealClock g_clock;

std::string DefaultRunDir(const std::string& config_path) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream ss;
  ss << "runs/" << std::filesystem::path(config_path).stem().string() << "-" << std::put_time(&tm, "%Y%m%d-%H%M%S");
  return ss.str();
}

void PrintSummary(const learn::RunSummary& s, std::ostream& out) {
  if (std::isnan(s.final_accuracy))  // eval.heldout false
    out << "held-out accuracy: not evaluated (eval.heldout false; " << s.steps_done << " steps, " << std::fixed
        << std::setprecision(0) << s.wall_seconds << " s)\n";
  else
    out << "held-out accuracy: warm-start " << std::fixed << std::setprecision(3) << s.warmstart_accuracy << " -> "
        << (s.interrupted ? "interrupted " : "final ") << s.final_accuracy << " (n=" << s.heldout_n << ", "
        << s.steps_done << " steps, " << std::setprecision(0) << s.wall_seconds << " s)\n";
  out << "run directory: " << s.run_dir
      << " (config.yaml, metrics.jsonl, learner.log, events.out.tfevents.*, heldout.jsonl, checkpoints/)\n";
  nlohmann::json j = {{"run_dir", s.run_dir},           {"steps", s.steps_done},
                      {"warmstart_accuracy", s.warmstart_accuracy}, {"final_accuracy", s.final_accuracy},
                      {"heldout_n", s.heldout_n},       {"wall_s", s.wall_seconds},
                      {"interrupted", s.interrupted}};
  out << j.dump() << std::endl;
}

// Writes to two stream buffers (the terminal and the run's log).
class TeeBuf : public std::streambuf {
 public:
  TeeBuf(std::streambuf* a, std::streambuf* b) : a_(a), b_(b) {}

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const bool ok = a_->sputc(static_cast<char>(c)) != traits_type::eof() &&
                    b_->sputc(static_cast<char>(c)) != traits_type::eof();
    return ok ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    a_->sputn(s, n);
    return b_->sputn(s, n);
  }
  int sync() override { return (a_->pubsync() == 0) & (b_->pubsync() == 0) ? 0 : -1; }

 private:
  std::streambuf* a_;
  std::streambuf* b_;
};

// RUN_DIR/learner.log: what the learner prints, progress (stdout) and diagnostics (stderr)
// alike, appended across resumes, each start headed by the build that ran it.
class RunLog {
 public:
  Status Open(const std::string& run_dir, bool fresh) {
    std::error_code ec;
    if (fresh && !learn::IsFreshRunDir(run_dir))
      return FailedPrecondition("run directory " + run_dir + " already exists and is not empty; choose another --out");
    std::filesystem::create_directories(run_dir, ec);
    if (ec) return Internal("cannot create " + run_dir + ": " + ec.message());
    const std::string path = (std::filesystem::path(run_dir) / "learner.log").string();
    file_.open(path, std::ios::app);
    if (!file_) return Internal("cannot open " + path + " for appending");
    file_ << "# " << VersionLine() << (fresh ? "" : " resuming") << std::endl;
    try {
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
      sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e %L] %v");
      spdlog::default_logger()->sinks().push_back(sink);
      spdlog::default_logger()->flush_on(spdlog::level::info);
    } catch (const spdlog::spdlog_ex& e) {
      return Internal("cannot log to " + path + ": " + e.what());
    }
    return Status::Ok();
  }
  std::ostream& progress() { return progress_; }

 private:
  std::ofstream file_;
  TeeBuf tee_{std::cout.rdbuf(), file_.rdbuf()};
  std::ostream progress_{&tee_};
};

// Keys a resumed run may change (with --set or an edited CONFIG); anything else would make
// the checkpoint describe a different run.
bool ChangeableOnResume(const std::string& key) {
  static const std::set<std::string> kKeys = {"rl.steps",         "checkpoint.every",        "checkpoint.keep",
                                              "checkpoint.shard_mb",
                                              "eval.every",       "rollout.lease_seconds",   "rollout.stall_timeout_seconds",
                                              "learner.device",   "learner.micro_batch_tokens", "learner.ranks",
                                              "learner.rank_timeout_seconds", "learner.pack_sequences"};
  return kKeys.count(key) > 0 || key.rfind("eval.sets.", 0) == 0;  // evaluation sets only measure
}

// The config of a resumed run: its own config.yaml plus `--set`; a CONFIG given as well must
// agree with it except on keys a resume may change.
Result<Config> ResumeConfig(const LaunchArgs& args, const std::string& run_dir) {
  const std::string saved_path = (std::filesystem::path(run_dir) / "config.yaml").string();
  if (!std::filesystem::exists(saved_path))
    return NotFound("cannot resume " + run_dir + ": " + saved_path + " does not exist (not a run directory?)");
  ECHELON_ASSIGN_OR_RETURN(Config saved, Config::Load(TrainSchema(), saved_path, {}));
  ECHELON_ASSIGN_OR_RETURN(Config wanted,
                           Config::Load(TrainSchema(), args.config.empty() ? saved_path : args.config, args.overrides));
  std::vector<std::string> refused;
  for (const auto& [key, value] : wanted.values()) {
    auto it = saved.values().find(key);
    const bool same = it != saved.values().end() && it->second == value;
    if (!same && !ChangeableOnResume(key)) refused.push_back(key);
  }
  if (!refused.empty()) {
    std::string keys;
    for (const std::string& k : refused) keys += (keys.empty() ? "" : ", ") + k;
    return InvalidArgument("resuming " + run_dir + ": the config differs from the run's config.yaml in " + keys +
                           "; a resumed run may change only rl.steps, checkpoint.*, eval.every, eval.sets.*, "
                           "rollout.lease_seconds, rollout.stall_timeout_seconds, learner.device, "
                           "learner.micro_batch_tokens, learner.pack_sequences and learner.ranks");
  }
  if (wanted.ToYaml() != saved.ToYaml())
    ECHELON_RETURN_IF_ERROR(WriteFileAtomic(saved_path, "# " + VersionLine() + "\n" + wanted.ToYaml()));
  return wanted;
}

// The gRPC side of a run: `echelon learner` serves remote actors at --listen with the token
// of --token-file; `echelon train` (rollout.transport: processes) serves its own actor
// processes on loopback with a fresh token, starting them once the server listens.
Result<net::GrpcActorsOptions> NetworkOptions(const LaunchArgs& args, LaunchMode mode, const RunOptions& options,
                                              const std::string& run_dir, ProcessGroup* actors) {
  net::GrpcActorsOptions net;
  net.tls_cert_file = args.tls_cert;
  net.tls_key_file = args.tls_key;
  net.broadcast = options.snapshot_broadcast;
  net.play_turn_timeout_seconds = options.lease_seconds;
  net.split_layers = plan::SplitPipelineLayers;  // pipelined actors' layers (plan/pipeline_split.h)
  if (mode == LaunchMode::kLearnerOnly) {
    net.listen = args.listen;
    net.broadcast_listen = args.broadcast_listen;
    for (const std::string& h : args.broadcast_peer_hosts)
      if (!net::IsIpLiteral(h)) return InvalidArgument("--broadcast-peer-hosts " + h + ": expected an IP address, not a name");
    net.broadcast_peer_hosts = args.broadcast_peer_hosts;
    if (!args.token_file.empty() && args.insecure) return InvalidArgument("--token-file and --insecure contradict each other");
    if (args.token_file.empty() && !args.insecure)
      return InvalidArgument("echelon learner needs --token-file (the actors' tokens; see docs/DEPLOY.md), or "
                             "--insecure to let anyone who reaches " + args.listen + " join the run");
    const std::string per_worker =
        "every worker needs its own token: `echelon tokens --out DIR --workers N` writes DIR/tokens (this "
        "learner's --token-file) and DIR/NAME.token for each worker";
    if (args.insecure) {
      if (options.untrusted_workers)
        return InvalidArgument("rollout.untrusted_workers: --insecure lets anyone join the run; " + per_worker);
      spdlog::warn("--insecure: any host that reaches {} can join this run", args.listen);
      return net;
    }
    Result<net::TokenTable> tokens = net::TokenTable::Load(args.token_file);
    if (!tokens.ok()) return tokens.status().WithContext("--token-file");
    if (!tokens->per_actor()) {
      if (options.untrusted_workers)
        return InvalidArgument("rollout.untrusted_workers: " + args.token_file +
                               " holds one token shared by every worker, whose names are their own choice; " + per_worker);
      spdlog::warn("{} holds one token shared by every worker: for a fleet you trust (a worker's name is its own "
                   "choice, so its lease cap and quarantine are only as good as its honesty); {}",
                   args.token_file, per_worker);
    }
    net.tokens = std::move(tokens).value();
    net.token_file = args.token_file;
    net.reload_tokens = &g_reload_tokens;
    std::signal(SIGHUP, OnHangup);
    return net;
  }
  // A local cluster: actors are child processes on loopback with a fresh token.
  net.listen = "127.0.0.1:0";
  const std::string token = net::RandomToken();
  net.tokens = net::TokenTable::Shared(token);
  net.on_listening = [actors, run_dir, token, options](int port) {
    const std::string exe = SelfExe();
    const std::string dir = run_dir + "/actors";
    std::filesystem::create_directories(dir);
    const std::string token_path = dir + "/token";
    if (!WriteFileAtomic(token_path, token + "\n").ok() || ::chmod(token_path.c_str(), 0600) != 0)
      spdlog::error("cannot write {}", token_path);
    for (int64_t i = 0; i < options.actors; ++i) {
      const std::string name = "actor-" + std::to_string(i);
      std::vector<std::string> argv = {exe,      "actor",      "--learner",  "127.0.0.1:" + std::to_string(port),
                                       "--name", name,         "--token-file", token_path,
                                       "--broadcast-listen", "127.0.0.1:0"};
      const double slowdown = options.actor_slowdowns[i];
      if (slowdown > 1.0) {
        argv.push_back("--slowdown");
        argv.push_back(std::to_string(slowdown));
      }
      Status st = actors->Start(name, argv, dir + "/" + name + ".log");
      if (!st.ok()) spdlog::error("cannot start {}: {}", name, st.message());
    }
  };
  return net;
}

// The learner's data-parallel ranks: torchrun's variables (ranks on any hosts; a rank above 0
// is a worker), or learner.ranks local worker processes started once rank 0 listens.
Result<std::optional<learn::RankGroupOptions>> RankOptions(const RunOptions& options, const std::string& run_dir,
                                                          ProcessGroup* ranks) {
  ECHELON_ASSIGN_OR_RETURN(std::optional<learn::RankGroupOptions> env, learn::RankOptionsFromEnv());
  if (env) {
    if (options.learner_ranks > 1 && options.learner_ranks != env->world)
      return InvalidArgument("learner.ranks (" + std::to_string(options.learner_ranks) + ") and WORLD_SIZE (" +
                             std::to_string(env->world) + ") disagree; set one of them");
    env->timeout_seconds = options.rank_timeout_seconds;
    return env;
  }
  if (options.learner_ranks <= 1) return std::optional<learn::RankGroupOptions>();
  learn::RankGroupOptions r;
  r.world = static_cast<int>(options.learner_ranks);
  r.timeout_seconds = options.rank_timeout_seconds;
  r.on_listening = [ranks, run_dir, r](int port) -> Status {
    const std::string dir = run_dir + "/ranks";
    std::filesystem::create_directories(dir);
    return StartLocalRanks(ranks, r.world, port, r.timeout_seconds, dir);
  };
  return std::optional<learn::RankGroupOptions>(r);
}

}  // namespace

void AddRunOptions(CLI::App* cmd, LaunchArgs* args) {
  auto positionals = std::make_shared<std::vector<std::string>>();
  cmd->add_option("config", *positionals,
                  "YAML config, e.g. configs/math-tiny.yaml (optional with --resume), then any KEY=VALUE overrides "
                  "(e.g. rl.steps=50, the same as --set rl.steps=50)");
  cmd->add_option("--out", args->out, "run directory (default runs/<config>-<date>-<time>); must not exist or be empty");
  CLI::Option* resume =
      cmd->add_option("--resume", args->resume_dir,
                      "continue the run in RUN_DIR (default: --out) from its newest whole checkpoint")
          ->expected(0, 1);
  cmd->add_option("--metrics-port", args->metrics_port,
                  "serve Prometheus metrics at http://0.0.0.0:PORT/metrics (0 picks a port; default off)");
  cmd->add_option("--set", args->overrides, "override a config key, e.g. --set rl.steps=50 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--config-keys", args->config_keys,
                  "print the config's keys as text or markdown (docs/CONFIG.md), and exit")
      ->check(CLI::IsMember({"text", "markdown"}));
  cmd->parse_complete_callback([cmd, args, resume, positionals] {
    if (!cmd->remaining().empty()) return;  // CLI11 names the unexpected arguments next
    args->resume = resume->count() > 0;
    // A positional argument with '=' that is not a file is an override; the one without is CONFIG.
    for (const std::string& p : *positionals) {
      std::error_code ec;
      if (p.find('=') != std::string::npos && !std::filesystem::is_regular_file(p, ec)) {
        args->overrides.push_back(p);
      } else if (args->config.empty()) {
        if (!std::filesystem::is_regular_file(p, ec)) throw CLI::ValidationError("config", "no such file: " + p);
        args->config = p;
      } else {
        throw CLI::ValidationError("config", "two configs given (" + args->config + ", " + p +
                                                 "); an override is written KEY=VALUE");
      }
    }
    if (args->config.empty() && !args->resume && args->config_keys.empty()) throw CLI::RequiredError("config (or --resume RUN_DIR)");
    if (args->resume && args->resume_dir.empty() && args->out.empty())
      throw CLI::ValidationError("--resume", "name the run directory: --resume RUN_DIR (or --out RUN_DIR)");
  });
}

int Launch(const LaunchArgs& args, LaunchMode mode) {
  if (!args.config_keys.empty()) {
    std::cout << (args.config_keys == "markdown" ? TrainSchema().Markdown() : TrainSchema().Describe());
    return 0;
  }
  const std::string run_dir = args.resume ? (args.resume_dir.empty() ? args.out : args.resume_dir)
                                          : (args.out.empty() ? DefaultRunDir(args.config) : args.out);
  Result<Config> cfg = args.resume ? ResumeConfig(args, run_dir) : Config::Load(TrainSchema(), args.config, args.overrides);
  if (!cfg.ok()) {
    spdlog::error("{}", cfg.status().message());
    return 2;
  }
  Result<RunOptions> options = RunOptionsFromConfig(cfg.value());
  if (!options.ok()) {
    spdlog::error("{}", options.status().message());
    return 2;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  const bool threads = mode == LaunchMode::kLocalCluster && options->thread_actors;
  learn::LearnerRunArgs run_args{run_dir, "# " + VersionLine() + "\n" + cfg->ToYaml(), args.resume, args.metrics_port,
                                 std::nullopt};
  ProcessGroup ranks(/*max_restarts=*/0);  // a rank cannot rejoin its group: the run stops instead
  Result<std::optional<learn::RankGroupOptions>> rank_options = RankOptions(options.value(), run_dir, &ranks);
  if (!rank_options.ok()) {
    spdlog::error("{}", rank_options.status().message());
    return 2;
  }
  if (rank_options.value() && rank_options.value()->rank > 0) return RunWorkerRank(*rank_options.value());
  run_args.ranks = rank_options.value();
  ProcessGroup actors;
  std::unique_ptr<learn::ActorTransport> transport;
  if (threads) {
    transport = std::make_unique<ThreadActors>(options->actors, options->actor_slowdowns);
  } else {
    Result<net::GrpcActorsOptions> net = NetworkOptions(args, mode, options.value(), run_dir, &actors);
    if (!net.ok()) {
      spdlog::error("{}", net.status().message());
      return 2;
    }
    transport = std::make_unique<net::GrpcActors>(std::move(net).value(), &g_clock);
  }
  RunLog log;
  if (Status st = log.Open(run_dir, !args.resume); !st.ok()) {
    spdlog::error("{}", st.message());
    return 2;
  }
  Result<learn::RunSummary> s = learn::RunLearner(options.value(), run_args, *transport, rollout::EvaluateModel,
                                                  &g_interrupted, log.progress());
  actors.StopAll(5.0);
  ranks.StopAll(5.0);
  if (!s.ok()) {
    spdlog::error("{}", s.status().message());
    return 1;
  }
  PrintSummary(s.value(), log.progress());
  return s->interrupted ? 130 : 0;
}

}  // namespace echelon::cli
