#include "echelon/rollout/actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "echelon/data/adapter_kit.h"

namespace echelon::rollout {

namespace {
const RealClock kRealClock;

// The oldest version of the group's tokens, and versions dropped where they all are that one
// (data::Turn::versions: empty means the group's behaviour version).
int64_t SettleVersions(std::vector<data::Episode>& episodes, int64_t started) {
  int64_t oldest = -1;
  for (const data::Episode& e : episodes)
    for (const data::Turn& t : e.turns)
      for (int64_t v : t.versions) oldest = oldest < 0 ? v : std::min(oldest, v);
  if (oldest < 0) return started;
  bool uniform = true;
  for (const data::Episode& e : episodes)
    for (const data::Turn& t : e.turns)
      for (int64_t v : t.versions) uniform = uniform && v == oldest;
  if (uniform)
    for (data::Episode& e : episodes)
      for (data::Turn& t : e.turns) t.versions.clear();
  return oldest;
}

// A resumed single-turn group: every sample continued from its prefix.
Result<std::vector<data::Episode>> ContinueGroup(const contract::Assignment& a, SnapshotPolicy& policy) {
  if (!a.scored_by_learner || static_cast<int>(a.prefix.size()) != a.group_size)
    return InvalidArgument("a resumed group must be a single-turn group with one prefix a sample (" +
                           std::to_string(a.prefix.size()) + " for " + std::to_string(a.group_size) + ")");
  ECHELON_ASSIGN_OR_RETURN(
      std::vector<data::Turn> turns,
      policy.Continue(std::vector<data::PolicyPrompt>(a.group_size, data::PolicyPrompt::Of(a.prompt)), a.seed, a.prefix));
  std::vector<data::Episode> episodes(turns.size());
  for (size_t i = 0; i < turns.size(); ++i) episodes[i].turns.push_back(std::move(turns[i]));
  return episodes;
}

}  // namespace

// Watches one group's generation: reports its progress for the lease, stretches time as a
// slowed worker (ActorOptions::slowdown) step by step, and with `partial` moves the policy to a
// newer snapshot between steps. With `prefixes` (contract::Assignment::report_prefix) it
// reports the samples' new tokens every sched::kPrefixSeconds, from where `resumed` (the
// group's prefix when it was resumed) leaves them. Once `stop` is set the policy ends the
// generation at its next step.
class Actor::GroupWatch : public SampleObserver {
 public:
  GroupWatch(Actor* actor, const sched::WorkItem& work, const std::atomic<bool>& stop, bool partial,
             bool prefixes = false, const std::vector<data::Turn>& resumed = {})
      : actor_(actor), work_(work), stop_(stop), partial_(partial), prefixes_(prefixes), start_(actor->clock_->Now()),
        last_(start_), reported_(start_), prefix_reported_(start_) {
    actor_->policy_->set_observer(this);
    for (size_t j = 0; j < resumed.size(); ++j) Part(static_cast<int64_t>(j)).from = static_cast<int64_t>(resumed[j].tokens.size());
  }
  ~GroupWatch() override { actor_->policy_->set_observer(nullptr); }
  GroupWatch(const GroupWatch&) = delete;
  GroupWatch& operator=(const GroupWatch&) = delete;

  void Generated(int64_t tokens) override {
    tokens_ += tokens;
    const Clock& clock = *actor_->clock_;
    if (actor_->options_.slowdown > 1.0) {
      const double pause = (clock.Now() - last_) * (actor_->options_.slowdown - 1.0);
      clock.SleepFor(pause);
      slept_ += pause;
    }
    last_ = clock.Now();
    if (last_ - reported_ >= sched::kProgressSeconds) {
      actor_->work_->Progress(actor_->options_.name, work_, tokens_);
      reported_ = last_;
    }
    if (prefixes_ && last_ - prefix_reported_ >= sched::kPrefixSeconds) ReportPrefix();
  }
  void Drew(const std::vector<int64_t>& samples, const std::vector<int64_t>& tokens, const std::vector<float>& logprobs,
            int64_t version) override {
    if (!prefixes_) return;
    for (size_t i = 0; i < samples.size(); ++i) {
      contract::PrefixPart& p = Part(samples[i]);
      p.tokens.push_back(tokens[i]);
      p.logprobs.push_back(logprobs[i]);
      p.versions.push_back(version);
    }
  }
  bool NewerSnapshot() override {
    return partial_ && actor_->snapshots_->NewestVersion() > actor_->policy_->version();
  }
  bool Update() override {
    const int64_t before = actor_->policy_->version();
    return actor_->RefreshSnapshot() && actor_->policy_->version() > before;
  }
  bool Stopping() override { return stop_.load(); }
  // Sends what each sample drew since the last kept report; kept, the next report starts after it.
  void ReportPrefix() {
    prefix_reported_ = actor_->clock_->Now();
    if (!prefixes_) return;
    std::vector<contract::PrefixPart> report;
    for (const contract::PrefixPart& p : parts_)
      if (!p.tokens.empty()) report.push_back(p);
    if (report.empty() || !actor_->work_->ReportPrefix(actor_->options_.name, work_, report)) return;
    for (contract::PrefixPart& p : parts_) {
      p.from += static_cast<int64_t>(p.tokens.size());
      p.tokens.clear();
      p.logprobs.clear();
      p.versions.clear();
    }
  }

  // Seconds of generation, the slowdown's pauses excluded, and the pauses still owed for it.
  double generate_seconds() const { return actor_->clock_->Now() - start_ - slept_; }
  double owed_pause() const { return generate_seconds() * (actor_->options_.slowdown - 1.0) - slept_; }

 private:
  contract::PrefixPart& Part(int64_t sample) {
    while (static_cast<int64_t>(parts_.size()) <= sample) parts_.push_back({static_cast<int64_t>(parts_.size())});
    return parts_[static_cast<size_t>(sample)];
  }
  Actor* actor_;
  const sched::WorkItem work_;
  const std::atomic<bool>& stop_;
  const bool partial_;
  const bool prefixes_;
  const double start_;
  double last_, reported_, prefix_reported_;
  std::vector<contract::PrefixPart> parts_;  // by sample: drawn since the last kept report
  double slept_ = 0;
  int64_t tokens_ = 0;
};

Actor::Actor(ActorOptions options, contract::WorkSource* work, contract::TrajectorySink* sink,
             contract::SnapshotSource* snapshots, const data::TaskAdapter* task,
             std::unique_ptr<SnapshotPolicy> policy, const Clock* clock)
    : options_(std::move(options)),
      work_(work),
      sink_(sink),
      snapshots_(snapshots),
      task_(task),
      policy_(std::move(policy)),
      clock_(clock != nullptr ? clock : &kRealClock) {}

bool Actor::RefreshSnapshot() { return Load(snapshots_->Latest()); }

bool Actor::Load(const contract::Snapshot& snap) {
  // Any other version replaces ours, older ones too: a learner resumed from a checkpoint
  // publishes versions again from there, and an evaluation group pins an older one.
  if (snap.version < 0 || !snap.weights) return false;
  if (snap.version == policy_->version() && snap.base == base_) return true;
  if (snap.base && snap.base != base_) {  // a LoRA run's whole model, under its adapters
    if (Status st = policy_->LoadBase(*snap.base); !st.ok()) {
      spdlog::error("{}: cannot load the LoRA base of snapshot v{}: {}", options_.name, snap.version, st.message());
      ++stats_.errors;
      return false;
    }
    base_ = snap.base;
  }
  Status st = policy_->LoadSnapshot(*snap.weights, snap.version);
  if (!st.ok()) {
    spdlog::error("{}: cannot load snapshot v{}: {}", options_.name, snap.version, st.message());
    ++stats_.errors;
    return false;
  }
  return true;
}

Result<contract::SubmitOutcome> Actor::PlayEvaluation(const contract::Assignment& a, const std::atomic<bool>& stop,
                                                      int64_t* tokens) {
  if (policy_->version() != a.eval_version) {
    if (!Load(snapshots_->Pinned(a.eval_version)))
      return Unavailable("the snapshot of version " + std::to_string(a.eval_version) +
                         " this evaluation group is pinned to is not to be had");
    spdlog::info("{}: took snapshot v{} for an evaluation group pinned to it", options_.name, a.eval_version);
  }
  contract::GroupRollout out;
  out.group_id = a.work.group_id;
  out.lease_id = a.work.lease_id;
  out.actor = options_.name;
  out.prompt = a.prompt;
  out.behavior_version = a.eval_version;
  GroupWatch watch(this, a.work, stop, /*partial=*/false);
  const double temperature = policy_->temperature();
  policy_->SetTemperature(a.eval_temperature);
  Result<std::vector<data::Episode>> episodes = data::SampleSingleTurnGroup(a.prompt, a.group_size, *policy_, a.seed);
  policy_->SetTemperature(temperature);
  ECHELON_RETURN_IF_ERROR(episodes.status());
  out.episodes = std::move(episodes).value();
  out.generate_seconds = watch.generate_seconds();
  if (options_.slowdown > 1.0) clock_->SleepFor(watch.owed_pause());
  for (const data::Episode& e : out.episodes)
    for (const data::Turn& t : e.turns) *tokens += static_cast<int64_t>(t.tokens.size());
  return sink_->Submit(std::move(out));
}

Result<contract::SubmitOutcome> Actor::PlayHosted(const contract::Assignment& a, const std::atomic<bool>& stop,
                                                  int64_t* tokens) {
  if (episodes_ == nullptr) return FailedPrecondition("the learner plays this group, and this actor has no link to it");
  const int64_t version = policy_->version();
  std::vector<data::Turn> turns;
  double seconds = 0;
  // Progress for the lease; the version stays (the learner records one version per turn).
  GroupWatch watch(this, a.work, stop, /*partial=*/false);
  while (true) {
    ECHELON_ASSIGN_OR_RETURN(contract::PlayStep step,
                             episodes_->Play(options_.name, a.work, version, std::move(turns), seconds));
    if (step.outcome) return *step.outcome;
    const double t0 = clock_->Now();
    ECHELON_ASSIGN_OR_RETURN(turns, policy_->Sample(step.prompts, step.seed));
    seconds = clock_->Now() - t0;
    for (data::Turn& t : turns) {
      *tokens += static_cast<int64_t>(t.tokens.size());
      t.versions.clear();  // all `version`'s
    }
  }
}

void Actor::Run(const std::atomic<bool>& stop) {
  double idle = options_.idle_sleep_seconds;
  const auto wait = [&] {
    clock_->SleepFor(idle);
    idle = std::min(idle * 2, std::max(options_.max_idle_sleep_seconds, options_.idle_sleep_seconds));
  };
  while (!stop.load()) {
    if (!RefreshSnapshot()) {
      wait();
      continue;
    }
    std::optional<contract::Assignment> a =
        work_->AcquireWith(options_.name, {policy_->ContinuesPrefixes(), policy_->version(), policy_->Evaluates()});
    if (!a) {
      wait();
      continue;
    }
    idle = options_.idle_sleep_seconds;
    int64_t tokens = 0;
    // The gate may have advanced while we waited: a training group takes the newest snapshot.
    if (a->eval_version < 0) RefreshSnapshot();
    Result<contract::SubmitOutcome> outcome = a->eval_version >= 0 ? PlayEvaluation(*a, stop, &tokens)
                                              : a->played_by_learner ? PlayHosted(*a, stop, &tokens)
                                                                     : PlayHere(*a, stop, &tokens);
    if (!outcome.ok() && outcome.status().code() == StatusCode::kCancelled) {
      // Stopping midway (a preemption notice): the lease goes back, so that another worker
      // continues the group at once (from what was reported of it) instead of after the lease.
      work_->Release(options_.name, a->work);
      spdlog::info("{}: stopping; group {} handed back: {}", options_.name, a->work.group_id,
                   outcome.status().message());
    } else if (!outcome.ok()) {
      // The lease will expire and the group is re-issued to another actor.
      spdlog::error("{}: group {} failed: {}", options_.name, a->work.group_id, outcome.status().message());
      ++stats_.errors;
    } else if (!outcome->accepted) {
      spdlog::warn("{}: group {} refused: {}", options_.name, a->work.group_id, outcome->reason);
      ++stats_.refused;
    } else {
      ++stats_.groups;
      stats_.tokens += tokens;
    }
  }
}

Result<contract::SubmitOutcome> Actor::PlayHere(const contract::Assignment& a, const std::atomic<bool>& stop,
                                                int64_t* tokens) {
  contract::GroupRollout out;
  out.group_id = a.work.group_id;
  out.lease_id = a.work.lease_id;
  out.actor = options_.name;
  out.prompt = a.prompt;
  // Only single-turn groups are resumed: one Sample call, whose draws the observer sees.
  const bool prefixes = a.report_prefix && a.scored_by_learner && policy_->ContinuesPrefixes();
  GroupWatch watch(this, a.work, stop, options_.partial, prefixes, a.prefix);
  Result<std::vector<data::Episode>> episodes = std::vector<data::Episode>();
  for (int attempt = 0;; ++attempt) {
    out.behavior_version = policy_->version();
    if (!a.prefix.empty())
      episodes = ContinueGroup(a, *policy_);
    else if (a.scored_by_learner)
      episodes = data::SampleSingleTurnGroup(a.prompt, a.group_size, *policy_, a.seed);
    else
      episodes = task_->RunGroup(a.prompt, a.group_size, *policy_, a.seed);
    // Aborted: the policy's snapshot went out of date under it (a pipeline's stages moved
    // past it); the group runs again on the newest one.
    if (episodes.ok() || episodes.status().code() != StatusCode::kAborted || attempt + 1 >= kGroupAttempts ||
        stop.load())
      break;
    spdlog::info("{}: group {} again on a newer snapshot: {}", options_.name, a.work.group_id,
                 episodes.status().message());
    RefreshSnapshot();
  }
  // Stopping midway (a preemption notice): what the samples drew goes to the learner before the
  // lease does (Run).
  if (episodes.status().code() == StatusCode::kCancelled) watch.ReportPrefix();
  ECHELON_RETURN_IF_ERROR(episodes.status());
  out.episodes = std::move(episodes).value();
  out.behavior_version = SettleVersions(out.episodes, out.behavior_version);
  out.generate_seconds = watch.generate_seconds();
  // A backend that reports no steps is slowed here, at the end.
  if (options_.slowdown > 1.0) clock_->SleepFor(watch.owed_pause());
  for (const data::Episode& e : out.episodes)
    for (const data::Turn& t : e.turns) *tokens += static_cast<int64_t>(t.tokens.size());
  return sink_->Submit(std::move(out));
}

}  // namespace echelon::rollout
