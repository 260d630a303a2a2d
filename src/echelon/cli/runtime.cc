#include "echelon/cli/runtime.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "echelon/cli/run_checkpoint.h"
#include "echelon/cli/run_spec.h"
#include "echelon/common/clock.h"
#include "echelon/common/fs.h"
#include "echelon/learn/learner.h"
#include "echelon/learn/warmstart.h"
#include "echelon/model/checkpoint.h"
#include "echelon/model/hf_model.h"
#include "echelon/model/safetensors.h"
#include "echelon/broadcast/ed25519.h"
#include "echelon/net/address.h"
#include "echelon/net/broadcast_origin.h"
#include "echelon/net/learner_server.h"
#include "echelon/obs/metrics_http.h"
#include "echelon/obs/metrics_log.h"
#include "echelon/rollout/actor.h"
#include "echelon/rollout/evaluate.h"
#include "echelon/rollout/model_policy.h"
#include "echelon/sched/staleness_gate.h"

namespace echelon::cli {
namespace fs = std::filesystem;

LocalHub::LocalHub(sched::Dispatcher* dispatcher, const data::TaskAdapter* task, const model::Vocabulary* vocab,
                   int64_t model_vocab_size, int group_size)
    : dispatcher_(dispatcher), task_(task), vocab_(vocab), group_size_(group_size), vocab_size_(model_vocab_size) {}

std::optional<rollout::Assignment> LocalHub::Acquire(const std::string& actor) {
  std::optional<sched::WorkItem> w = dispatcher_->Acquire(actor);
  if (!w) return std::nullopt;
  return rollout::Assignment{*w, task_->TrainPrompt(w->group_id), group_size_};
}

std::string LocalHub::Validate(const rollout::GroupRollout& g) const {
  if (static_cast<int>(g.episodes.size()) != group_size_) return "wrong_group_size";
  int64_t published;
  {
    std::lock_guard<std::mutex> lock(mu_);
    published = snapshot_.version;
  }
  // No actor can hold a newer policy than the newest one published.
  if (g.behavior_version < 0 || g.behavior_version > published) return "bad_version";
  for (const data::Episode& e : g.episodes) {
    if (!std::isfinite(e.reward)) return "nonfinite_reward";
    for (const data::Turn& t : e.turns) {
      if (t.tokens.size() != t.logprobs.size()) return "length_mismatch";
      if (t.prompt_ids.empty()) return "empty_prompt";
      for (int64_t id : t.prompt_ids)
        if (id < 0 || id >= vocab_size_) return "token_out_of_vocab";
      for (int64_t id : t.tokens)
        if (id < 0 || id >= vocab_size_) return "token_out_of_vocab";
      for (float lp : t.logprobs)
        if (!std::isfinite(lp) || lp > 1e-4f) return "bad_logprob";
    }
  }
  return "";
}

namespace {

const char* RefusalName(sched::SubmitResult r) {
  switch (r) {
    case sched::SubmitResult::kAccepted: return "";
    case sched::SubmitResult::kUnknownGroup: return "unknown_group";
    case sched::SubmitResult::kNotLeaseHolder: return "not_lease_holder";
    case sched::SubmitResult::kAlreadySettled: return "already_settled";
  }
  return "unknown";
}

}  // namespace

rollout::SubmitOutcome LocalHub::Submit(rollout::GroupRollout rollout) {
  std::string reason = Validate(rollout);
  if (reason.empty()) reason = RefusalName(dispatcher_->Submit(rollout.group_id, rollout.lease_id));
  if (!reason.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++refusals_[reason];
    spdlog::warn("refused group {} from {}: {}", rollout.group_id, rollout.actor, reason);
    return {false, reason};
  }
  rollout.prompt = task_->TrainPrompt(rollout.group_id);
  const int64_t corrected = RecheckRewards(&rollout);
  int64_t tokens = 0;
  for (const data::Episode& e : rollout.episodes)
    for (const data::Turn& t : e.turns) tokens += static_cast<int64_t>(t.tokens.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (corrected > 0) refusals_["reward_corrected"] += corrected;
    accepted_tokens_ += tokens;
    ++actor_groups_[rollout.actor.substr(0, rollout.actor.find('#'))];
    queue_.push_back(std::move(rollout));
  }
  arrived_.notify_one();
  return {true, ""};
}

int64_t LocalHub::RecheckRewards(rollout::GroupRollout* g) const {
  int64_t corrected = 0;
  for (data::Episode& e : g->episodes) {
    if (e.turns.size() != 1) continue;  // multi-turn episodes are the adapter's to verify
    const double reward = task_->Reward(g->prompt, vocab_->DecodeCompletion(e.turns[0].tokens));
    if (reward != e.reward) ++corrected;
    e.reward = reward;
    e.success = reward >= 1.0;
  }
  return corrected;
}

int64_t LocalHub::accepted_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_tokens_;
}

std::map<std::string, int64_t> LocalHub::actor_groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return actor_groups_;
}

void LocalHub::RestoreCounters(std::map<std::string, int64_t> refusals, int64_t accepted_tokens,
                               std::map<std::string, int64_t> actor_groups) {
  std::lock_guard<std::mutex> lock(mu_);
  refusals_ = std::move(refusals);
  accepted_tokens_ = accepted_tokens;
  actor_groups_ = std::move(actor_groups);
}

rollout::Snapshot LocalHub::Latest() {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void LocalHub::Publish(rollout::Snapshot snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = std::move(snapshot);
}

std::vector<rollout::GroupRollout> LocalHub::Drain(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  arrived_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), [&] { return !queue_.empty(); });
  std::vector<rollout::GroupRollout> out(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

std::map<std::string, int64_t> LocalHub::refusals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusals_;
}

namespace {

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream ss;
  if (s >= 3600) ss << s / 3600 << "h";
  if (s >= 60) ss << (s / 60) % 60 << "m";
  ss << s % 60 << "s";
  return ss.str();
}

Result<rollout::Snapshot> MakeSnapshot(const model::Qwen3Model& model, int64_t version) {
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, model::SerializeSafetensors(model->StateDict()));
  return rollout::Snapshot{version, std::make_shared<const std::string>(std::move(bytes))};
}

// Held-out greedy accuracy of the learner's current weights.
rollout::EvalResult EvaluateModel(const model::Qwen3Model& source, const model::Vocabulary& vocab,
                                  const data::TaskAdapter& task, int64_t max_new_tokens) {
  model::Qwen3Model copy(source->config());
  Status st = copy->LoadStateDict(source->StateDict(), "evaluation copy");
  if (!st.ok()) throw std::logic_error(st.message());
  model::SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = max_new_tokens;
  rollout::ModelPolicy policy(copy, vocab, sp);
  return rollout::EvaluateGreedy(task, task.HeldOut(), policy);
}

Status PrepareRunDir(const std::string& run_dir) {
  std::error_code ec;
  if (fs::exists(run_dir) && !fs::is_empty(run_dir, ec))
    return FailedPrecondition("run directory " + run_dir + " already exists and is not empty; choose another --out");
  fs::create_directories(fs::path(run_dir) / "checkpoints", ec);
  if (ec) return Internal("cannot create " + run_dir + ": " + ec.message());
  return Status::Ok();
}

// Every number of a metrics line as a Prometheus gauge "echelon_<key>"; a map of numbers
// becomes one gauge with its keys as the `key` label.
void PublishGauges(const nlohmann::json& line, obs::MetricsHttpServer& http) {
  for (const auto& [key, value] : line.items()) {
    if (value.is_number()) {
      http.Set("echelon_" + key, value.get<double>());
    } else if (value.is_object()) {
      for (const auto& [k, v] : value.items())
        if (v.is_number()) http.Set("echelon_" + key, v.get<double>(), {{"key", k}});
    }
  }
}

// Every new policy snapshot goes to the hub (in-process actors, and remote actors' direct
// pulls) and, once StartBroadcast ran, out by peer-assisted broadcast
// (net/broadcast_origin.h), signed with a key made for this learner process.
class SnapshotPublisher {
 public:
  explicit SnapshotPublisher(LocalHub* hub) : hub_(hub) {}

  Status StartBroadcast(const NetworkOptions& network, const Clock* clock) {
    ECHELON_ASSIGN_OR_RETURN(broadcast::SigningKey key, broadcast::SigningKey::Generate());
    net::BroadcastOriginOptions bo;
    bo.listen = network.broadcast_listen.empty() ? net::HostOf(network.listen) + ":0" : network.broadcast_listen;
    bo.token = network.token;
    bo.log_each_version = false;  // one snapshot per update: the metrics carry broadcast_s
    origin_ = std::make_unique<net::BroadcastOrigin>(bo, std::move(key), clock);
    return origin_->Start();
  }
  const net::BroadcastOrigin* origin() const { return origin_.get(); }

  void Publish(rollout::Snapshot snap) {
    if (origin_) {
      Result<broadcast::Manifest> m = origin_->Publish(static_cast<uint64_t>(snap.version), *snap.weights);
      if (m.ok()) {
        broadcasting_.push_back(snap.version);
        if (broadcasting_.size() > 8) broadcasting_.pop_front();
      } else {
        spdlog::warn("broadcast of snapshot v{} failed: {}; actors will pull it directly", snap.version,
                     m.status().message());
      }
    }
    hub_->Publish(std::move(snap));
  }

  // The newest version whose broadcast completed since the last call, with the seconds from
  // publishing until the last peer held it (nullopt: none).
  std::optional<std::pair<int64_t, double>> TakeCompletedBroadcast() {
    std::optional<std::pair<int64_t, double>> newest;
    if (!origin_) return newest;
    for (auto it = broadcasting_.begin(); it != broadcasting_.end();) {
      if (!origin_->IsComplete(static_cast<uint64_t>(*it))) {
        ++it;
        continue;
      }
      std::optional<double> last;
      for (const net::BroadcastPeerReport& r : origin_->Report(static_cast<uint64_t>(*it)))
        if (r.completed_s) last = std::max(last.value_or(0.0), *r.completed_s);
      if (last) newest = std::make_pair(*it, *last);
      it = broadcasting_.erase(it);
    }
    return newest;
  }

  void Shutdown() {
    if (origin_) origin_->Shutdown();
  }

 private:
  LocalHub* hub_;
  std::unique_ptr<net::BroadcastOrigin> origin_;
  std::deque<int64_t> broadcasting_;  // published versions not yet held by every peer
};

// Everything the learner loop tracks across steps.
struct LoopState {
  std::deque<rollout::GroupRollout> buffer;
  int64_t consumed_tokens = 0;
  double busy_seconds = 0;
};

}  // namespace

namespace {

// The model a fresh run starts from: a new character model over the task's alphabet, or the
// directory of model.init with its own tokenizer.
struct InitialModel {
  model::ModelConfig config;
  model::Vocabulary vocab;
  model::Qwen3Model weights{nullptr};  // null: initialise from the seed
};

model::ModelConfig CharacterModelConfig(const RunOptions& options, const model::Vocabulary& vocab) {
  model::ModelConfig mcfg = options.model;
  mcfg.vocab_size = vocab.id_end();
  mcfg.bos_token_id = model::CharTokenizer::kBos;
  mcfg.eos_token_id = model::CharTokenizer::kEos;
  mcfg.pad_token_id = model::CharTokenizer::kPad;
  return mcfg;
}

Result<InitialModel> LoadInitialModel(const RunOptions& options, const data::TaskAdapter& task) {
  InitialModel m;
  if (options.model_init.empty()) {
    m.vocab = model::Vocabulary::Characters(task.Alphabet());
    m.config = CharacterModelConfig(options, m.vocab);
    ECHELON_RETURN_IF_ERROR(m.config.Validate().WithContext("model config"));
    return m;
  }
  const std::string where = "model.init " + options.model_init;
  ECHELON_ASSIGN_OR_RETURN(model::TextModel dir, model::LoadModelDir(options.model_init));
  if (!dir.vocab) return NotFound(where + ": no tokenizer.json, so prompts cannot be encoded");
  if (dir.vocab->stop_ids().empty())
    return InvalidArgument(where + ": config.json and generation_config.json name no eos_token_id, so completions never end");
  m.config = dir.config;
  m.vocab = *dir.vocab;
  if (options.chat) {
    Result<model::Vocabulary> chat = m.vocab.WithChat(/*enable_thinking=*/false);
    if (!chat.ok()) return chat.status().WithContext(where + " (rollout.chat)");
    m.vocab = std::move(chat).value();
  }
  m.weights = dir.model;
  // Every prompt of the task must encode (a character tokenizer has a fixed alphabet).
  if (Result<std::vector<int64_t>> probe = m.vocab.EncodePrompt(task.TrainPrompt(0).text); !probe.ok())
    return InvalidArgument(where + ": its tokenizer cannot encode the task's prompts: " + probe.status().message());
  return m;
}

// Where a run starts from: a fresh run dir (after warm-start) or a resumable checkpoint.
struct Start {
  model::Qwen3Model model{nullptr};
  model::Vocabulary vocab;
  RunState state;
  std::string resumed_from;  // checkpoint directory; empty for a fresh run
  std::map<std::string, at::Tensor> optimizer;
  int64_t discarded_lines = 0;
  std::vector<std::string> skipped;
};

// Fresh run: run directory, config, held-out set, warm-start and its evaluation.
Result<Start> StartFresh(const RunOptions& options, const data::TaskAdapter& task, const std::string& run_dir,
                         const std::string& resolved_yaml, obs::MetricsLog& metrics, std::ostream& progress,
                         const RealClock& clock, double t_start) {
  ECHELON_ASSIGN_OR_RETURN(InitialModel init, LoadInitialModel(options, task));
  ECHELON_RETURN_IF_ERROR(PrepareRunDir(run_dir));
  ECHELON_RETURN_IF_ERROR(WriteFileAtomic((fs::path(run_dir) / "config.yaml").string(), resolved_yaml));
  ECHELON_RETURN_IF_ERROR(task.ExportHeldOut((fs::path(run_dir) / "heldout.jsonl").string()));
  ECHELON_RETURN_IF_ERROR(metrics.Open((fs::path(run_dir) / "metrics.jsonl").string()));
  Start start;
  start.vocab = init.vocab;
  const model::Vocabulary& vocab = start.vocab;
  if (init.weights) {
    start.model = init.weights;
    int64_t params = 0;
    for (const at::Tensor& p : start.model->parameters()) params += p.numel();
    progress << "starting from " << options.model_init << " (" << init.config.architecture() << ", " << params
             << " parameters)" << std::endl;
  } else {
    start.model = model::Qwen3Model(init.config);
    start.model->InitWeights(options.seed);
  }
  if (options.warmstart.steps > 0) {
    progress << "warm-start: " << options.warmstart.steps << " supervised steps" << std::endl;
    const int64_t every = std::max<int64_t>(1, options.warmstart.steps / 5);
    ECHELON_ASSIGN_OR_RETURN(
        double loss, learn::Warmstart(start.model, vocab, task, options.warmstart, [&](int64_t step, double l) {
          if ((step + 1) % every == 0)
            progress << "  warm-start step " << step + 1 << "/" << options.warmstart.steps << " loss " << std::fixed
                     << std::setprecision(3) << l << std::endl;
        }));
    (void)loss;
  }
  ECHELON_RETURN_IF_ERROR(
      model::SaveCheckpoint((fs::path(run_dir) / "checkpoints" / "warmstart").string(), start.model, vocab));
  rollout::EvalResult before = EvaluateModel(start.model, vocab, task, options.max_new_tokens);
  start.state.warmstart_accuracy = before.accuracy;
  start.state.heldout_n = before.n;
  progress << "warm-start held-out accuracy " << std::fixed << std::setprecision(3) << before.accuracy << " (n="
           << before.n << ")" << std::endl;
  ECHELON_RETURN_IF_ERROR(metrics.Write({{"event", "warmstart"},
                                         {"steps", options.warmstart.steps},
                                         {"heldout_accuracy", before.accuracy},
                                         {"heldout_n", before.n},
                                         {"wall_s", clock.Now() - t_start}}));
  start.state.wall_seconds = clock.Now() - t_start;
  return start;
}

// Resumed run: the newest whole checkpoint; metrics.jsonl cut back to where it was then.
Result<Start> StartFromCheckpoint(const RunOptions& options, const data::TaskAdapter& task, const std::string& run_dir,
                                  obs::MetricsLog& metrics, std::ostream& progress) {
  const fs::path ckpt_dir = fs::path(run_dir) / "checkpoints";
  Start start;
  Result<ResumePoint> point = LoadNewestRunCheckpoint(ckpt_dir.string(), &start.skipped);
  for (const std::string& why : start.skipped) progress << "skipping checkpoint " << why << std::endl;
  if (!point.ok())
    return NotFound("cannot resume " + run_dir + ": " + point.status().message() +
                    "; the run died before its first checkpoint, so start it again with another --out");
  // A run from model.init keeps the model and tokenizer its checkpoints carry.
  if (options.model_init.empty() &&
      point->checkpoint.config.ToJson() !=
          CharacterModelConfig(options, model::Vocabulary::Characters(task.Alphabet())).ToJson())
    return FailedPrecondition(point->dir + "/config.json describes another model than the run's config.yaml");
  start.model = point->checkpoint.model;
  start.vocab = point->checkpoint.vocab;
  if (options.chat) {
    Result<model::Vocabulary> chat = start.vocab.WithChat(/*enable_thinking=*/false);
    if (!chat.ok()) return chat.status().WithContext(point->dir + " (rollout.chat)");
    start.vocab = std::move(chat).value();
  }
  start.state = point->state;
  start.resumed_from = point->dir;
  start.optimizer = std::move(point->optimizer);
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  ECHELON_ASSIGN_OR_RETURN(start.discarded_lines,
                           obs::MetricsLog::RollBack(metrics_path, start.state.metrics_bytes,
                                                     (fs::path(run_dir) / "metrics.discarded.jsonl").string()));
  ECHELON_RETURN_IF_ERROR(metrics.Open(metrics_path));
  progress << "resuming from " << point->dir << " (version " << start.state.version << "); "
           << start.discarded_lines << " metrics lines after it moved to metrics.discarded.jsonl" << std::endl;
  return start;
}

// A lease id base above every lease an earlier process of this run can have handed out.
uint64_t FreshLeaseBase(uint64_t saved_next_lease) {
  std::random_device rd;
  const uint64_t salt = (static_cast<uint64_t>(rd()) & 0x7fffu) + 1;
  return saved_next_lease + (salt << 40);
}

}  // namespace

Result<RunSummary> RunTraining(const RunOptions& options, const std::string& run_dir, const std::string& resolved_yaml,
                               const std::atomic<bool>* interrupt, std::ostream& progress,
                               const NetworkOptions* network, bool resume) {
  RunSummary summary;
  summary.run_dir = run_dir;
  RealClock clock;
  const double t_start = clock.Now();

  if (options.learner.loss.correction != learn::Correction::kNone && options.learner.minibatches <= 1)
    spdlog::warn("rl.correction {} with rl.minibatches 1: the ratio to pi_prox is exactly 1, so nothing is "
                 "clipped; at S = 16 and rl.lr 3e-4 it fell below the warm-start, at rl.lr 7.5e-5 it matched "
                 "`none` (docs/RESULTS.md)",
                 options.learner.loss.correction == learn::Correction::kTruncatedIS ? "tis" : "decoupled");
  ECHELON_ASSIGN_OR_RETURN(std::unique_ptr<data::TaskAdapter> task,
                           data::CreateAdapter(options.task_name, options.task_options));
  const fs::path ckpt_dir = fs::path(run_dir) / "checkpoints";

  obs::MetricsLog metrics;
  ECHELON_ASSIGN_OR_RETURN(Start start, resume ? StartFromCheckpoint(options, *task, run_dir, metrics, progress)
                                               : StartFresh(options, *task, run_dir, resolved_yaml, metrics, progress,
                                                            clock, t_start));
  const model::Vocabulary& vocab = start.vocab;
  const model::ModelConfig mcfg = start.model->config();
  RunState& rs = start.state;
  summary.warmstart_accuracy = rs.warmstart_accuracy;
  summary.heldout_n = rs.heldout_n;
  // Run time before this process (a resumed run continues its clocks).
  const double wall_base = rs.wall_seconds - (clock.Now() - t_start);
  auto wall_now = [&] { return wall_base + clock.Now() - t_start; };

  // --- learner, hub, actors ------------------------------------------------------------
  learn::Learner learner(start.model, options.learner);
  sched::Dispatcher dispatcher({options.staleness, options.groups_per_step, options.lease_seconds}, &clock);
  const sched::StalenessGate gate(options.staleness);
  LocalHub hub(&dispatcher, task.get(), &vocab, mcfg.vocab_size, static_cast<int>(options.group_size));
  if (resume) {
    std::map<std::string, at::Tensor> reference;
    if (options.learner.loss.kl_coef > 0) {
      ECHELON_ASSIGN_OR_RETURN(model::LoadedCheckpoint ws, model::LoadCheckpoint((ckpt_dir / "warmstart").string()));
      reference = ws.model->StateDict();
    }
    const std::string where = "resuming from " + start.resumed_from;
    ECHELON_RETURN_IF_ERROR(learner.Restore(rs.version, start.optimizer, reference).WithContext(where));
    ECHELON_RETURN_IF_ERROR(dispatcher.Restore(rs.dispatcher, FreshLeaseBase(rs.dispatcher.next_lease)).WithContext(where));
    ECHELON_RETURN_IF_ERROR(RestoreRngState(rs.rng_state_hex).WithContext(where));
    hub.RestoreCounters(rs.refusals, rs.accepted_tokens, rs.actor_groups);
    ++rs.resumes;
    const sched::DispatchCounts c = dispatcher.counts();
    ECHELON_RETURN_IF_ERROR(metrics.Write({{"event", "resume"},
                                           {"version", rs.version},
                                           {"from", start.resumed_from},
                                           {"skipped", start.skipped},
                                           {"discarded_metrics_lines", start.discarded_lines},
                                           {"groups_reissued", c.reissued},
                                           {"groups_awaiting_reissue", c.awaiting_reissue},
                                           {"resumes", rs.resumes},
                                           {"wall_s", wall_now()}}));
  }
  // Snapshots to remote actors by peer-assisted broadcast; actors that cannot join pull them
  // from the hub directly.
  SnapshotPublisher publisher(&hub);
  if (network != nullptr && options.snapshot_broadcast) {
    ECHELON_RETURN_IF_ERROR(publisher.StartBroadcast(*network, &clock).WithContext("snapshot broadcast origin"));
  }
  const net::BroadcastOrigin* origin = publisher.origin();
  ECHELON_ASSIGN_OR_RETURN(rollout::Snapshot snap0, MakeSnapshot(learner.model(), learner.version()));
  publisher.Publish(std::move(snap0));

  LoopState st;
  st.busy_seconds = rs.busy_seconds;
  st.consumed_tokens = rs.consumed_tokens;
  const double rl_base = rs.rl_wall_seconds;
  double t_rl = clock.Now();
  // Everything a resumed run needs, as of now (call between learner updates).
  auto save_state = [&]() -> Status {
    rs.version = learner.version();
    rs.wall_seconds = wall_now();
    rs.rl_wall_seconds = rl_base + clock.Now() - t_rl;
    rs.busy_seconds = st.busy_seconds;
    rs.consumed_tokens = st.consumed_tokens;
    rs.metrics_bytes = metrics.bytes();
    rs.dispatcher = dispatcher.Export();
    rs.refusals = hub.refusals();
    rs.accepted_tokens = hub.accepted_tokens();
    rs.actor_groups = hub.actor_groups();
    rs.rng_state_hex = CaptureRngState();
    return SaveRunCheckpoint(ckpt_dir.string(), learner, vocab, rs, options.checkpoint_keep)
        .WithContext("checkpoint at version " + std::to_string(rs.version));
  };
  // A fresh run is resumable from the first update on.
  if (!resume) ECHELON_RETURN_IF_ERROR(save_state());

  std::unique_ptr<net::LearnerServer> server;
  std::unique_ptr<obs::MetricsHttpServer> http;
  if (network != nullptr) {
    net::LearnerServerOptions so;
    so.listen = network->listen;
    so.token = network->token;
    so.tls_cert_file = network->tls_cert_file;
    so.tls_key_file = network->tls_key_file;
    so.heartbeat_seconds = network->heartbeat_seconds;
    so.evict_after_seconds = network->evict_after_seconds;
    so.run_spec_json = MakeRunSpec(options, mcfg, vocab).dump();
    if (origin) {
      so.broadcast_port = origin->port();
      so.broadcast_key_pem = origin->public_key().ToPem();
    }
    server = std::make_unique<net::LearnerServer>(so, &hub, &hub, &hub, &clock);
    ECHELON_RETURN_IF_ERROR(server->Start());
    progress << "learner serving actors on port " << server->port() << std::endl;
    if (origin) progress << "snapshot broadcast origin on port " << origin->port() << std::endl;
    if (network->metrics_port >= 0) {
      http = std::make_unique<obs::MetricsHttpServer>();
      ECHELON_RETURN_IF_ERROR(http->Start("0.0.0.0", network->metrics_port));
      progress << "metrics at http://0.0.0.0:" << http->port() << "/metrics" << std::endl;
    }
    if (network->on_listening) network->on_listening(server->port());
  }

  std::atomic<bool> stop_actors{false};
  std::vector<std::unique_ptr<rollout::Actor>> actors;
  std::vector<std::thread> threads;
  const int64_t thread_actors = network != nullptr ? 0 : options.actors;
  for (int64_t i = 0; i < thread_actors; ++i) {
    auto policy = std::make_unique<rollout::ModelPolicy>(model::Qwen3Model(mcfg), vocab, RolloutSampling(options));
    rollout::ActorOptions ao;
    ao.name = "actor-" + std::to_string(i);
    ao.seed = options.seed;
    ao.slowdown = options.actor_slowdowns.empty() ? 1.0 : options.actor_slowdowns[i];
    actors.push_back(std::make_unique<rollout::Actor>(ao, &hub, &hub, &hub, task.get(), std::move(policy)));
  }
  for (auto& a : actors) threads.emplace_back([&stop_actors, actor = a.get()] { actor->Run(stop_actors); });
  auto join_actors = [&] {
    stop_actors = true;
    for (auto& t : threads) t.join();
    threads.clear();
  };

  // Refusals by reason: the hub's (bad submissions) and the server's (auth, evictions, ...).
  auto all_refusals = [&] {
    std::map<std::string, int64_t> out = hub.refusals();
    if (server)
      for (const auto& [reason, n] : server->Counters()) out[reason] += n;
    return out;
  };

  if (server && options.wait_for_actors > 0) {
    progress << "waiting for " << options.wait_for_actors << " actors to register" << std::endl;
    const double since = clock.Now();
    while (static_cast<int64_t>(server->Actors().size()) < options.wait_for_actors) {
      if (interrupt != nullptr && interrupt->load()) break;
      if (clock.Now() - since > options.stall_timeout_seconds)
        return Aborted("only " + std::to_string(server->Actors().size()) + " of " +
                       std::to_string(options.wait_for_actors) + " actors registered within " +
                       FormatDuration(options.stall_timeout_seconds) + " (rollout.wait_for_actors)");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // --- the learner loop ------------------------------------------------------------------
  t_rl = clock.Now();
  auto rl_wall_now = [&] { return rl_base + clock.Now() - t_rl; };
  double last_arrival = t_rl;
  Status failure;
  for (int64_t t = learner.version(); t < options.steps; ++t) {
    const double step_start = clock.Now();
    std::vector<rollout::GroupRollout> batch;
    std::vector<int64_t> staleness;
    while (static_cast<int64_t>(batch.size()) < options.groups_per_step) {
      if (interrupt != nullptr && interrupt->load()) break;
      while (!st.buffer.empty() && static_cast<int64_t>(batch.size()) < options.groups_per_step) {
        rollout::GroupRollout g = std::move(st.buffer.front());
        st.buffer.pop_front();
        if (!gate.Admits(g.behavior_version, t)) {
          dispatcher.Settle(g.group_id, sched::Outcome::kDroppedStale);
          continue;
        }
        staleness.push_back(t - g.behavior_version);
        batch.push_back(std::move(g));
      }
      if (static_cast<int64_t>(batch.size()) >= options.groups_per_step) break;
      std::vector<rollout::GroupRollout> got = hub.Drain(0.05);
      if (!got.empty()) last_arrival = clock.Now();
      for (auto& g : got) st.buffer.push_back(std::move(g));
      dispatcher.ExpireLeases();
      if (server)
        for (const std::string& id : server->EvictSilent()) dispatcher.Evict(id);
      if (clock.Now() - last_arrival > options.stall_timeout_seconds) {
        failure = Aborted("no rollout arrived for " + FormatDuration(options.stall_timeout_seconds) +
                          " (rollout.stall_timeout_seconds); every actor is failing or stuck");
        break;
      }
    }
    if (!failure.ok() || static_cast<int64_t>(batch.size()) < options.groups_per_step) {
      // Interrupted or failed: groups taken for this batch were not consumed; let them expire.
      break;
    }
    // One order whatever the arrival order: the update is then a function of the groups alone.
    std::sort(batch.begin(), batch.end(), [](const auto& a, const auto& b) { return a.group_id < b.group_id; });

    std::vector<learn::LearnerGroup> groups;
    std::vector<uint64_t> group_ids;
    double reward_sum = 0, success_sum = 0;
    int64_t episodes = 0;
    for (const rollout::GroupRollout& g : batch) {
      groups.push_back({g.behavior_version, g.episodes});
      group_ids.push_back(g.group_id);
      for (const data::Episode& e : g.episodes) {
        reward_sum += e.reward;
        success_sum += e.success ? 1 : 0;
        ++episodes;
      }
    }
    const double train_start = clock.Now();
    Result<learn::StepStats> stats = learner.Step(groups);
    if (!stats.ok()) {
      failure = stats.status().WithContext("learner step " + std::to_string(t));
      break;
    }
    st.busy_seconds += clock.Now() - train_start;
    st.consumed_tokens += stats->tokens;
    for (const rollout::GroupRollout& g : batch) dispatcher.Settle(g.group_id, sched::Outcome::kConsumed);

    const int64_t version = learner.version();
    if (version % options.publish_period == 0 || version == options.steps) {
      Result<rollout::Snapshot> snap = MakeSnapshot(learner.model(), version);
      if (!snap.ok()) {
        failure = snap.status();
        break;
      }
      publisher.Publish(std::move(snap).value());
    }
    // After the last update nothing more is consumed: admit no new work for it.
    if (version < options.steps) dispatcher.SetVersion(version);

    // --- metrics and progress ---
    const double rl_wall = rl_wall_now();
    const int64_t generated_tokens = hub.accepted_tokens();
    double stale_sum = 0;
    int64_t stale_max = 0;
    std::map<std::string, int64_t> stale_hist;
    for (int64_t s : staleness) {
      stale_sum += s;
      stale_max = std::max(stale_max, s);
      ++stale_hist[std::to_string(s)];
    }
    const std::map<std::string, int64_t> refused = all_refusals();
    // Mean learner/actor log-prob gap per actor name: a bad or mismatched worker stands out.
    std::map<std::string, double> actor_gap;
    std::map<std::string, int> actor_gap_n;
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::string name = batch[i].actor.substr(0, batch[i].actor.find('#'));
      actor_gap[name] += stats->group_logprob_gap[i];
      ++actor_gap_n[name];
    }
    for (auto& [name, gap] : actor_gap) gap /= actor_gap_n[name];
    const sched::DispatchCounts c = dispatcher.counts();
    nlohmann::json line = {{"step", t},
                           {"version", version},
                           {"wall_s", wall_now()},
                           {"step_s", clock.Now() - step_start},
                           {"reward_mean", reward_sum / episodes},
                           {"accuracy", success_sum / episodes},
                           {"staleness_mean", stale_sum / staleness.size()},
                           {"staleness_max", stale_max},
                           {"staleness_bound", options.staleness},
                           {"staleness_hist", stale_hist},
                           {"consumed_groups", group_ids},
                           {"refused", refused},
                           {"groups_consumed", c.consumed},
                           {"groups_dropped_stale", c.dropped_stale},
                           {"groups_reissued", c.reissued},
                           {"groups_issued", c.handed_out},
                           {"groups_in_flight", c.outstanding + c.pending},
                           {"actors", server ? server->Actors().size() : actors.size()},
                           {"actor_groups", hub.actor_groups()},
                           {"learner_busy_frac", st.busy_seconds / std::max(rl_wall, 1e-9)},
                           {"loss", stats->loss},
                           {"grad_norm", stats->grad_norm},
                           {"clip_frac", stats->clip_frac},
                           {"kl", stats->kl},
                           {"behav_weight_mean", stats->behav_weight_mean},
                           {"logprob_gap", stats->logprob_gap},
                           {"actor_logprob_gap", actor_gap},
                           {"zero_spread_groups", stats->zero_spread_groups},
                           {"tokens", stats->tokens},
                           {"tokens_per_s", generated_tokens / std::max(rl_wall, 1e-9)}};
    if (origin)
      if (std::optional<std::pair<int64_t, double>> b = publisher.TakeCompletedBroadcast()) {
        line["broadcast_version"] = b->first;
        line["broadcast_s"] = b->second;
      }
    const bool eval_now = options.eval_every > 0 && version % options.eval_every == 0 && version != options.steps;
    if (eval_now) {
      rollout::EvalResult ev = EvaluateModel(learner.model(), vocab, *task, options.max_new_tokens);
      line["heldout_accuracy"] = ev.accuracy;
    }
    if (http) PublishGauges(line, *http);
    Status ws = metrics.Write(line);
    if (!ws.ok()) {
      failure = ws;
      break;
    }
    const double eta = rl_wall / (t + 1) * (options.steps - t - 1);
    progress << "step " << t + 1 << "/" << options.steps << " v" << version << std::fixed << std::setprecision(3)
             << " reward " << reward_sum / episodes << " acc " << success_sum / episodes << std::setprecision(2)
             << " stale " << stale_sum / staleness.size() << "/" << stale_max << " (S=" << options.staleness << ")"
             << " drop " << c.dropped_stale << " reissue " << c.reissued << std::setprecision(0) << " tok/s "
             << generated_tokens / std::max(rl_wall, 1e-9) << std::setprecision(2) << " busy "
             << st.busy_seconds / std::max(rl_wall, 1e-9) << " eta " << FormatDuration(eta);
    if (eval_now) progress << std::setprecision(3) << " heldout " << line["heldout_accuracy"].get<double>();
    progress << std::endl;
    if (options.checkpoint_every > 0 && version % options.checkpoint_every == 0 && version != options.steps) {
      failure = save_state();
      if (!failure.ok()) break;
    }
  }
  join_actors();
  if (server) server->SetDone();  // before the version moves on: no hand-outs after the run
  dispatcher.SetVersion(learner.version());
  summary.steps_done = learner.version();
  // Whatever ended the loop, the run can continue from here (a failed write is reported).
  if (learner.version() != rs.version || learner.version() == options.steps) {
    Status saved = save_state();
    if (!saved.ok() && failure.ok()) failure = saved;
    if (saved.ok()) progress << "resumable checkpoint " << (ckpt_dir / ("step-" + std::to_string(learner.version()))).string()
                             << std::endl;
  }
  if (!failure.ok()) return failure;
  summary.interrupted = learner.version() < options.steps;

  if (!summary.interrupted)
    ECHELON_RETURN_IF_ERROR(model::SaveCheckpoint((ckpt_dir / "final").string(), learner.model(), vocab));
  rollout::EvalResult after = EvaluateModel(learner.model(), vocab, *task, options.max_new_tokens);
  summary.final_accuracy = after.accuracy;
  summary.wall_seconds = wall_now();
  const sched::DispatchCounts c = dispatcher.counts();
  const std::map<std::string, int64_t> refused = all_refusals();
  ECHELON_RETURN_IF_ERROR(metrics.Write({{"event", summary.interrupted ? "interrupted" : "final"},
                                         {"version", learner.version()},
                                         {"heldout_accuracy", after.accuracy},
                                         {"heldout_n", after.n},
                                         {"warmstart_heldout_accuracy", rs.warmstart_accuracy},
                                         {"groups_issued", c.handed_out},
                                         {"groups_consumed", c.consumed},
                                         {"groups_dropped_stale", c.dropped_stale},
                                         {"groups_reissued", c.reissued},
                                         {"groups_in_flight", c.outstanding + c.pending},
                                         {"actor_groups", hub.actor_groups()},
                                         {"refused", refused},
                                         {"learner_busy_frac", st.busy_seconds / std::max(rl_wall_now(), 1e-9)},
                                         {"wall_s", summary.wall_seconds}}));
  // Let every actor hear that the run is over (they poll at least every heartbeat).
  if (server) server->WaitUntilActorsTold(3 * network->heartbeat_seconds + 1.0);
  publisher.Shutdown();
  return summary;
}

}  // namespace echelon::cli
