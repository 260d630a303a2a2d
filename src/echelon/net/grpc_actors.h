// GrpcActors: the learning plane's transport to actors that run as processes anywhere
// (learn/actor_transport.h over gRPC). It serves the intake with a LearnerServer (auth,
// registration with the run spec, liveness, eviction) and, with `broadcast`, sends every
// published snapshot out by peer-assisted broadcast from a BroadcastOrigin signed with a key
// made for this learner process (actors learn its port and public key at registration).
//
//   GrpcActorsOptions o;  o.listen = "0.0.0.0:7700";  o.tokens = TokenTable::Shared(token);
//   GrpcActors transport(o, &clock);
//   RunLearner(options, args, transport, ...);
//
// Thread contract: as ActorTransport (learner thread); gRPC and the origin run their own
// threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/learn/actor_transport.h"
#include "echelon/net/auth.h"
#include "echelon/sched/pipeline_formation.h"
#include "echelon/sched/tunables.h"

namespace echelon::learn {
class HostedEpisodes;
}

namespace echelon::net {

class BroadcastOrigin;
class LearnerServer;

struct GrpcActorsOptions {
  std::string listen = "127.0.0.1:0";
  TokenTable tokens;       // who may call (net/auth.h); empty: anyone (tests, --insecure)
  std::string token_file;  // where `tokens` came from, re-read when *reload_tokens is set
  // Set by a SIGHUP handler; checked (and cleared) whenever silent actors are collected.
  std::atomic<bool>* reload_tokens = nullptr;
  std::string tls_cert_file;
  std::string tls_key_file;
  double heartbeat_seconds = sched::kHeartbeatSeconds;
  double evict_after_seconds = sched::kEvictAfterSeconds;
  bool broadcast = true;  // snapshots by peer-assisted broadcast (else actors pull them)
  // Where the broadcast origin listens; empty: the host of `listen`, a port the system picks.
  std::string broadcast_listen;
  // Hosts any peer may advertise besides its own (BroadcastOriginOptions::advertise_hosts).
  std::vector<std::string> broadcast_peer_hosts;
  // How long a multi-turn group the learner plays waits for an actor's completions
  // (learn::HostedEpisodesOptions; the run's lease time).
  double play_turn_timeout_seconds = sched::kDefaultLeaseSeconds;
  // Called once the server listens, with its port (e.g. to start actor processes).
  std::function<void(int port)> on_listening;
  // Splits a pipelined worker's layers over its stages (LearnerServerOptions::split_layers).
  sched::LayerSplitter split_layers;
};

class GrpcActors : public learn::ActorTransport {
 public:
  GrpcActors(GrpcActorsOptions options, const Clock* clock);
  ~GrpcActors() override;
  GrpcActors(const GrpcActors&) = delete;
  GrpcActors& operator=(const GrpcActors&) = delete;

  Status Start(learn::TrajectoryIntake* intake, const std::string& run_spec_json, std::ostream& progress) override;
  int64_t live_actors() const override;
  // Peers on the snapshot broadcast's control streams (0 without a broadcast).
  int64_t broadcast_peers() const;
  std::vector<std::string> EvictSilent() override;
  std::map<std::string, int64_t> Refusals() const override;
  Status Broadcast(int64_t version, const std::string& safetensors_bytes) override;
  std::optional<learn::BroadcastCompletion> TakeCompletedBroadcast() override;
  void StopWork() override;
  void Finish() override;

 private:
  const GrpcActorsOptions options_;
  const Clock* clock_;
  std::unique_ptr<BroadcastOrigin> origin_;
  std::unique_ptr<learn::HostedEpisodes> episodes_;  // outlived by server_, which calls into it
  std::unique_ptr<LearnerServer> server_;
  // Published versions not yet held by every peer (newest 8), with their sizes whole.
  std::deque<std::pair<int64_t, uint64_t>> broadcasting_;
};

}  // namespace echelon::net
