// ThreadActors: the actors of a run as threads of the learner's process (`rollout.transport:
// threads`), each with its own model copy and ModelPolicy. They are set up from the run spec
// as a remote actor is, and reach the learner only through the intake (the
// contract/transport.h interfaces), so the learner loop cannot tell them from remote ones. A
// multi-turn group they play themselves with the learner's own adapter (the intake's task),
// which holds what the spec leaves out (an environment's server); in a process of its own the
// learner plays such a group (learn/hosted_episodes.h).
// Nothing is evicted (a thread does not vanish) and nothing is refused before the intake.
// It lives in cli/, where the two planes are composed: the learning plane's ActorTransport
// made of the rollout plane's Actor, so that neither plane includes the other.
//
//   ThreadActors actors(/*count=*/2, /*slowdowns=*/{1.0, 3.0});
//   learn::RunLearner(options, args, actors, rollout::EvaluateModel, ...);
//
// Thread contract: as ActorTransport; Start starts one thread per actor, StopWork joins them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/contract/run_spec.h"
#include "echelon/learn/actor_transport.h"
#include "echelon/rollout/actor.h"

namespace echelon::cli {

class ThreadActors : public learn::ActorTransport {
 public:
  // `slowdowns[i]` > 1 slows actor i down (heterogeneity experiments); may be empty.
  ThreadActors(int64_t count, std::vector<double> slowdowns, const Clock* clock = nullptr);
  ~ThreadActors() override;

  Status Start(learn::TrajectoryIntake* intake, const std::string& run_spec_json, std::ostream& progress) override;
  int64_t live_actors() const override { return static_cast<int64_t>(actors_.size()); }
  std::vector<std::string> EvictSilent() override { return {}; }
  std::map<std::string, int64_t> Refusals() const override { return {}; }
  Status Broadcast(int64_t, const std::string&) override { return Status::Ok(); }
  std::optional<learn::BroadcastCompletion> TakeCompletedBroadcast() override { return std::nullopt; }
  void StopWork() override;
  void Finish() override {}

 private:
  const int64_t count_;
  const std::vector<double> slowdowns_;
  const Clock* clock_;
  std::unique_ptr<contract::ActorSetup> setup_;  // the task adapter the actors share
  std::vector<std::unique_ptr<rollout::Actor>> actors_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

}  // namespace echelon::cli
