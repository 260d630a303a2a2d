// HostedEpisodes: the learner plays a multi-turn task's environment for remote actors, so what
// the environment keeps hidden (poker's deal: every hand at the table; an environment's seed)
// never leaves the learner. A hosted group runs the task's RunGroup on a thread of its own
// with a Policy whose Sample hands the prompts to the actor (the reply to its Play call) and
// waits for the completions (its next Play call). When RunGroup returns, the group goes to the
// intake as the actor's submission, checked like any other (lease, limits, log-probs, replay),
// and the last Play reply says how it was taken. An environment that fails refuses the group
// (TrajectoryIntake::EnvironmentFailed) and the run goes on.
//
//   HostedEpisodes host(&intake, {.turn_timeout_seconds = lease_seconds});
//   if (host.Host(actor_id, assignment)) { /* the actor gets the work without its prompt */ }
//   Result<contract::PlayStep> step = host.Play(actor_id, work, version, std::move(turns), seconds);
//
// Completions are read as an attacker with a valid token would write them: the count must
// answer the prompts, each within the run's token limits, and the group must be the caller's
// (InvalidArgument otherwise, which the server counts as forged); their text is the learner's
// decoding of their tokens.
//
// Thread contract: Host and Play are safe for concurrent use. One Play at a time per group (a
// second one while the first waits is refused). A group's thread waits for the actor at most
// turn_timeout_seconds, then ends; the destructor ends and joins every group's thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "echelon/contract/transport.h"
#include "echelon/learn/trajectory_intake.h"

namespace echelon::learn {

struct HostedEpisodesOptions {
  // How long a group waits for the actor's next completions (and an unplayed group for its
  // first Play) before it is given up; its lease expires on the dispatcher's own clock.
  double turn_timeout_seconds = 600;
  // How long one Play call waits for the environment's turn before it answers "call again"
  // (below the caller's deadline, net::kPlayDeadlineSeconds).
  double environment_wait_seconds = 50;
};

class HostedEpisodes : public contract::EpisodeHost {
 public:
  HostedEpisodes(TrajectoryIntake* intake, HostedEpisodesOptions options);
  ~HostedEpisodes() override;
  HostedEpisodes(const HostedEpisodes&) = delete;
  HostedEpisodes& operator=(const HostedEpisodes&) = delete;

  // True when `a` is played here (the task has more than one turn): `actor` then plays it
  // through Play, and the work goes out without its prompt.
  bool Host(const std::string& actor, const contract::Assignment& a);
  // True when every group of the run is played here (a multi-turn task): a worker's own
  // submission of such a group skipped the environment and is refused.
  bool PlaysEveryGroup() const;
  Result<contract::PlayStep> Play(const std::string& actor, const sched::WorkItem& work, int64_t behavior_version,
                                 std::vector<data::Turn> turns, double generate_seconds) override;
  // Groups being played or waiting for their first Play.
  size_t open_groups() const;

  struct Table;  // one hosted group (hosted_episodes.cc)

 private:
  void RunTable(const std::shared_ptr<Table>& table);
  // Ends and forgets groups that finished or were never played in time; call with mu_ held,
  // join the returned threads without it.
  std::vector<std::shared_ptr<Table>> SweepLocked();

  TrajectoryIntake* const intake_;
  const HostedEpisodesOptions options_;
  mutable std::mutex mu_;                               // guards tables_
  std::map<uint64_t, std::shared_ptr<Table>> tables_;  // by lease id
};

}  // namespace echelon::learn
