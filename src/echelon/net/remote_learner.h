// RemoteLearner: an actor's view of a learner across the network. Implements the rollout
// plane's WorkSource, TrajectorySink and SnapshotSource over gRPC, so rollout::Actor runs
// unchanged. It registers (protocol version checked), heartbeats on its own thread, and rides
// through learner outages and evictions: calls that fail with UNAVAILABLE back off
// exponentially; a NOT_FOUND ("not registered") re-registers and carries on.
//
//   RemoteLearner learner({.address = "10.0.0.1:7700", .token = token, .name = "gpu-7"});
//   ECHELON_ASSIGN_OR_RETURN(std::string spec, learner.Connect(stop));
//   Actor actor(..., &learner, &learner, &learner, ...);
//
// Thread contract: Acquire/Submit/Latest are called from the actor thread; the heartbeat
// thread shares only the registration state (one mutex).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "echelon/common/status.h"
#include "echelon/rollout/transport.h"
#include "echelon/v1/learner.grpc.pb.h"

namespace echelon::net {

struct RemoteLearnerOptions {
  std::string address;        // host:port
  std::string token;          // bearer token; empty sends none
  std::string name = "actor";
  std::string tls_ca_file;    // PEM of the CA that signed the learner's certificate; enables TLS
  double rpc_timeout_seconds = 30;
};

class RemoteLearner : public rollout::WorkSource, public rollout::TrajectorySink, public rollout::SnapshotSource {
 public:
  explicit RemoteLearner(RemoteLearnerOptions options);
  ~RemoteLearner() override;

  // Registers, retrying with backoff while the learner is unreachable, until `stop`; returns
  // the run spec JSON. A refused registration (token, protocol version) is returned at once.
  Result<std::string> Connect(const std::atomic<bool>& stop);
  // True once the learner said the run is over.
  bool done() const { return done_.load(); }
  // Stops the heartbeat thread (the destructor does too).
  void Close();

  std::optional<rollout::Assignment> Acquire(const std::string& actor) override;
  rollout::SubmitOutcome Submit(rollout::GroupRollout rollout) override;
  rollout::Snapshot Latest() override;

 private:
  Status Register();
  void HeartbeatLoop();
  // Handles a failed call: re-registers on NOT_FOUND, sleeps with backoff on UNAVAILABLE.
  void Recover(int code, const std::string& what);
  std::string actor_id() const;

  RemoteLearnerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Learner::Stub> stub_;
  mutable std::mutex mu_;  // guards actor_id_, heartbeat_seconds_
  std::string actor_id_;
  double heartbeat_seconds_ = 1.0;
  std::atomic<int64_t> known_version_{-1};
  std::atomic<bool> done_{false};
  std::atomic<bool> closing_{false};
  const std::atomic<bool>* stop_ = nullptr;
  double backoff_ = 0.1;
  rollout::Snapshot cached_;
  std::string cached_run_spec_;
  std::string incarnation_;  // of the learner process last registered with
  std::thread heartbeat_;
};

}  // namespace echelon::net
