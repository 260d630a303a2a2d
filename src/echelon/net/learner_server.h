// LearnerServer: the learner's gRPC endpoint. It authenticates every call, registers actors
// (checking the protocol version), tracks their liveness, and forwards work, submissions and
// snapshots to the learner's in-process hub through the contract/transport.h interfaces, so the
// learner loop is the same whether actors are threads or remote processes.
//
// Identities: an actor id is its name, '#', and 128 random bits, so no caller can guess
// another's; with per-worker tokens (TokenTable) an actor's name is its token's and a call
// about an actor must carry that actor's token. A worker whose submissions are refused as
// forged kQuarantineAfterForged times is quarantined: its calls are refused and its actors
// evicted (their leases re-issued). ReloadTokens re-reads the token file (SIGHUP): the
// actors of a worker whose token is gone are evicted the same way.
//
//   LearnerServer server(opts, &hub, &hub, &hub, &clock);
//   ECHELON_RETURN_IF_ERROR(server.Start());          // opts.listen "0.0.0.0:7700" or ":0"
//   for (const std::string& id : server.EvictSilent()) dispatcher.Evict(id);
//
// Pipelines: a worker may be several stage processes (PipelineRole), each holding a range of
// the layers. The server groups them by pipeline name (all under one token), asks the rules of
// sched/pipeline_formation.h which process serves each stage and whose groups to re-issue, asks
// the injected options.split_layers for the layers over the members' declared memory and speed,
// and tells each member where the next is; only the head of a complete pipeline gets work.
// Stages fetch only their layers' tensors (SnapshotRequest.ranged).
//
// Thread contract: gRPC calls arrive on gRPC's threads; every method is safe for concurrent
// use (one mutex guards the actor table and counters).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "echelon/common/clock.h"
#include "echelon/common/log.h"
#include "echelon/common/status.h"
#include "echelon/model/model_config.h"
#include "echelon/net/auth.h"
#include "echelon/contract/transport.h"
#include "echelon/sched/pipeline_formation.h"
#include "echelon/sched/tunables.h"

namespace grpc {
class Server;
}

namespace echelon::learn {
class HostedEpisodes;
}

namespace echelon::net {

struct LearnerServerOptions {
  std::string listen = "127.0.0.1:0";  // port 0: the system picks one (see port())
  TokenTable tokens;                   // empty: no authentication (tests; --insecure)
  std::string token_file;              // where `tokens` came from: ReloadTokens re-reads it
  int quarantine_after_forged = sched::kQuarantineAfterForged;
  std::string run_spec_json;           // handed to every actor at registration
  double heartbeat_seconds = sched::kHeartbeatSeconds;  // reasons: sched/tunables.h
  double evict_after_seconds = sched::kEvictAfterSeconds;
  std::string tls_cert_file;  // PEM; with tls_key_file enables TLS
  std::string tls_key_file;
  int broadcast_port = 0;          // > 0: actors are told to join the snapshot broadcast here
  std::string broadcast_key_pem;   // the broadcast origin's public key, for actors to pin
  // The token a registering actor joins the broadcast with (BroadcastOrigin::Admit), good until
  // the registration ends; unset: none (a broadcast without access control).
  std::function<std::string(const std::string& actor_id, const std::string& worker)> broadcast_admit;
  // Plays multi-turn groups for the actors (their work goes out without its prompt, and the
  // actors answer Play); null: actors play the whole episode and submit it.
  learn::HostedEpisodes* episodes = nullptr;
  // Splits a complete pipeline's layers over its members (plan::SplitPipelineLayers in a run);
  // null: pipelines are never complete, so their heads get no work.
  sched::LayerSplitter split_layers;
};

// A pipeline stage's registration (proto PipelineRole).
struct StageRole {
  std::string pipeline;
  int stage = -1;  // -1: a whole-model actor
  int stages = 0;
  std::string address;
  double memory_bytes = 0;
  double seconds_per_layer = 0;
  std::string cert_pem;  // stage > 0 under TLS: the certificate it serves with
};

// A pipeline as the learner formed it (proto PipelineView).
struct PipelineState {
  std::string identity;             // the token name every member must share
  int stages = 0;
  std::vector<std::string> active;  // the live member of each stage ("" when none)
  std::vector<std::pair<int64_t, int64_t>> layers;  // per stage [first, last), when complete
  uint64_t epoch = 0;
  bool complete = false;
};

struct ActorInfo {
  std::string id;
  std::string name;
  std::string identity;  // the name of the token it registered with ("" for a shared token)
  // Whom strikes, quarantine and the registration cap count against: its token's name, or with
  // a shared token (whose actors name themselves) the name at the address it called from,
  // "NAME at HOST".
  std::string worker;
  std::string peer;
  double registered_at = 0;
  double last_seen = 0;
  int64_t submitted = 0;
  int64_t refused = 0;
  int64_t forged = 0;
  bool told_done = false;
  StageRole role;
};

class LearnerServer {
 public:
  LearnerServer(LearnerServerOptions options, contract::WorkSource* work, contract::TrajectorySink* sink,
                contract::SnapshotSource* snapshots, const Clock* clock);
  ~LearnerServer();
  LearnerServer(const LearnerServer&) = delete;
  LearnerServer& operator=(const LearnerServer&) = delete;

  // Binds and starts serving; fails with a clear message when the address cannot be bound.
  Status Start();
  int port() const { return port_; }
  void Shutdown();
  // From now on every reply says the run is done, so actors exit.
  void SetDone();
  // After SetDone: waits until every registered actor has been told (or `timeout_seconds`),
  // so actors leave cleanly instead of retrying against a learner that is gone.
  void WaitUntilActorsTold(double timeout_seconds);

  // Forgets actors silent for longer than evict_after_seconds, and returns their ids with
  // those of actors quarantined or revoked since the last call (the caller re-issues their
  // work). Cuts the snapshot streams nothing could be written to for kSnapshotStallSeconds.
  std::vector<std::string> EvictSilent();
  // Re-reads options.token_file. Actors whose token is no longer listed are evicted; on an
  // error (the file is unreadable or malformed) the current tokens stay in force.
  Status ReloadTokens();
  // Counts a forgery found outside a submission's answer (a forged prefix report, or the part
  // of a resumed group this actor drew: learn::TrajectoryIntake::SetStrikeHook) against the
  // actor's worker, as a forged submission is; nothing when the actor is no longer registered
  // (or before Start).
  void Strike(const std::string& actor_id, const std::string& reason);
  // Quarantined workers (token names, or "NAME at HOST" with a shared token).
  std::set<std::string> Quarantined() const;
  std::vector<ActorInfo> Actors() const;
  // Calls refused before reaching the hub, by reason ("unauthenticated", "protocol_version",
  // "unknown_actor", ...), plus evictions.
  std::map<std::string, int64_t> Counters() const;
  std::map<std::string, PipelineState> Pipelines() const;

  class Service;  // the gRPC service implementation (learner_server.cc)

 private:
  friend class Service;
  // Unregisters the actors `which` selects; EvictSilent returns them next.
  void RemoveActorsLocked(const std::function<bool(const ActorInfo&)>& which);
  // Re-forms pipeline `name` after a member came or went (sched::ChooseStageMembers): a new
  // epoch and split of the layers (options.split_layers) when the members changed, and the
  // head's groups re-issued when the rules say so: EvictSilent returns the head's id.
  void ReformLocked(const std::string& name);
  // The tensors a stage of layers [first, last) holds, of the newest snapshot (cached per range
  // of the newest version, within twice the whole snapshot's bytes).
  Result<std::shared_ptr<const std::string>> RangedSnapshot(const contract::Snapshot& snap, int64_t first, int64_t last);

  LearnerServerOptions options_;
  contract::WorkSource* work_;
  contract::TrajectorySink* sink_;
  contract::SnapshotSource* snapshots_;
  const Clock* clock_;
  LogBudget refusal_log_;  // calls refused before a token is known (common/log.h)
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  mutable std::mutex mu_;  // guards everything below
  std::map<std::string, ActorInfo> actors_;
  std::map<std::string, int64_t> counters_;
  TokenTable tokens_;
  std::map<std::string, int64_t> forged_;     // by worker (see Quarantined)
  std::set<std::string> quarantined_;
  std::vector<std::string> removed_;          // quarantined or revoked, not yet returned by EvictSilent
  std::map<std::string, PipelineState> pipelines_;
  std::vector<std::string> reissue_;          // heads whose pipeline lost a stage (see ReformLocked)
  bool done_ = false;
  const std::string incarnation_;  // random, per process
  std::optional<model::ModelConfig> model_;  // from the run spec; pipelines need it
  std::map<grpc::ServerContext*, double> streams_;  // snapshot streams running: when a piece was last written

  std::mutex ranged_mu_;  // guards ranged_
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::shared_ptr<const std::string>> ranged_;
};

}  // namespace echelon::net
