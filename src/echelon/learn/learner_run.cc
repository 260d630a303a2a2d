#include "echelon/learn/learner_run.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <memory>
#include <optional>
#include <set>

#include "echelon/common/process.h"
#include "echelon/learn/batch_collector.h"
#include "echelon/learn/learner_ranks.h"
#include "echelon/learn/run_checkpoint.h"
#include "echelon/learn/run_start.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/learn/worker_stats.h"
#include "echelon/model/checkpoint.h"
#include "echelon/obs/metrics_http.h"
#include "echelon/obs/prometheus_catalog.h"
#include "echelon/obs/metrics_log.h"
#include "echelon/obs/step_record.h"
#include "echelon/contract/run_spec.h"
#include "echelon/sched/dispatcher.h"

namespace echelon::learn {
namespace fs = std::filesystem;
namespace {

// Completions written to samples.jsonl per update: enough to read what the policy writes as a run
// goes, few enough that the file stays a small fraction of the run directory (a 20k-token
// completion is ~80 KB; four per update over 1,000 updates is ~320 MB at that length).
constexpr size_t kSamplesPerStep = 4;

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream ss;
  if (s >= 3600) ss << s / 3600 << "h";
  if (s >= 60) ss << (s / 60) % 60 << "m";
  ss << s % 60 << "s";
  return ss.str();
}

void WarnAboutUnclippedCorrection(const RunOptions& options) {
  const Correction c = options.learner.loss.correction;
  // none and m2po clip the ratio to the behaviour policy.
  if (c == Correction::kNone || c == Correction::kM2po || options.learner.minibatches > 1) return;
  spdlog::warn("rl.correction {} with rl.minibatches 1: the ratio to pi_prox is exactly 1, so nothing is "
               "clipped; at S = 16 and rl.lr 3e-4 tis and decoupled fell below the warm-start, at rl.lr 7.5e-5 "
               "they matched `none` (docs/RESULTS.md)",
               c == Correction::kTruncatedIS ? "tis" : c == Correction::kDecoupled ? "decoupled" : "icepop");
}

// RUN_DIR/verifier, owner-only and empty: where the verifier keeps its older snapshots (files a
// run that stopped left behind are of versions the new process never published).
Result<std::string> VerifierSpillDir(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "verifier";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return Internal(dir.string() + ": cannot create the verifier's directory: " + ec.message());
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  return dir.string();
}

// One run of the learning plane; RunLearner's body, cut into its named steps.
class LearnerRun {
 public:
  LearnerRun(const RunOptions& options, const LearnerRunArgs& args, ActorTransport& transport,
             const ModelEvaluator& evaluate, const std::atomic<bool>* interrupt, std::ostream& progress,
             const Clock& clock)
      : options_(options),
        args_(args),
        transport_(transport),
        evaluate_(options.eval_heldout ? evaluate : NoHeldOut),
        interrupt_(interrupt),
        progress_(progress),
        clock_(clock),
        t_start_(clock.Now()),
        ckpt_dir_(fs::path(args.run_dir) / "checkpoints") {
    summary_.run_dir = args.run_dir;
  }
  // The transport serves the intake: it stops before the intake goes, whatever ended the run.
  ~LearnerRun() { CloseTransport(); }

  Result<RunSummary> Run() {
    ECHELON_RETURN_IF_ERROR(Prepare());
    ECHELON_RETURN_IF_ERROR(StartActors());
    return Finish(Loop());
  }

 private:
  // --- set-up ------------------------------------------------------------------------------
  Status Prepare() {
    WarnAboutUnclippedCorrection(options_);
    ECHELON_ASSIGN_OR_RETURN(secret_, RunSecretFor(options_, args_.run_dir, args_.resume, progress_));
    // The learner's own adapter draws training deals and episodes from the secret (the task's
    // `secret` option, which the run spec never carries).
    data::AdapterOptions task_options = options_.task_options;
    if (const data::OptionTable* table = data::AdapterOptionTable(options_.task_name))
      for (const data::OptionSpec& o : *table)
        if (o.name == "secret") task_options["secret"] = secret_.Hex();
    ECHELON_ASSIGN_OR_RETURN(task_, data::CreateAdapter(options_.task_name, task_options));
    ECHELON_RETURN_IF_ERROR(task_->ReadyToTrain());
    // Sharded parameters over several ranks: rank 0 cuts a checkpoint unit by unit from its files
    // mapped, never resident whole (Learner::ShardsFromRankZero).
    const bool mapped = options_.learner.shard == Shard::kParams && args_.ranks && args_.ranks->world > 1;
    ECHELON_ASSIGN_OR_RETURN(start_, args_.resume ? StartFromCheckpoint(options_, *task_, args_.run_dir, metrics_,
                                                                        progress_, mapped)
                                                  : StartFresh(options_, *task_, args_.run_dir, args_.resolved_yaml,
                                                               evaluate_, metrics_, progress_, clock_, t_start_));
    ECHELON_RETURN_IF_ERROR(KeepRunSecret(options_, args_.run_dir, secret_));
    const RunState& rs = start_.state;
    ECHELON_RETURN_IF_ERROR(OpenSamples(rs));
    summary_.warmstart_accuracy = rs.warmstart_accuracy;
    summary_.heldout_n = rs.heldout_n;
    wall_base_ = rs.wall_seconds - (clock_.Now() - t_start_);  // run time before this process
    if (args_.ranks && args_.ranks->world > 1) {
      progress_ << "learner ranks: waiting for " << args_.ranks->world - 1 << " to join" << std::endl;
      ECHELON_ASSIGN_OR_RETURN(std::unique_ptr<RankGroup> group, RankGroup::Connect(*args_.ranks));
      ranks_ = std::make_unique<LearnerRanks>(std::move(group));
    }
    LearnerOptions learner = options_.learner;
    learner.max_new_tokens = options_.max_new_tokens;  // what tells a truncated completion
    learner.stop_ids = start_.vocab.stop_ids();
    learner_ = std::make_unique<Learner>(start_.model, learner, ranks_ ? ranks_->group() : nullptr);
    dispatcher_ = std::make_unique<sched::Dispatcher>(
        sched::DispatcherOptions{options_.staleness, options_.groups_per_step, options_.lease_seconds,
                                 options_.max_leases_per_worker, sched::kMaxLeaseLifeFactor,
                                 // the most a group's progress reports can count
                                 options_.group_size * static_cast<int64_t>(task_->MaxTurns()) * options_.max_new_tokens,
                                 options_.dispatch == "deadline" ? sched::kDeadlineLookahead : 0,
                                 [task = task_.get()](uint64_t group) { return task->TrainPromptKey(group); }},
        &clock_);
    intake_ = std::make_unique<TrajectoryIntake>(
        dispatcher_.get(), task_.get(), &start_.vocab,
        IntakeLimits{start_.model->config().vocab_size, options_.group_size, options_.max_new_tokens, secret_,
                     options_.resume, options_.learner.router_replay ? &start_.model->config() : nullptr});
    ECHELON_ASSIGN_OR_RETURN(const std::string spill, VerifierSpillDir(args_.run_dir));
    verifier_ = std::make_unique<BehaviourVerifier>(
        start_.model->config(), VerifierOptions(options_, secret_, task_->SamplesWithGroupSeed(), spill));
    intake_->SetVerifier(verifier_.get());
    ECHELON_RETURN_IF_ERROR(SetUpEvaluation(task_options));
    publisher_ = std::make_unique<SnapshotPublisher>(intake_.get(), &transport_);
    if (options_.staleness_control) control_.emplace(*options_.staleness_control);
    if (args_.resume) ECHELON_RETURN_IF_ERROR(Restore());
    // A resumed run's rounds go on from its schedule: the version it resumes at had its round.
    if (args_.resume) next_round_ = NextRound(learner_->version());
    if (control_) ApplyStaleness();
    if (ranks_) {
      ECHELON_RETURN_IF_ERROR(ranks_->Setup(*learner_, start_.optimizer, reference_));
      progress_ << "learner ranks: " << ranks_->world() << " (data-parallel, rendezvous port "
                << ranks_->group()->port() << ")" << std::endl;
    }
    start_.optimizer.clear();  // now inside the optimizers: keep no second copy
    reference_.clear();
    busy_seconds_ = rs.busy_seconds;
    consumed_tokens_ = rs.consumed_tokens;
    rl_base_ = rs.rl_wall_seconds;
    t_rl_ = clock_.Now();
    // A fresh run is resumable from the first update on.
    if (!args_.resume) ECHELON_RETURN_IF_ERROR(SaveState());
    return Status::Ok();
  }

  // Weights are loaded; the rest of the checkpoint: optimizer, version, dispatcher, RNG, counters.
  Status Restore() {
    RunState& rs = start_.state;
    if (options_.learner.loss.kl_coef > 0 && !learner_->model()->config().lora.on()) {  // LoRA's: its base
      ECHELON_ASSIGN_OR_RETURN(model::LoadedCheckpoint ws, model::LoadCheckpoint((ckpt_dir_ / "warmstart").string(),
                                                                                 learner_->parameters_sharded()));
      reference_ = ws.model->StateDict();
    }
    const std::string where = "resuming from " + start_.resumed_from;
    ECHELON_RETURN_IF_ERROR(learner_->Restore(rs.version, start_.optimizer, reference_).WithContext(where));
    ECHELON_RETURN_IF_ERROR(
        dispatcher_->Restore(rs.dispatcher, FreshLeaseBase(rs.dispatcher.next_lease)).WithContext(where));
    ECHELON_RETURN_IF_ERROR(RestoreRngState(rs.rng_state_hex).WithContext(where));
    if (control_ && !rs.staleness_control.is_null())
      ECHELON_RETURN_IF_ERROR(control_->Restore(rs.staleness_control, where));
    intake_->RestoreCounters(rs.refusals, rs.accepted_tokens, rs.actor_groups, rs.actor_forged);
    ++rs.resumes;
    const sched::DispatchCounts c = dispatcher_->counts();
    return metrics_.Write({{"event", "resume"},
                           {"version", rs.version},
                           {"from", start_.resumed_from},
                           {"skipped", start_.skipped},
                           {"discarded_metrics_lines", start_.discarded_lines},
                           {"groups_reissued", c.reissued},
                           {"groups_awaiting_reissue", c.awaiting_reissue},
                           {"resumes", rs.resumes},
                           {"wall_s", WallNow()}});
  }

  // The transport starts serving, the current policy is published, enough actors are there.
  Status StartActors() {
    contract::RunSpec spec{options_.task_name, options_.task_options, start_.model->config(), start_.vocab,
                          RolloutSampling(options_), options_.partial,
                          // multi-turn groups are played here, each turn's draws known
                          options_.verify_draws && (task_->SamplesWithGroupSeed() || task_->MaxTurns() > 1)};
    transport_started_ = true;
    ECHELON_RETURN_IF_ERROR(transport_.Start(intake_.get(), contract::RunSpecToJson(spec).dump(), progress_));
    if (args_.metrics_port >= 0) {
      http_ = std::make_unique<obs::MetricsHttpServer>();
      ECHELON_RETURN_IF_ERROR(http_->Start("0.0.0.0", args_.metrics_port));
      progress_ << "metrics at http://0.0.0.0:" << http_->port() << "/metrics" << std::endl;
    }
    ECHELON_RETURN_IF_ERROR(Publish());
    if (options_.wait_for_actors <= 0) return Status::Ok();
    progress_ << "waiting for " << options_.wait_for_actors << " actors to register" << std::endl;
    const double since = clock_.Now();
    while (transport_.live_actors() < options_.wait_for_actors && !Interrupted()) {
      if (clock_.Now() - since > options_.stall_timeout_seconds)
        return Aborted("only " + std::to_string(transport_.live_actors()) + " of " +
                       std::to_string(options_.wait_for_actors) + " actors registered within " +
                       FormatDuration(options_.stall_timeout_seconds) + " (rollout.wait_for_actors)");
      clock_.SleepFor(sched::kLearnerPollSeconds);
    }
    return Status::Ok();
  }

  // The policy of the learner's version to the actors, and a round of the evaluation sets on it
  // when one is due (every eval.every versions, and the last).
  Status Publish() {
    if (!learner_->parameters_sharded()) {
      ECHELON_RETURN_IF_ERROR(publisher_->Publish(learner_->model(), learner_->version()));
    } else {
      ECHELON_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> bytes, GatheredSnapshot());
      ECHELON_RETURN_IF_ERROR(publisher_->Publish(contract::Snapshot{learner_->version(), std::move(bytes), nullptr}));
    }
    const int64_t v = learner_->version();
    if (rounds_ && (v >= next_round_ || v == options_.steps)) {
      rounds_->Open(intake_->Latest());
      next_round_ = NextRound(v);
    }
    return Status::Ok();
  }

  // The version of the evaluation round after version `v`'s: the next multiple of eval.every,
  // or with 0 the last version.
  int64_t NextRound(int64_t v) const {
    return options_.eval_every > 0 ? (v / options_.eval_every + 1) * options_.eval_every : options_.steps;
  }

  // eval.sets (learn/eval_rounds.h) and eval.canaries (TrajectoryIntake::SetCanaries): each file
  // read by the task's adapter as its held-out file.
  Status SetUpEvaluation(const data::AdapterOptions& task_options) {
    if (options_.eval_sets.empty() && options_.canary_file.empty()) return Status::Ok();
    if (task_->MaxTurns() != 1)
      return InvalidArgument("eval.sets and eval.canaries: task " + options_.task_name +
                             " plays episodes of several turns; they are for single-turn tasks");
    using Set = std::shared_ptr<const data::TaskAdapter>;
    const auto read = [&](const std::string& key, const std::string& file) -> Result<Set> {
      data::AdapterOptions set_options = task_options;
      set_options.erase("eval_size");  // the held-out set is the file's
      set_options["eval_file"] = file;
      Result<std::unique_ptr<data::TaskAdapter>> set = data::CreateAdapter(options_.task_name, set_options);
      if (!set.ok()) return set.status().WithContext(key);
      if (set.value()->HeldOut().empty()) return InvalidArgument(key + ": " + file + " holds no prompts");
      return Set(std::move(set).value());
    };
    if (!options_.canary_file.empty()) {
      ECHELON_ASSIGN_OR_RETURN(Set canaries, read("eval.canaries.file", options_.canary_file));
      progress_ << "canaries: " << canaries->HeldOut().size() << " prompts from " << options_.canary_file << ", "
                << options_.canary_share << " of new groups" << std::endl;
      intake_->SetCanaries(std::move(canaries), options_.canary_share);
    }
    if (options_.eval_sets.empty()) return Status::Ok();
    std::vector<EvalSet> sets;
    for (const RunOptions::EvalSetOptions& o : options_.eval_sets) {
      ECHELON_ASSIGN_OR_RETURN(Set set, read("eval.sets." + o.name, o.file));
      progress_ << "evaluation set " << o.name << ": " << set->HeldOut().size() << " prompts from " << o.file
                << ", k " << o.k << ", temperature " << o.temperature << std::endl;
      sets.push_back({o.name, std::move(set), o.k, o.temperature});
    }
    rounds_ = std::make_unique<EvalRounds>(std::move(sets), EvalRoundsOptions{options_.lease_seconds}, &clock_);
    intake_->SetEvaluation(rounds_.get());
    return Status::Ok();
  }

  // One metrics line (and progress line) per set of each evaluation round finished since the
  // last call: {"event": "eval", "set", "version", "eval/SET": {mean_at_k, pass_at_k, k, prompts,
  // seconds}} (TensorBoard: eval/SET/mean_at_k at the round's version).
  Status WriteEvaluations() {
    if (!rounds_) return Status::Ok();
    for (const EvalSetResult& r : rounds_->TakeFinished()) {
      nlohmann::json line = {{"event", "eval"}, {"set", r.name}, {"version", r.version}, {"wall_s", WallNow()}};
      line["eval/" + r.name] = {{"mean_at_k", r.mean_at_k}, {"pass_at_k", r.pass_at_k}, {"k", r.k},
                                {"prompts", r.prompts}, {"seconds", r.seconds}};
      // Prometheus: the figures alone (the line's version is the round's, older than the learner's).
      if (http_)
        obs::PublishStepLine(nlohmann::json::object({{"eval/" + r.name, line["eval/" + r.name]}}), http_->registry());
      ECHELON_RETURN_IF_ERROR(metrics_.Write(line));
      progress_ << "eval v" << r.version << " " << r.name << ": mean@" << r.k << " " << std::fixed
                << std::setprecision(3) << r.mean_at_k << " pass@" << r.k << " " << r.pass_at_k << " (" << r.prompts
                << " prompts, " << FormatDuration(r.seconds) << ")" << std::endl;
    }
    return Status::Ok();
  }

  // The rounds still open when the updates are done (the last version's) are waited for while
  // the actors still take work, up to the stall timeout.
  Status AwaitEvaluation() {
    if (!rounds_) return Status::Ok();
    const double since = clock_.Now();
    if (const int64_t open = rounds_->open_rounds(); open > 0)
      progress_ << "waiting for " << open << " evaluation round(s) on the actors" << std::endl;
    while (rounds_->open_rounds() > 0 && !Interrupted()) {
      if (clock_.Now() - since > options_.stall_timeout_seconds) {
        spdlog::warn("{} evaluation round(s) did not finish within {} (rollout.stall_timeout_seconds); left out",
                     rounds_->open_rounds(), FormatDuration(options_.stall_timeout_seconds));
        break;
      }
      transport_.EvictSilent();
      clock_.SleepFor(sched::kLearnerPollSeconds);
    }
    return WriteEvaluations();
  }

  // Sharded parameters: the snapshot bytes of the learner's version (MakeSnapshot's form),
  // gathered from the ranks unit by unit, once per version.
  Result<std::shared_ptr<const std::string>> GatheredSnapshot() {
    if (snapshot_.version != learner_->version() || !snapshot_.weights) {
      snapshot_ = {};  // the previous version's bytes go before the next are gathered
      ECHELON_ASSIGN_OR_RETURN(
          snapshot_.weights, ranks_->WeightsBytes(*learner_, model::StorageDtype(learner_->model()->config())));
      snapshot_.version = learner_->version();
    }
    return snapshot_.weights;
  }

  // What evaluation reads: the learner's weights or, with sharded parameters, a model bound to
  // the bytes of this version's snapshot in the storage dtype (no whole fp32 copy).
  Result<model::Qwen3Model> PolicyToEvaluate() {
    if (!learner_->parameters_sharded()) return learner_->model();
    ECHELON_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> bytes, GatheredSnapshot());
    const model::ModelConfig& c = learner_->model()->config();
    ECHELON_ASSIGN_OR_RETURN(model::SafetensorsFile view, model::ViewSafetensors(*bytes, "gathered weights"));
    model::Qwen3Model m(c, model::Qwen3ModelImpl::Uninitialized{model::StorageDtype(c)});
    ECHELON_RETURN_IF_ERROR(m->BindStateDict(view.tensors, "gathered weights"));
    return m;
  }

  // The staleness bound in force: fixed, or rl.staleness: auto's current one.
  int64_t Staleness() const { return control_ ? control_->staleness() : options_.staleness; }

  // The controller's S into admission, and its learning rate into the learner (the ranks get
  // it with every step).
  void ApplyStaleness() {
    dispatcher_->SetMaxStaleness(control_->staleness());
    learner_->SetLearningRate(options_.learner.lr * control_->LrScale());
  }

  // --- the learner loop ----------------------------------------------------------------------
  Status Loop() {
    CollectorOptions co;
    co.max_staleness = Staleness();
    co.batch_groups = options_.groups_per_step;
    co.stall_timeout_seconds = options_.stall_timeout_seconds;
    co.dynamic_sampling = options_.dynamic_sampling;
    co.max_filtered_per_batch = options_.dynamic_sampling_max;
    BatchCollector collector(co, dispatcher_.get(), intake_.get(), [this] { return transport_.EvictSilent(); }, &clock_);
    t_rl_ = clock_.Now();
    for (int64_t t = learner_->version(); t < options_.steps; ++t) {
      const double step_start = clock_.Now();
      ECHELON_ASSIGN_OR_RETURN(std::optional<CollectedBatch> batch, collector.Collect(t, interrupt_));
      if (!batch) return Status::Ok();  // interrupted: groups taken so far stay pending, re-issued on resume
      ECHELON_ASSIGN_OR_RETURN(const StepStats stats, Update(*batch));
      collector.Commit(*batch);
      const int64_t version = learner_->version();
      if (version % options_.publish_period == 0 || version == options_.steps)
        ECHELON_RETURN_IF_ERROR(Publish());
      // After the last update nothing more is consumed: admit no new work for it.
      if (version < options_.steps) dispatcher_->SetVersion(version);
      ECHELON_RETURN_IF_ERROR(Record(t, *batch, stats, step_start));
      if (control_ && version < options_.steps) {
        if (std::optional<sched::StalenessChange> change =
                control_->Observe({stats.health.ess_frac(), last_train_seconds_, batch->wait_seconds})) {
          ApplyStaleness();
          collector.assembler().SetMaxStaleness(change->to);
          ECHELON_RETURN_IF_ERROR(metrics_.Write({{"event", "staleness"},
                                                  {"version", version},
                                                  {"from", change->from},
                                                  {"to", change->to},
                                                  {"reason", change->reason},
                                                  {"lr", learner_->options().lr},
                                                  {"wall_s", WallNow()}}));
          progress_ << "staleness: S " << change->from << " -> " << change->to << " (" << change->reason << "), lr "
                    << std::defaultfloat << std::setprecision(3) << learner_->options().lr << std::endl;
        }
      }
      if (options_.checkpoint_every > 0 && version % options_.checkpoint_every == 0 && version != options_.steps)
        ECHELON_RETURN_IF_ERROR(SaveState());
    }
    return Status::Ok();
  }

  Result<StepStats> Update(const CollectedBatch& batch) {
    std::vector<LearnerGroup> groups;
    groups.reserve(batch.groups.size());
    for (const contract::GroupRollout& g : batch.groups) groups.push_back({g.behavior_version, g.episodes});
    const double t0 = clock_.Now();
    if (ranks_) ECHELON_RETURN_IF_ERROR(ranks_->SendStep(groups, learner_->options().lr));
    Result<StepStats> stats = learner_->Step(groups);
    if (!stats.ok()) return stats.status().WithContext("learner step " + std::to_string(learner_->version()));
    for (size_t i : stats->nonfinite_groups)
      spdlog::warn("step {}: group {} from {} was in a minibatch whose loss or gradient was not finite (skipped)",
                   learner_->version(), batch.groups[i].group_id, batch.groups[i].actor);
    last_train_seconds_ = clock_.Now() - t0;
    busy_seconds_ += last_train_seconds_;
    consumed_tokens_ += stats->tokens;
    return stats;
  }

  // samples.jsonl, the completions a user reads when a run degrades: opened fresh, or on resume cut
  // back to where the checkpoint was (the cut lines go to samples.discarded.jsonl).
  Status OpenSamples(const RunState& rs) {
    const std::string path = (fs::path(args_.run_dir) / "samples.jsonl").string();
    if (args_.resume && fs::exists(path)) {
      ECHELON_RETURN_IF_ERROR(
          obs::MetricsLog::RollBack(path, rs.samples_bytes,
                                    (fs::path(args_.run_dir) / "samples.discarded.jsonl").string())
              .status());
    }
    return samples_.Open(path);
  }

  // The first episode of the batch's first kSamplesPerStep groups, one line each: prompt,
  // completion (the learner's decoding), reward, version and worker; the same as one markdown
  // text at the step in TensorBoard's Text tab.
  Status WriteSamples(int64_t t, const CollectedBatch& batch) {
    std::string markdown;
    for (size_t i = 0; i < batch.groups.size() && i < kSamplesPerStep; ++i) {
      const contract::GroupRollout& g = batch.groups[i];
      if (g.episodes.empty() || g.episodes.front().turns.empty()) continue;
      const data::Episode& e = g.episodes.front();
      const std::string& completion = e.turns.back().text;
      ECHELON_RETURN_IF_ERROR(samples_.Write({{"step", t},
                                              {"version", learner_->version()},
                                              {"group", g.group_id},
                                              {"behavior_version", g.behavior_version},
                                              {"worker", ActorName(g.actor)},
                                              {"prompt", g.prompt.text},
                                              {"completion", completion},
                                              {"turns", e.turns.size()},
                                              {"reward", e.reward}}));
      std::ostringstream md;
      md << "**group " << g.group_id << "** · worker " << ActorName(g.actor) << " · behaviour version "
         << g.behavior_version << " · reward " << e.reward << "\n\n" << CodeBlock(g.prompt.text) << "\n"
         << CodeBlock(completion) << "\n";
      markdown += md.str();
    }
    if (markdown.empty()) return Status::Ok();
    return metrics_.MirrorText(t, "samples", markdown);
  }

  // A fenced markdown code block whose fence is longer than any run of backticks in `text`.
  static std::string CodeBlock(const std::string& text) {
    size_t longest = 0, run = 0;
    for (char c : text) longest = std::max(longest, run = c == '`' ? run + 1 : 0);
    const std::string fence(std::max<size_t>(3, longest + 1), '`');
    return fence + "\n" + text + "\n" + fence + "\n";
  }

  // The update's metrics line (obs/step_record.h), Prometheus gauges and progress line.
  Status Record(int64_t t, const CollectedBatch& batch, const StepStats& stats, double step_start) {
    for (const std::string& w : dispatcher_->capped_workers())
      if (warned_capped_.insert(w).second)
        spdlog::warn("worker {} holds rollout.max_leases_per_worker ({}) groups: its other actors get no work until "
                     "one returns (raise the cap if it runs more actor processes on one token)",
                     w, options_.max_leases_per_worker);
    obs::StepRecord r = MakeRecord(t, batch, stats, step_start);
    const bool eval_now = options_.eval_heldout && options_.eval_every > 0 && *r.version % options_.eval_every == 0 &&
                          *r.version != options_.steps;
    if (eval_now) {
      ECHELON_ASSIGN_OR_RETURN(model::Qwen3Model policy, PolicyToEvaluate());
      ECHELON_ASSIGN_OR_RETURN(const data::EvalResult ev, evaluate_(policy, start_.vocab, *task_, options_.max_new_tokens));
      r.heldout_accuracy = ev.accuracy;
    }
    const nlohmann::json line = r.ToJson();
    if (http_) obs::PublishStepLine(line, http_->registry());
    ECHELON_RETURN_IF_ERROR(metrics_.Write(line));
    ECHELON_RETURN_IF_ERROR(WriteSamples(t, batch));
    ECHELON_RETURN_IF_ERROR(WriteEvaluations());
    const double eta = RlWallNow() / (t + 1) * (options_.steps - t - 1);
    progress_ << "step " << t + 1 << "/" << options_.steps << " v" << *r.version << std::fixed << std::setprecision(3)
              << " reward " << r.reward_mean << " acc " << r.accuracy << std::setprecision(2) << " stale "
              << r.staleness_mean << "/" << *r.staleness_max << " (S=" << Staleness() << ")"
              << " drop " << *r.groups_dropped_stale << " reissue " << *r.groups_reissued << std::setprecision(0)
              << " tok/s " << r.tokens_per_s << std::setprecision(2) << " busy " << r.learner_busy_frac << " eta "
              << FormatDuration(eta);
    if (eval_now) progress_ << std::setprecision(3) << " heldout " << r.heldout_accuracy;
    progress_ << std::endl;
    return Status::Ok();
  }

  obs::StepRecord MakeRecord(int64_t t, const CollectedBatch& batch, const StepStats& stats, double step_start) {
    obs::StepRecord r;
    r.step = t;
    r.version = learner_->version();
    r.wall_s = WallNow();
    r.step_s = clock_.Now() - step_start;
    r.wait_s = batch.wait_seconds;
    r.train_s = last_train_seconds_;
    double reward_sum = 0, success_sum = 0, stale_sum = 0;
    int64_t episodes = 0, stale_max = 0, moved = 0, length_max = 0, turns = 0;
    double length_sum = 0;
    std::map<std::string, int> gap_n;
    std::map<std::string, ImportanceSums> by_bin;
    StepStats::RouteCounts routes;  // router replay's, over the batch
    for (size_t i = 0; i < batch.groups.size(); ++i) {
      const contract::GroupRollout& g = batch.groups[i];
      GroupSummary summary;
      int64_t group_turns = 0;
      for (const data::Episode& e : g.episodes) {
        summary.reward_mean += e.reward / static_cast<double>(g.episodes.size());
        reward_sum += e.reward;
        success_sum += e.success ? 1 : 0;
        for (const data::Turn& turn : e.turns) {
          for (int64_t v : turn.versions) moved += v > g.behavior_version ? 1 : 0;
          const int64_t length = static_cast<int64_t>(turn.tokens.size());
          length_sum += static_cast<double>(length);
          length_max = std::max(length_max, length);
          summary.length_mean += static_cast<double>(length);
          ++group_turns;
          ++turns;
        }
        for (const auto& [name, value] : e.metrics) r.reward_metrics[name] += value;
        ++episodes;
      }
      const int64_t staleness = t - g.behavior_version;
      stale_sum += staleness;
      stale_max = std::max(stale_max, staleness);
      ++r.staleness_hist[staleness];
      if (i < stats.group_importance.size()) by_bin[obs::StalenessBin(staleness)].Add(stats.group_importance[i]);
      r.consumed_groups.push_back(g.group_id);
      // Learner/actor log-prob gap per actor name: a bad or mismatched worker stands out.
      r.actor_logprob_gap[ActorName(g.actor)] += stats.group_logprob_gap[i];
      ++gap_n[ActorName(g.actor)];
      summary.length_mean /= static_cast<double>(std::max<int64_t>(group_turns, 1));
      summary.zero_spread = std::all_of(g.episodes.begin(), g.episodes.end(),
                                        [&](const data::Episode& e) { return e.reward == g.episodes.front().reward; });
      summary.gap = stats.group_logprob_gap[i];
      if (i < stats.group_routes.size()) {
        const StepStats::RouteCounts& rc = stats.group_routes[i];
        summary.routes = rc.total();
        summary.routes_same = rc.same;
        routes.same += rc.same;
        routes.applied += rc.applied;
        routes.refused += rc.refused;
      }
      worker_stats_.Add(ActorName(g.actor), summary);
    }
    for (auto& [name, gap] : r.actor_logprob_gap) gap /= gap_n[name];
    if (options_.learner.router_replay) {
      r.routes_replayed = routes.total();
      r.routes_refused = routes.refused;
      if (routes.total() > 0) r.route_agreement = static_cast<double>(routes.same) / static_cast<double>(routes.total());
    }
    worker_stats_.SetCanaries(intake_->canaries());
    r.actor_stats = worker_stats_.ToJson();
    for (const auto& [worker, row] : r.actor_stats.items())
      for (const std::string stat : row.value("outlier", nlohmann::json::array()))
        if (warned_outlier_.insert(worker + " " + stat).second)
          spdlog::warn("worker {} is an outlier on {} ({} over {} groups; metrics.jsonl actor_stats has the fleet's)",
                       worker, stat, row[stat].get<double>(), row["groups"].get<int64_t>());
    for (const auto& [bin, sums] : by_bin) {
      const ImportanceHealth h = sums.Health();
      r.is_ess_frac_by_staleness[bin] = h.ess_frac();
      r.is_logratio_m2_by_staleness[bin] = h.logratio_m2;
      r.masked_frac_by_staleness[bin] = h.masked_frac;
    }
    r.reward_mean = reward_sum / episodes;
    for (auto& [name, sum] : r.reward_metrics) sum /= static_cast<double>(episodes);
    r.accuracy = success_sum / episodes;
    r.staleness_mean = stale_sum / static_cast<double>(batch.groups.size());
    r.staleness_max = stale_max;
    r.staleness_bound = Staleness();
    const sched::DispatchCounts c = dispatcher_->counts();
    r.groups_issued = static_cast<int64_t>(c.handed_out);
    r.groups_consumed = static_cast<int64_t>(c.consumed);
    r.groups_dropped_stale = static_cast<int64_t>(c.dropped_stale);
    r.groups_filtered = static_cast<int64_t>(c.filtered);
    if (options_.dynamic_sampling) r.filtered_groups = batch.filtered;
    r.groups_reissued = static_cast<int64_t>(c.reissued);
    r.groups_in_flight = static_cast<int64_t>(c.outstanding + c.pending);
    if (options_.dispatch == "deadline") r.groups_predicted_late = static_cast<int64_t>(c.predicted_late);
    if (options_.resume) r.groups_resumed = static_cast<int64_t>(c.resumed);
    r.tokens_by_fate = sched::TokensByFate(c);
    r.refused = AllRefusals();
    r.actors = transport_.live_actors();
    r.actor_groups = intake_->actor_groups();
    r.actor_group_seconds = dispatcher_->WorkerGroupSeconds();
    r.actor_forged = intake_->actor_forged();
    const double rl_wall = std::max(RlWallNow(), 1e-9);
    r.learner_busy_frac = busy_seconds_ / rl_wall;
    r.tokens_per_s = intake_->accepted_tokens() / rl_wall;
    r.loss = stats.loss;
    r.grad_norm = stats.grad_norm;
    r.clip_frac = stats.clip_frac;
    r.clip_frac_low = stats.clip_frac_low;
    r.clip_frac_high = stats.clip_frac_high;
    r.clip_frac_dual = stats.clip_frac_dual;
    r.response_length_mean = length_sum / static_cast<double>(std::max<int64_t>(turns, 1));
    r.response_length_max = length_max;
    r.truncated_frac = static_cast<double>(stats.truncated) / static_cast<double>(std::max<int64_t>(stats.episodes, 1));
    r.kl = stats.kl;
    r.behav_weight_mean = stats.behav_weight_mean;
    r.max_token_weight = stats.max_token_weight;
    r.group_share_max = stats.group_share_max;
    r.is_ess_frac = stats.health.ess_frac();
    r.is_weight_m2 = stats.health.weight_m2;
    r.is_logratio_m2 = stats.health.logratio_m2;
    r.masked_frac = stats.health.masked_frac;
    r.logprob_gap = stats.logprob_gap;
    r.zero_spread_groups = stats.zero_spread_groups;
    r.skipped_nonfinite = stats.skipped_nonfinite;
    const VerifyStats verified = verifier_->stats();
    r.verified_groups = verified.checked;
    r.verify_gap_max = verified.max_gap;
    r.verify_token_gap_max = verified.max_token_gap;
    r.verify_unverifiable = verified.unverifiable;
    r.verify_draws_checked = verified.draws_checked;
    r.verify_near_ties = verified.near_ties;
    r.tokens = stats.tokens;
    r.moved_tokens = moved;
    r.entropy = stats.entropy;
    r.lease_renewals = static_cast<int64_t>(dispatcher_->renewals());
    if (stats.computed_positions > 0)
      r.learner_pad_frac = 1.0 - static_cast<double>(stats.sequence_positions) / stats.computed_positions;
    obs::SetRouterLoad(stats.router_load, &r);
    if (options_.learner.router_aux_coef > 0 && !stats.router_load.empty()) r.router_aux_loss = stats.router_aux_loss;
    if (std::optional<BroadcastCompletion> b = transport_.TakeCompletedBroadcast()) {
      r.broadcast_version = b->version;
      r.broadcast_s = b->seconds;
      r.broadcast_bytes = b->bytes;
      r.broadcast_snapshot_bytes = b->snapshot_bytes;
    }
    r.learner_rss_mb = ResidentSetMb();
    r.learner_ranks = ranks_ ? ranks_->world() : 1;
    return r;
  }

  // Everything a resumed run needs, as of now (between updates).
  Status SaveState() {
    RunState& rs = start_.state;
    rs.version = learner_->version();
    rs.wall_seconds = WallNow();
    rs.rl_wall_seconds = RlWallNow();
    rs.busy_seconds = busy_seconds_;
    rs.consumed_tokens = consumed_tokens_;
    rs.metrics_bytes = metrics_.bytes();
    rs.samples_bytes = samples_.bytes();
    rs.dispatcher = dispatcher_->Export();
    rs.refusals = intake_->refusals();
    rs.accepted_tokens = intake_->accepted_tokens();
    rs.actor_groups = intake_->actor_groups();
    rs.actor_forged = intake_->actor_forged();
    rs.rng_state_hex = CaptureRngState();
    if (control_) rs.staleness_control = control_->Export();
    const std::string where = "checkpoint at version " + std::to_string(rs.version);
    model::CheckpointFiles gathered;
    if (ranks_) {
      Result<model::CheckpointFiles> files = GatherCheckpointFiles(*ranks_, *learner_, ckpt_dir_.string());
      if (!files.ok()) return files.status().WithContext(where);
      gathered = std::move(files).value();
    }
    return SaveRunCheckpoint(ckpt_dir_.string(), *learner_, start_.vocab, rs, options_.checkpoint_keep,
                             std::move(gathered))
        .WithContext(where);
  }

  // --- shutdown -------------------------------------------------------------------------------
  Result<RunSummary> Finish(Status failure) {
    if (failure.ok() && learner_->version() == options_.steps) failure = AwaitEvaluation();
    transport_.StopWork();  // before the version moves on: no hand-outs after the loop
    dispatcher_->SetVersion(learner_->version());
    summary_.steps_done = learner_->version();
    // Whatever ended the loop, the run can continue from here (a failed write is reported).
    if (learner_->version() != start_.state.version || learner_->version() == options_.steps) {
      Status saved = SaveState();
      if (!saved.ok() && failure.ok()) failure = saved;
      if (saved.ok())
        progress_ << "resumable checkpoint " << (ckpt_dir_ / ("step-" + std::to_string(learner_->version()))).string()
                  << std::endl;
    }
    summary_.interrupted = learner_->version() < options_.steps;
    // Sharded parameters: the final weights and the policy to evaluate are gathered while the
    // workers are still there.
    model::CheckpointFiles final_files;
    Result<model::Qwen3Model> policy = model::Qwen3Model(nullptr);
    if (failure.ok() && learner_->parameters_sharded() && !summary_.interrupted) {
      const at::ScalarType storage = model::StorageDtype(learner_->model()->config());
      Result<model::CheckpointFiles> weights =
          ranks_->WeightsFiles(*learner_, ckpt_dir_.string(), storage, ShardBytes());
      if (weights.ok()) final_files = std::move(weights).value();
      else failure = weights.status().WithContext("the final checkpoint");
    }
    if (failure.ok()) policy = PolicyToEvaluate();
    if (ranks_) ranks_->Stop();  // the workers' part is done; rank 0 evaluates alone
    ECHELON_RETURN_IF_ERROR(failure);
    ECHELON_RETURN_IF_ERROR(policy.status());
    if (!summary_.interrupted) {
      // A LoRA run's final model has its adapters merged, for any Hugging Face tool; its
      // step-N checkpoints keep them apart.
      model::Qwen3Model final_model = learner_->model();
      if (final_model->config().lora.on()) {
        ECHELON_ASSIGN_OR_RETURN(final_model, model::MergeLora(final_model));
      }
      ECHELON_RETURN_IF_ERROR(
          model::SaveCheckpoint((ckpt_dir_ / "final").string(), final_model, start_.vocab, final_files, ShardBytes()));
    }
    ECHELON_ASSIGN_OR_RETURN(const data::EvalResult after,
                             evaluate_(policy.value(), start_.vocab, *task_, options_.max_new_tokens));
    summary_.final_accuracy = after.accuracy;
    summary_.wall_seconds = WallNow();
    const sched::DispatchCounts c = dispatcher_->counts();
    ECHELON_RETURN_IF_ERROR(metrics_.Write({{"event", summary_.interrupted ? "interrupted" : "final"},
                                            {"version", learner_->version()},
                                            {"heldout_accuracy", after.accuracy},
                                            {"heldout_n", after.n},
                                            {"warmstart_heldout_accuracy", start_.state.warmstart_accuracy},
                                            {"groups_issued", c.handed_out},
                                            {"groups_consumed", c.consumed},
                                            {"groups_dropped_stale", c.dropped_stale},
                                            {"groups_filtered", c.filtered},
                                            {"groups_reissued", c.reissued},
                                            {"groups_in_flight", c.outstanding + c.pending},
                                            {"groups_predicted_late", c.predicted_late},
                                            {"groups_resumed", c.resumed},
                                            {"tokens_by_fate", sched::TokensByFate(c)},
                                            {"actor_groups", intake_->actor_groups()},
                                            {"actor_forged", intake_->actor_forged()},
                                            {"refused", AllRefusals()},
                                            {"learner_busy_frac", busy_seconds_ / std::max(RlWallNow(), 1e-9)},
                                            {"learner_rss_mb", ResidentSetMb()},
                                            {"learner_peak_rss_mb", PeakResidentSetMb()},
                                            {"wall_s", summary_.wall_seconds}}));
    CloseTransport();
    return summary_;
  }

  // The largest file of checkpoints/final's weights (checkpoint.shard_mb).
  uint64_t ShardBytes() const { return static_cast<uint64_t>(options_.checkpoint_shard_mb * 1e6); }

  void CloseTransport() {
    if (!transport_started_) return;
    transport_started_ = false;
    transport_.StopWork();
    transport_.Finish();
  }

  // Refusals by reason: the intake's (bad submissions) and the transport's (auth, evictions).
  std::map<std::string, int64_t> AllRefusals() const {
    std::map<std::string, int64_t> out = intake_->refusals();
    for (const auto& [reason, n] : transport_.Refusals()) out[reason] += n;
    if (const uint64_t capped = dispatcher_->lease_capped()) out["lease_capped"] += static_cast<int64_t>(capped);
    return out;
  }

  bool Interrupted() const { return interrupt_ != nullptr && interrupt_->load(); }
  double WallNow() const { return wall_base_ + clock_.Now() - t_start_; }   // continued across resumes
  double RlWallNow() const { return rl_base_ + clock_.Now() - t_rl_; }      // the same, RL loop only

  const RunOptions& options_;
  const LearnerRunArgs& args_;
  ActorTransport& transport_;
  // eval.heldout false: no evaluation at all (its accuracy NaN, written as null).
  static Result<data::EvalResult> NoHeldOut(const model::Qwen3Model&, const model::Vocabulary&,
                                            const data::TaskAdapter&, int64_t) {
    return data::EvalResult{std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN(), 0};
  }
  const ModelEvaluator evaluate_;
  const std::atomic<bool>* interrupt_;
  std::ostream& progress_;
  const Clock& clock_;
  const double t_start_;
  const fs::path ckpt_dir_;
  RunSummary summary_;
  RunSecret secret_;  // never leaves this process (RunSecretFor)
  std::unique_ptr<data::TaskAdapter> task_;
  obs::MetricsLog metrics_;
  obs::MetricsLog samples_;  // samples.jsonl
  RunStart start_;
  contract::Snapshot snapshot_;  // sharded parameters: the newest gathered snapshot (GatheredSnapshot)
  // A resumed run's KL reference (the warm start's weights), whole on rank 0 until set-up.
  std::map<std::string, at::Tensor> reference_;
  std::unique_ptr<LearnerRanks> ranks_;  // data-parallel workers, when there are any
  std::unique_ptr<Learner> learner_;
  std::unique_ptr<sched::Dispatcher> dispatcher_;
  std::unique_ptr<BehaviourVerifier> verifier_;  // outlives intake_, which calls it
  std::unique_ptr<EvalRounds> rounds_;  // eval.sets; outlives intake_, which hands its work out
  int64_t next_round_ = 0;               // the version of the next evaluation round
  std::unique_ptr<TrajectoryIntake> intake_;
  std::unique_ptr<SnapshotPublisher> publisher_;
  std::unique_ptr<obs::MetricsHttpServer> http_;
  bool transport_started_ = false;
  double wall_base_ = 0;
  double rl_base_ = 0;  // RL loop time of earlier processes of this run
  double t_rl_ = 0;     // when this process's RL loop started
  double busy_seconds_ = 0;
  double last_train_seconds_ = 0;
  std::set<std::string> warned_capped_;  // workers told they reached the lease cap
  WorkerStats worker_stats_;             // each worker's consumed groups beside the fleet's
  std::set<std::string> warned_outlier_;  // "WORKER STATISTIC" already warned about
  std::optional<sched::StalenessControl> control_;  // rl.staleness: auto
  int64_t consumed_tokens_ = 0;
};

}  // namespace

Result<RunSummary> RunLearner(const RunOptions& options, const LearnerRunArgs& args, ActorTransport& transport,
                              const ModelEvaluator& evaluate, const std::atomic<bool>* interrupt,
                              std::ostream& progress, const Clock* clock) {
  static const RealClock kRealClock;
  LearnerRun run(options, args, transport, evaluate, interrupt, progress, clock != nullptr ? *clock : kRealClock);
  return run.Run();
}

}  // namespace echelon::learn
