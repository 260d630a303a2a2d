#include "echelon/learn/trajectory_intake.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <set>

#include "echelon/contract/group_seed.h"

namespace echelon::learn {

namespace {

// The lowest log-prob a sampled token can carry: a sampler drawing from fp32 (or bf16, fp16)
// probabilities never draws a token whose probability is below the smallest fp32 subnormal,
// e^-103.3. A lower claim is forged (and would sit at the loss's log-ratio clamp).
constexpr float kMinBehaviorLogprob = -110.0f;

// "" when every token is below `vocab` and every log-prob one a sampler can give (a group's
// turn, or a prefix report's part), else the refusal.
std::string TokenRefusal(const std::vector<int64_t>& tokens, const std::vector<float>& logprobs, int64_t vocab) {
  for (int64_t id : tokens)
    if (id < 0 || id >= vocab) return "token_out_of_vocab";
  for (float lp : logprobs)
    if (!std::isfinite(lp) || lp > 1e-4f || lp < kMinBehaviorLogprob) return "bad_logprob";
  return "";
}

}  // namespace

std::string RouteRefusal(const data::Turn& t, const model::ModelConfig* model) {
  const Routes& r = t.routes;
  if (r.empty()) return "";
  if (model == nullptr) return "unexpected_routes";
  const size_t k = static_cast<size_t>(model->num_experts_per_tok);
  if (r.layers.size() != r.size() || r.experts.size() != r.size() * k) return "bad_routes";
  const int64_t fed = static_cast<int64_t>(t.prompt_ids.size() + t.tokens.size()) - 1;
  for (size_t e = 0; e < r.size(); ++e) {
    if (r.positions[e] < 0 || r.positions[e] >= fed) return "bad_routes";
    if (r.layers[e] < 0 || r.layers[e] >= model->num_hidden_layers || !model->is_sparse(r.layers[e]))
      return "bad_routes";
    if (e > 0 && std::make_pair(r.positions[e], r.layers[e]) <= std::make_pair(r.positions[e - 1], r.layers[e - 1]))
      return "bad_routes";
    const int16_t* x = r.experts.data() + e * k;
    for (size_t i = 0; i < k; ++i) {
      if (x[i] < 0 || x[i] >= model->num_experts) return "bad_routes";
      for (size_t j = 0; j < i; ++j)
        if (x[j] == x[i]) return "bad_routes";
    }
  }
  return "";
}

std::string ActorName(const std::string& actor_id) { return sched::WorkerName(actor_id); }

TrajectoryIntake::TrajectoryIntake(sched::Dispatcher* dispatcher, const data::TaskAdapter* task,
                                   const model::Vocabulary* vocab, const IntakeLimits& limits)
    : dispatcher_(dispatcher), task_(task), vocab_(vocab), limits_(limits),
      prefixes_({limits.group_size, limits.max_completion_tokens}) {}

std::optional<contract::Assignment> TrajectoryIntake::Acquire(const std::string& actor) {
  return AcquireWith(actor, contract::WorkRequest());
}

std::optional<contract::Assignment> TrajectoryIntake::AcquireWith(const std::string& actor,
                                                                  const contract::WorkRequest& request) {
  // Evaluation first where the actor holds the round's snapshot; elsewhere only when no training
  // work is to be had (the actor then loads the pinned snapshot: see SetEvaluation).
  const bool evaluates = rounds_ != nullptr && request.evaluates;
  if (evaluates && request.snapshot_version >= 0)
    if (std::optional<EvalRounds::Handed> h = rounds_->Acquire(actor, request.snapshot_version))
      return EvaluationAssignment(std::move(*h));
  std::optional<sched::WorkItem> w = dispatcher_->Acquire(actor, request.snapshot_version);
  if (!w) {
    if (evaluates)
      if (std::optional<EvalRounds::Handed> h = rounds_->Acquire(actor)) return EvaluationAssignment(std::move(*h));
    return std::nullopt;
  }
  const data::Prompt* canary = CanaryPrompt(w->group_id);
  contract::Assignment a{*w, canary != nullptr ? *canary : task_->TrainPrompt(w->group_id),
                         static_cast<int>(limits_.group_size), contract::GroupSeed(limits_.secret, w->group_id)};
  if (task_->MaxTurns() == 1) {
    // A single-turn group is scored here (Verify), so what scoring needs stays here: a worker
    // that saw the answer could hand in the answer.
    a.prompt.reference.clear();
    a.prompt.extra_info.clear();
    a.prompt.data_source.clear();
    a.scored_by_learner = true;
    a.report_prefix = limits_.resume;
  }
  if (!a.report_prefix) return a;
  // What earlier leases of this group reported, continued if this actor can and may (its
  // snapshot is at least the prefix's newest, and the group can still be consumed after the
  // update now running: oldest + S > v; at oldest + S = v it would have to arrive before the
  // batch being taken now, which a continuation almost never does), else dropped.
  const auto usable = [&](int64_t oldest, int64_t newest) {
    const int64_t staleness = std::max(dispatcher_->AdmittedStaleness(w->group_id), dispatcher_->max_staleness());
    return request.continues_prefixes && request.snapshot_version >= newest &&
           oldest + staleness > w->dispatch_version;
  };
  if (std::optional<PrefixStore::Handed> h = prefixes_.Hand(w->group_id, w->lease_id, actor, usable)) {
    a.prefix = std::move(h->samples);
    dispatcher_->Carry(w->group_id, w->lease_id, h->tokens);
  }
  return a;
}

void TrajectoryIntake::SetCanaries(std::shared_ptr<const data::TaskAdapter> set, double share) {
  canary_set_ = std::move(set);
  canary_share_ = canary_set_ && !canary_set_->HeldOut().empty() ? share : 0.0;
}

const data::Prompt* TrajectoryIntake::CanaryPrompt(uint64_t group_id) const {
  if (canary_share_ <= 0) return nullptr;
  const double u = static_cast<double>(limits_.secret.Draw("canary", group_id) >> 11) * 0x1.0p-53;
  if (u >= canary_share_) return nullptr;
  const std::vector<data::Prompt>& prompts = canary_set_->HeldOut();
  return &prompts[limits_.secret.Draw("canary prompt", group_id) % prompts.size()];
}

std::map<std::string, CanaryTally> TrajectoryIntake::canaries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return canaries_;
}

contract::Assignment TrajectoryIntake::EvaluationAssignment(EvalRounds::Handed h) const {
  contract::Assignment a{sched::WorkItem{h.id, h.lease_id, h.version}, std::move(h.prompt),
                         static_cast<int>(h.set->k), contract::GroupSeed(limits_.secret, h.id)};
  a.prompt.reference.clear();  // scored here, as a training group is
  a.prompt.extra_info.clear();
  a.prompt.data_source.clear();
  a.scored_by_learner = true;
  a.eval_version = h.version;
  a.eval_temperature = h.set->temperature;
  return a;
}

bool TrajectoryIntake::ReportPrefix(const std::string& actor, const sched::WorkItem& work,
                                    const std::vector<contract::PrefixPart>& parts) {
  if (!limits_.resume || task_->MaxTurns() != 1 || parts.empty()) return false;
  // Content first, without a lock but for the versions: each sample once, its fields one per
  // token, every token in the vocabulary, every log-prob a sampler's, every version published.
  std::string why;
  std::set<int64_t> samples, versions;
  if (static_cast<int64_t>(parts.size()) > limits_.group_size) why = "bad_sample";
  for (const contract::PrefixPart& p : parts) {
    if (!why.empty()) break;
    if (p.sample < 0 || p.sample >= limits_.group_size || !samples.insert(p.sample).second) why = "bad_sample";
    else if (p.tokens.size() != p.logprobs.size() || p.tokens.size() != p.versions.size()) why = "length_mismatch";
    else if (p.from < 0 || p.from > limits_.max_completion_tokens) why = "too_long";
    if (why.empty()) why = TokenRefusal(p.tokens, p.logprobs, limits_.model_vocab_size);
    for (size_t i = 0; i < p.versions.size() && why.empty(); ++i) {
      if (i > 0 && p.versions[i] < p.versions[i - 1]) why = "bad_token_version";
      versions.insert(p.versions[i]);
    }
  }
  if (why.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t v : versions)
      if (v > snapshot_.version || published_.count(v) == 0) why = "bad_token_version";
  }
  PrefixStore::ReportResult kept;
  if (why.empty()) {
    kept = prefixes_.Report(actor, work.group_id, work.lease_id, parts,
                            [&] { return dispatcher_->Holds(work.group_id, work.lease_id, actor); });
    why = kept.refusal;
  }
  if (!why.empty()) {
    StrikeForPrefix(actor, work.group_id, "prefix_" + why);
    return false;
  }
  if (kept.kept) dispatcher_->KeepPrefix(work.group_id, work.lease_id, kept.tokens, kept.oldest);
  return kept.kept;
}

void TrajectoryIntake::StrikeForPrefix(const std::string& actor, uint64_t group_id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++refusals_[reason];
    ++actor_forged_[ActorName(actor)];
    if (refusal_log_.Allow(reason)) spdlog::warn("refused the prefix of group {} from {}: {}", group_id, actor, reason);
  }
  if (strike_) strike_(actor, reason);
}

std::string TrajectoryIntake::BlameSplice(const contract::GroupRollout& g, const std::string& refusal) {
  // Each earlier holder's part of the prefix, in order: the first whose tokens fail drew them.
  for (const auto& [author, samples] : prefixes_.Authors(g.group_id, g.lease_id)) {
    contract::GroupRollout part;
    part.group_id = g.group_id;
    part.actor = author;
    part.behavior_version = g.behavior_version;
    for (size_t j = 0; j < samples.size(); ++j) {
      data::Turn t = samples[j];
      t.prompt_ids = g.episodes[j].turns[0].prompt_ids;
      part.episodes.emplace_back().turns.push_back(std::move(t));
    }
    Result<std::string> why = verifier_->Check(part, /*suspect=*/true);
    if (why.ok() && !why.value().empty()) {
      StrikeForPrefix(author, g.group_id, "prefix_" + why.value());
      prefixes_.Erase(g.group_id);  // the group starts over
      return "prefix_forged";
    }
  }
  return refusal;  // the submitter's own part failed
}

void TrajectoryIntake::Release(const std::string& actor, const sched::WorkItem& work) {
  if (IsEvalGroup(work.group_id)) {
    if (rounds_ != nullptr) rounds_->Requeue(work.group_id, work.lease_id, actor);
    return;
  }
  dispatcher_->Release(work.group_id, work.lease_id, actor);
}

void TrajectoryIntake::Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) {
  if (IsEvalGroup(work.group_id)) {
    if (rounds_ != nullptr) rounds_->Renew(work.group_id, work.lease_id, actor);
    return;
  }
  dispatcher_->Renew(work.group_id, work.lease_id, actor, tokens);
}

std::string TrajectoryIntake::Validate(const contract::GroupRollout& g, int64_t group_size) const {
  if (static_cast<int64_t>(g.episodes.size()) != group_size) return "wrong_group_size";
  {
    std::lock_guard<std::mutex> lock(mu_);
    // No actor can hold a newer policy than the newest one published, nor one never published
    // (the learner publishes every rl.publish_period updates). A version from before this
    // process started (a resumed run) was published, but its snapshot is gone: it cannot be
    // verified, so it is refused as an honest actor's out-of-date work.
    const int64_t v = g.behavior_version;
    if (v < 0 || v > snapshot_.version) return "bad_version";
    if (v < first_published_) return "predates_restart";
    if (published_.count(v) == 0) return "unpublished_version";
    // Partial rollouts: each token's version, never older than the group's (its staleness is the
    // oldest token's), never decreasing along a turn, each one published.
    for (const data::Episode& e : g.episodes)
      for (const data::Turn& t : e.turns) {
        if (t.versions.empty()) continue;
        if (t.versions.size() != t.tokens.size()) return "length_mismatch";
        for (size_t i = 0; i < t.versions.size(); ++i) {
          const int64_t tv = t.versions[i];
          if (tv < v || tv > snapshot_.version || (i > 0 && tv < t.versions[i - 1])) return "bad_token_version";
          if ((i == 0 || tv != t.versions[i - 1]) && published_.count(tv) == 0) return "unpublished_version";
        }
      }
  }
  for (const data::Episode& e : g.episodes) {
    if (!std::isfinite(e.reward)) return "nonfinite_reward";
    if (e.turns.empty() || e.turns.size() > task_->MaxTurns()) return "bad_turn_count";
    for (const data::Turn& t : e.turns) {
      if (t.tokens.empty()) return "empty_completion";  // a sampler emits at least its stop token
      if (static_cast<int64_t>(t.tokens.size()) > limits_.max_completion_tokens) return "too_long";
      if (t.tokens.size() != t.logprobs.size()) return "length_mismatch";
      if (t.prompt_ids.empty()) return "empty_prompt";
      for (int64_t id : t.prompt_ids)
        if (id < 0 || id >= limits_.model_vocab_size) return "token_out_of_vocab";
      if (std::string why = TokenRefusal(t.tokens, t.logprobs, limits_.model_vocab_size); !why.empty()) return why;
      if (std::string why = RouteRefusal(t, limits_.routes); !why.empty()) return why;
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
    case sched::SubmitResult::kForeignLease: return "foreign_lease";
  }
  return "unknown";
}

// Refusals an honest actor can earn: its lease expired and the group went to another actor,
// it repeated a submission whose reply it did not see, it sampled from a snapshot of the
// learner process before a restart, or its ordinary output made the user's reward fail (a
// strike there would quarantine honest workers for a bug in the reward).
bool HonestRefusal(const std::string& reason) {
  return reason == "not_lease_holder" || reason == "already_settled" || reason == "unknown_group" ||
         reason == "predates_restart" || reason == "reward_error" || reason == "prefix_forged";
}

}  // namespace

contract::SubmitOutcome TrajectoryIntake::Refuse(const contract::GroupRollout& g, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++refusals_[reason];
  const bool forged = !HonestRefusal(reason);
  if (forged) ++actor_forged_[ActorName(g.actor)];
  if (refusal_log_.Allow(reason)) spdlog::warn("refused group {} from {}: {}", g.group_id, g.actor, reason);
  return {false, reason, forged};
}

contract::SubmitOutcome TrajectoryIntake::Submit(contract::GroupRollout rollout) {
  if (IsEvalGroup(rollout.group_id)) return SubmitEvaluation(std::move(rollout));
  std::string reason = Validate(rollout, limits_.group_size);
  int64_t tokens = 0;
  for (const data::Episode& e : rollout.episodes)
    for (const data::Turn& t : e.turns) tokens += static_cast<int64_t>(t.tokens.size());
  if (reason.empty())
    reason = RefusalName(
        dispatcher_->Submit(rollout.group_id, rollout.lease_id, rollout.actor, tokens, rollout.behavior_version));
  if (!reason.empty()) return Refuse(rollout, reason);
  // The lease was current: from here on a refusal hands the group to another actor.
  if (std::string splice = prefixes_.CheckSplice(rollout); !splice.empty()) {
    prefixes_.Refused(rollout.group_id, rollout.lease_id);
    dispatcher_->Reissue(rollout.group_id);
    return Refuse(rollout, splice);
  }
  // A resumed group holds other workers' tokens: it is always checked, and a failure blamed on
  // whoever drew the failing part (BlameSplice).
  const bool resumed = prefixes_.WasHanded(rollout.group_id, rollout.lease_id);
  const data::Prompt* canary = CanaryPrompt(rollout.group_id);
  rollout.prompt = canary != nullptr ? *canary : task_->TrainPrompt(rollout.group_id);
  Result<Verdict> verdict = Verify(&rollout, canary != nullptr ? *canary_set_ : *task_);
  std::string failed = "reward_error";
  if (verdict.ok() && verdict->refusal.empty() && verifier_ != nullptr) {
    bool suspect;
    {
      std::lock_guard<std::mutex> lock(mu_);
      suspect = resumed || actor_forged_.count(ActorName(rollout.actor)) > 0;
    }
    Result<std::string> why = verifier_->Check(rollout, suspect);
    if (!why.ok()) {
      verdict = why.status();
      failed = "verify_error";
    } else {
      verdict->refusal = why.value();
      if (resumed && !verdict->refusal.empty()) verdict->refusal = BlameSplice(rollout, verdict->refusal);
    }
  }
  if (!verdict.ok()) {
    if (failed == "reward_error" && verdict.status().code() == StatusCode::kResourceExhausted) failed = "reward_slow";
    prefixes_.Refused(rollout.group_id, rollout.lease_id);
    return Failed(rollout.group_id, rollout.actor, failed,
                  verdict.status().WithContext("group " + std::to_string(rollout.group_id) + " from " + rollout.actor));
  }
  if (!verdict->refusal.empty()) {
    if (verdict->refusal != "prefix_forged") prefixes_.Refused(rollout.group_id, rollout.lease_id);
    dispatcher_->Reissue(rollout.group_id);
    return Refuse(rollout, verdict->refusal);
  }
  prefixes_.Erase(rollout.group_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    reward_failures_in_a_row_ = 0;
    failing_workers_.clear();
    worker_failures_in_a_row_.erase(ActorName(rollout.actor));
    worker_slow_in_a_row_.erase(ActorName(rollout.actor));
    workers_.insert(ActorName(rollout.actor));
    if (verdict->corrected > 0) refusals_["reward_corrected"] += verdict->corrected;
    accepted_tokens_ += tokens;
    ++actor_groups_[ActorName(rollout.actor)];
    if (canary != nullptr) {
      CanaryTally& c = canaries_[ActorName(rollout.actor)];
      ++c.groups;
      for (const data::Episode& e : rollout.episodes) {
        ++c.samples;
        c.successes += e.success ? 1 : 0;
      }
    } else {
      queue_.push_back(std::move(rollout));
    }
  }
  if (canary != nullptr) {
    dispatcher_->Settle(rollout.group_id, sched::Outcome::kFiltered);  // never an update's
    return {true, ""};
  }
  arrived_.notify_one();
  return {true, ""};
}

contract::SubmitOutcome TrajectoryIntake::SubmitEvaluation(contract::GroupRollout g) {
  std::optional<EvalRounds::Handed> h;
  if (rounds_ != nullptr) h = rounds_->Holder(g.group_id, g.lease_id, g.actor);
  if (!h) return Refuse(g, "not_lease_holder");  // late, repeated, or never handed out
  std::string reason = Validate(g, h->set->k);
  // Pinned: every token from the round's snapshot.
  if (reason.empty() && g.behavior_version != h->version) reason = "wrong_eval_version";
  for (const data::Episode& e : g.episodes)
    for (const data::Turn& t : e.turns)
      for (int64_t v : t.versions)
        if (reason.empty() && v != h->version) reason = "wrong_eval_version";
  const auto refuse = [&](const std::string& why) {
    rounds_->Requeue(g.group_id, g.lease_id, g.actor);
    return Refuse(g, why);
  };
  if (!reason.empty()) return refuse(reason);
  g.prompt = h->prompt;
  Result<Verdict> verdict = Verify(&g, *h->set->task);
  if (!verdict.ok()) {
    // The set's reward failed on this group: it goes to another actor; no strike (an honest
    // worker's text can meet a bug in a reward).
    if (refusal_log_.Allow("eval_reward_error"))
      spdlog::warn("evaluation group from {}: the reward of set {} failed: {}", g.actor, h->set->name,
                   verdict.status().message());
    rounds_->Requeue(g.group_id, g.lease_id, g.actor);
    std::lock_guard<std::mutex> lock(mu_);
    ++refusals_["eval_reward_error"];
    return {false, "eval_reward_error"};
  }
  if (verdict->refusal.empty() && verifier_ != nullptr) {
    bool suspect;
    {
      std::lock_guard<std::mutex> lock(mu_);
      suspect = actor_forged_.count(ActorName(g.actor)) > 0;
    }
    model::SamplingParams sampling = verifier_->sampling();
    sampling.temperature = h->set->temperature;
    Result<std::string> why = verifier_->Check(g, suspect, &sampling);
    if (!why.ok()) {
      rounds_->Requeue(g.group_id, g.lease_id, g.actor);
      return Failed(g.group_id, g.actor, "verify_error", why.status().WithContext("evaluation group from " + g.actor));
    }
    verdict->refusal = why.value();
  }
  if (!verdict->refusal.empty()) return refuse(verdict->refusal);
  int64_t successes = 0;
  for (const data::Episode& e : g.episodes) successes += e.success ? 1 : 0;
  rounds_->Record(g.group_id, g.lease_id, g.actor, successes);
  return {true, ""};
}

contract::SubmitOutcome TrajectoryIntake::Failed(uint64_t group_id, const std::string& actor, const std::string& failed,
                                                 const Status& error) {
  dispatcher_->Reissue(group_id);
  std::lock_guard<std::mutex> lock(mu_);
  ++refusals_[failed];
  // The verifier's own failure (a snapshot it cannot load) stops the run at once.
  if (failed == "verify_error") {
    if (failure_.ok()) failure_ = error;
    arrived_.notify_all();
    return {false, failed};
  }
  // The reward (a user's function, a scoring service, an environment) failed on this group. A
  // worker's text may be made to break it, so the group is refused and the run goes on. When
  // kRewardFailuresToStop groups in a row fail, from more than one worker (or from the only
  // one), the reward itself is broken and the run stops with its error; failures from one
  // worker among several are that worker's doing, and strike it.
  if (refusal_log_.Allow(failed)) spdlog::warn("refused {}", error.message());
  const std::string worker = ActorName(actor);
  workers_.insert(worker);
  failing_workers_.insert(worker);
  ++reward_failures_in_a_row_;
  const bool alone = failing_workers_.size() == 1 && workers_.size() > 1;
  const int64_t mine = ++worker_failures_in_a_row_[worker];  // since its last accepted group
  // A group past the reward-time budget held the reward's workers for the whole budget: a
  // strike comes sooner than for a failure, which costs one call.
  const int64_t slow = failed == "reward_slow" ? ++worker_slow_in_a_row_[worker] : 0;
  const bool strike =
      alone && (mine % kRewardFailuresPerStrike == 0 || (slow > 0 && slow % kSlowRewardsPerStrike == 0));
  if (strike) ++actor_forged_[worker];
  if (reward_failures_in_a_row_ >= kRewardFailuresToStop && !alone && failure_.ok()) {
    failure_ = error;
    arrived_.notify_all();
  }
  return {false, failed, strike};
}

contract::SubmitOutcome TrajectoryIntake::EnvironmentFailed(const sched::WorkItem& work, const std::string& actor,
                                                          const Status& error) {
  const std::string settled = RefusalName(dispatcher_->Submit(work.group_id, work.lease_id, actor));
  if (!settled.empty()) {
    contract::GroupRollout g;
    g.group_id = work.group_id;
    g.actor = actor;
    return Refuse(g, settled);
  }
  return Failed(work.group_id, actor, "reward_error",
                error.WithContext("group " + std::to_string(work.group_id) + " played for " + actor));
}

Result<TrajectoryIntake::Verdict> TrajectoryIntake::Verify(contract::GroupRollout* g,
                                                           const data::TaskAdapter& task) const {
  Verdict v;
  // A single-turn worker does not score (scored_by_learner); a multi-turn one plays against
  // its environment, whose reward must agree with the replay's.
  const auto take = [&](data::Episode& e, data::Scored s) {
    if (s.reward != e.reward && task.MaxTurns() > 1 && task.ActorsCanScore()) ++v.corrected;
    e.reward = s.reward;
    e.success = s.reward >= 1.0;
    e.metrics = std::move(s.metrics);
  };
  const auto encode = [&](const data::PolicyPrompt& p) { return vocab_->EncodePrompt(p.system, p.user); };
  if (task.MaxTurns() == 1) {
    // Single-turn: every episode answers the group's prompt (encoded once); the group is
    // scored together (a scoring service takes it in one request).
    ECHELON_ASSIGN_OR_RETURN(const std::vector<int64_t> prompt_ids, encode(data::PolicyPrompt::Of(g->prompt)));
    std::vector<std::string> texts;
    for (data::Episode& e : g->episodes) {
      if (e.turns[0].prompt_ids != prompt_ids) return Verdict{"prompt_mismatch", 0};
      e.turns[0].text = vocab_->DecodeCompletion(e.turns[0].tokens);  // not the worker's (unbounded) text
      texts.push_back(e.turns[0].text);
    }
    ECHELON_ASSIGN_OR_RETURN(std::vector<data::Scored> scored, task.RewardGroup(g->prompt, texts));
    for (size_t i = 0; i < scored.size(); ++i) take(g->episodes[i], std::move(scored[i]));
    return v;
  }
  // Multi-turn: each episode is replayed from its actions, when the adapter can.
  for (data::Episode& e : g->episodes) {
    std::vector<std::string> actions;
    for (data::Turn& t : e.turns) {
      t.text = vocab_->DecodeCompletion(t.tokens);
      actions.push_back(t.text);
    }
    ECHELON_ASSIGN_OR_RETURN(std::optional<data::Replay> r, task.ReplayEpisode(g->prompt, actions));
    if (!r) continue;
    if (r->prompts.size() < e.turns.size()) return Verdict{"actions_after_done", 0};
    for (size_t i = 0; i < e.turns.size(); ++i) {
      ECHELON_ASSIGN_OR_RETURN(const std::vector<int64_t> ids, encode(r->prompts[i]));
      if (ids != e.turns[i].prompt_ids) return Verdict{"prompt_mismatch", 0};
    }
    take(e, std::move(r->scored));
    e.success = r->success;
  }
  return v;
}

Status TrajectoryIntake::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

int64_t TrajectoryIntake::accepted_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_tokens_;
}

std::map<std::string, int64_t> TrajectoryIntake::actor_groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return actor_groups_;
}

std::map<std::string, int64_t> TrajectoryIntake::actor_forged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return actor_forged_;
}

void TrajectoryIntake::RestoreCounters(std::map<std::string, int64_t> refusals, int64_t accepted_tokens,
                                       std::map<std::string, int64_t> actor_groups,
                                       std::map<std::string, int64_t> actor_forged) {
  std::lock_guard<std::mutex> lock(mu_);
  refusals_ = std::move(refusals);
  accepted_tokens_ = accepted_tokens;
  actor_groups_ = std::move(actor_groups);
  actor_forged_ = std::move(actor_forged);
}

contract::Snapshot TrajectoryIntake::Latest() {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

contract::Snapshot TrajectoryIntake::Pinned(int64_t version) {
  if (rounds_ != nullptr)
    if (contract::Snapshot s = rounds_->Pinned(version); s.version >= 0) return s;
  return SnapshotSource::Pinned(version);
}

void TrajectoryIntake::Publish(contract::Snapshot snapshot) {
  if (verifier_ != nullptr) verifier_->Remember(snapshot);
  std::lock_guard<std::mutex> lock(mu_);
  if (first_published_ < 0) first_published_ = snapshot.version;
  published_.insert(snapshot.version);
  snapshot_ = std::move(snapshot);
}

std::vector<contract::GroupRollout> TrajectoryIntake::Drain(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  arrived_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), [&] { return !queue_.empty(); });
  std::vector<contract::GroupRollout> out(std::make_move_iterator(queue_.begin()),
                                          std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

std::map<std::string, int64_t> TrajectoryIntake::refusals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusals_;
}

}  // namespace echelon::learn
