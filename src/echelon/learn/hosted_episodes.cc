#include "echelon/learn/hosted_episodes.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <thread>

namespace echelon::learn {

using SteadyClock = std::chrono::steady_clock;

struct HostedEpisodes::Table {
  enum class Phase {
    kWaiting,  // handed out, not played yet
    kPlaying,  // RunGroup runs (the environment's turn)
    kAsking,   // prompts are out; waiting for the actor's completions
    kDone,     // taken by the intake (or given up): `outcome`
  };
  std::string actor;
  contract::Assignment work;
  SteadyClock::time_point opened;
  std::thread thread;  // runs RunTable from the first Play on

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  Phase phase = Phase::kWaiting;
  bool in_play = false;     // a Play call is waiting on this group
  bool cancelled = false;   // the learner is stopping
  bool actor_gone = false;  // the actor sent nothing within the timeout
  std::vector<data::PolicyPrompt> prompts;
  uint64_t prompt_seed = 0;
  std::vector<data::Turn> turns;  // handed in, not yet taken by Sample
  bool has_turns = false;
  int64_t version = std::numeric_limits<int64_t>::max();  // the oldest the actor claimed
  double generate_seconds = 0;
  contract::SubmitOutcome outcome;
};

namespace {

using Phase = HostedEpisodes::Table::Phase;

std::chrono::duration<double> Seconds(double s) { return std::chrono::duration<double>(s); }

// The Policy RunGroup drives on a group's thread: each Sample is one round trip to the actor.
class ActorPolicy final : public data::Policy {
 public:
  ActorPolicy(HostedEpisodes::Table* table, double timeout_seconds) : t_(table), timeout_(timeout_seconds) {}

  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override {
    std::unique_lock<std::mutex> lock(t_->mu);
    t_->prompts = prompts;
    t_->prompt_seed = seed;
    t_->phase = Phase::kAsking;
    t_->cv.notify_all();
    const bool got = t_->cv.wait_for(lock, Seconds(timeout_), [&] { return t_->has_turns || t_->cancelled; });
    if (t_->cancelled) return Aborted("the learner is stopping");
    if (!got) {
      t_->actor_gone = true;
      return DeadlineExceeded("no completions within " + std::to_string(timeout_) + " s");
    }
    t_->has_turns = false;
    t_->phase = Phase::kPlaying;
    // The learner asked for these: the verifier checks each token against this call's draws.
    for (size_t i = 0; i < t_->turns.size(); ++i) {
      t_->turns[i].draw_seed = seed;
      t_->turns[i].draw_row = static_cast<int64_t>(i);
    }
    return std::move(t_->turns);
  }

 private:
  HostedEpisodes::Table* const t_;
  const double timeout_;
};

}  // namespace

HostedEpisodes::HostedEpisodes(TrajectoryIntake* intake, HostedEpisodesOptions options)
    : intake_(intake), options_(options) {}

HostedEpisodes::~HostedEpisodes() {
  std::map<uint64_t, std::shared_ptr<Table>> tables;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tables.swap(tables_);
  }
  for (auto& [lease, t] : tables) {
    std::lock_guard<std::mutex> lock(t->mu);
    t->cancelled = true;
    t->cv.notify_all();
  }
  for (auto& [lease, t] : tables) {
    if (t->thread.joinable()) t->thread.join();
  }
}

bool HostedEpisodes::PlaysEveryGroup() const { return intake_->task().MaxTurns() > 1; }

bool HostedEpisodes::Host(const std::string& actor, const contract::Assignment& a) {
  if (!PlaysEveryGroup()) return false;
  auto t = std::make_shared<Table>();
  t->actor = actor;
  t->work = a;
  t->opened = SteadyClock::now();
  std::vector<std::shared_ptr<Table>> swept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    swept = SweepLocked();
    tables_[a.work.lease_id] = std::move(t);
  }
  for (auto& s : swept) {
    if (s->thread.joinable()) s->thread.join();
  }
  return true;
}

std::vector<std::shared_ptr<HostedEpisodes::Table>> HostedEpisodes::SweepLocked() {
  std::vector<std::shared_ptr<Table>> swept;
  const auto now = SteadyClock::now();
  for (auto it = tables_.begin(); it != tables_.end();) {
    Table& t = *it->second;
    bool gone;
    {
      std::lock_guard<std::mutex> lock(t.mu);
      gone = !t.in_play && (t.phase == Phase::kDone ||
                            (t.phase == Phase::kWaiting && now - t.opened > Seconds(options_.turn_timeout_seconds)));
    }
    if (gone) {
      swept.push_back(it->second);
      it = tables_.erase(it);
    } else {
      ++it;
    }
  }
  return swept;
}

size_t HostedEpisodes::open_groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tables_.size();
}

void HostedEpisodes::RunTable(const std::shared_ptr<Table>& t) {
  ActorPolicy policy(t.get(), options_.turn_timeout_seconds);
  Result<std::vector<data::Episode>> episodes =
      intake_->task().RunGroup(t->work.prompt, t->work.group_size, policy, t->work.seed);
  bool cancelled, gone;
  contract::GroupRollout g;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    cancelled = t->cancelled;
    gone = t->actor_gone;
    g.behavior_version = t->version;
    g.generate_seconds = t->generate_seconds;
  }
  contract::SubmitOutcome out;
  if (cancelled) {
    out = {false, "learner_stopping"};
  } else if (gone) {
    out = {false, "play_timeout"};  // its lease expires and the group goes to another actor
  } else if (!episodes.ok()) {
    out = intake_->EnvironmentFailed(t->work.work, t->actor, episodes.status());
  } else {
    g.group_id = t->work.work.group_id;
    g.lease_id = t->work.work.lease_id;
    g.actor = t->actor;
    g.prompt = t->work.prompt;
    g.episodes = std::move(episodes).value();
    out = intake_->Submit(std::move(g));
  }
  std::lock_guard<std::mutex> lock(t->mu);
  t->outcome = std::move(out);
  t->phase = Phase::kDone;
  t->cv.notify_all();
}

Result<contract::PlayStep> HostedEpisodes::Play(const std::string& actor, const sched::WorkItem& work,
                                               int64_t behavior_version, std::vector<data::Turn> turns,
                                               double generate_seconds) {
  const std::string group = "group " + std::to_string(work.group_id);
  std::shared_ptr<Table> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(work.lease_id);
    if (it == tables_.end())
      return NotFound(group + " (lease " + std::to_string(work.lease_id) +
                      ") is not being played here: finished, given up, or never handed out");
    t = it->second;
  }
  if (t->actor != actor || t->work.work.group_id != work.group_id)
    return InvalidArgument(group + ": lease " + std::to_string(work.lease_id) + " is not this actor's");
  const IntakeLimits& limits = intake_->limits();
  std::unique_lock<std::mutex> lock(t->mu);
  if (t->in_play) return FailedPrecondition(group + ": another Play of it is waiting");
  if (t->phase == Phase::kDone) {
    // Over (given up while the actor was silent, say): whatever it sends, it hears how.
  } else if (t->phase == Phase::kWaiting) {
    if (!turns.empty()) return InvalidArgument(group + ": the first Play of a group carries no completions");
    t->phase = Phase::kPlaying;
    t->thread = std::thread([this, t] { RunTable(t); });
  } else if (t->phase == Phase::kAsking && !turns.empty()) {
    if (turns.size() != t->prompts.size())
      return InvalidArgument(group + ": " + std::to_string(turns.size()) + " completions for " +
                             std::to_string(t->prompts.size()) + " prompts");
    for (data::Turn& turn : turns) {
      if (turn.tokens.empty() || static_cast<int64_t>(turn.tokens.size()) > limits.max_completion_tokens ||
          turn.logprobs.size() != turn.tokens.size())
        return InvalidArgument(group + ": a completion of " + std::to_string(turn.tokens.size()) + " tokens and " +
                               std::to_string(turn.logprobs.size()) + " log-probs (1.." +
                               std::to_string(limits.max_completion_tokens) + " of each)");
      for (int64_t id : turn.tokens) {
        if (id < 0 || id >= limits.model_vocab_size)
          return InvalidArgument(group + ": token id " + std::to_string(id) + " is outside the vocabulary");
      }
      turn.text = intake_->vocab().DecodeCompletion(turn.tokens);  // never the worker's text
    }
    t->turns = std::move(turns);
    t->has_turns = true;
    t->version = std::min(t->version, behavior_version);
    t->generate_seconds += std::max(0.0, generate_seconds);
    t->phase = Phase::kPlaying;
    t->cv.notify_all();
  } else if (!turns.empty()) {
    return FailedPrecondition(group + ": completions sent while no prompt is out");
  }
  // No completions with prompts out: a repeated call (its reply was lost) gets them again.
  t->in_play = true;
  t->cv.wait_for(lock, Seconds(options_.environment_wait_seconds), [&] {
    return t->phase == Phase::kDone || t->cancelled || (t->phase == Phase::kAsking && !t->has_turns);
  });
  t->in_play = false;
  contract::PlayStep step;
  if (t->phase == Phase::kAsking && !t->has_turns) {
    step.prompts = t->prompts;
    step.seed = t->prompt_seed;
    return step;
  }
  if (t->phase != Phase::kDone)
    return Unavailable(group + ": the environment did not answer within " +
                       std::to_string(options_.environment_wait_seconds) + " s; call Play again without completions");
  step.outcome = t->outcome;
  lock.unlock();
  bool erased = false;
  {
    std::lock_guard<std::mutex> tables_lock(mu_);
    auto it = tables_.find(work.lease_id);
    if (it != tables_.end() && it->second == t) {
      tables_.erase(it);
      erased = true;
    }
  }
  if (erased && t->thread.joinable()) t->thread.join();
  return step;
}

}  // namespace echelon::learn
