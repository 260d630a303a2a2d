// RemoteLearner: an actor's view of a learner across the network. Implements the rollout
// plane's WorkSource, TrajectorySink and SnapshotSource over gRPC, so rollout::Actor runs
// unchanged. It registers (protocol version checked), heartbeats on its own thread, and rides
// through learner outages and evictions: calls that fail with UNAVAILABLE back off
// exponentially; a NOT_FOUND ("not registered") re-registers and carries on.
//
// Snapshots: when the learner runs a broadcast origin (its registration reply names the port
// and the signing key), the actor joins the broadcast as a peer: it receives each snapshot's
// verified chunks from the origin or from other actors and relays what it holds. Latest()
// waits up to broadcast_wait_seconds for the version the learner last announced, then falls
// back to pulling the snapshot directly (GetSnapshot), so a blocked broadcast port costs
// time, never the run. A learner restart (new incarnation) replaces the peer. In a LoRA run the
// snapshots hold adapters; the whole model they adapt is pulled once (GetSnapshot with
// lora_base), checked against the SHA-256 they name, and handed out as Snapshot::base.
//
//   RemoteLearner learner({.address = "10.0.0.1:7700", .token = token, .name = "gpu-7"});
//   ECHELON_ASSIGN_OR_RETURN(std::string spec, learner.Connect(stop));
//   Actor actor(..., &learner, &learner, &learner, ...);
//
// Thread contract: Acquire/Submit/Latest are called from the actor thread; the heartbeat
// thread shares only the registration state (one mutex).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/contract/transport.h"
#include "echelon/model/qwen3.h"
#include "echelon/net/broadcast_peer.h"
#include "echelon/net/learner_server.h"
#include "echelon/net/protocol.h"
#include "echelon/v1/learner.grpc.pb.h"

namespace echelon::net {

// Where a pipeline stage stands (proto PipelineView), as the last heartbeat said.
struct PipelineRoute {
  uint64_t epoch = 0;
  bool complete = false;              // formed, with this process as its stage's member
  std::vector<std::string> addresses;  // per stage (the head's is empty)
  std::vector<std::string> certs;      // per stage: the certificate it serves with ("" without TLS)
  std::vector<model::LayerRange> layers;  // per stage
};

struct RemoteLearnerOptions {
  std::string address;        // host:port
  std::string token;          // bearer token; empty sends none
  std::string name = "actor";
  std::string tls_ca_pem;     // the CA that signed the learner's certificate (PEM text); enables TLS
  bool broadcast = true;                     // join the learner's snapshot broadcast if it has one
  std::string broadcast_listen = "0.0.0.0:0";  // where this actor serves chunks to other actors; "none": nowhere (NAT)
  std::string broadcast_advertise;           // HOST:PORT others dial; default: our address toward the learner
  double broadcast_upload_bps = 0;           // declared upload rate (the origin's first estimate, and
                                             // 95% of it paces uploads); 0: paced as its sockets show
  double broadcast_wait_seconds = 20;        // then pull the snapshot directly
  double snapshot_stall_seconds = kSnapshotStallSeconds;  // a direct pull with no piece for this long is cancelled
  // A stage of a pipelined worker (role.stage >= 0): registers as such, follows its pipeline
  // (route()), and fetches only its layers' tensors, directly (not by broadcast).
  StageRole role;
};

class RemoteLearner : public contract::WorkSource,
                      public contract::TrajectorySink,
                      public contract::SnapshotSource,
                      public contract::EpisodeHost {
 public:
  explicit RemoteLearner(RemoteLearnerOptions options);
  ~RemoteLearner() override;

  // Registers, retrying with backoff while the learner is unreachable, until `stop`; returns
  // the run spec JSON. A refused registration (token, protocol version) is returned at once.
  Result<std::string> Connect(const std::atomic<bool>& stop);
  // True once the learner said the run is over.
  bool done() const { return done_.load(); }
  // A pipeline stage's route; Latest() then returns the tensors of this stage's layers (version
  // -1 until the pipeline is formed).
  PipelineRoute route() const;
  // Makes Latest() fetch at least `version` (a pipeline stage whose head asked for it), even
  // before a heartbeat announces it.
  void Want(int64_t version);
  // For a stage that takes no work (so makes no calls that would notice): registers again when
  // the heartbeat found this process evicted. Call from the actor thread.
  void KeepRegistered();
  // Stops the heartbeat thread (the destructor does too).
  void Close();

  std::optional<contract::Assignment> Acquire(const std::string& actor) override;
  std::optional<contract::Assignment> AcquireWith(const std::string& actor, const contract::WorkRequest& request) override;
  bool ReportPrefix(const std::string& actor, const sched::WorkItem& work,
                    const std::vector<contract::PrefixPart>& parts) override;
  void Release(const std::string& actor, const sched::WorkItem& work) override;
  // Kept for the next heartbeat, which carries it to the learner.
  void Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) override;
  contract::SubmitOutcome Submit(contract::GroupRollout rollout) override;
  contract::Snapshot Latest() override;
  // The newest version Latest would return at once: with the broadcast, the newest this peer
  // holds whole; without it, the one the learner last announced (pulled on demand).
  int64_t NewestVersion() override;
  // Pulls exactly `version` directly (an evaluation group's pinned snapshot), unless it is the
  // one held.
  contract::Snapshot Pinned(int64_t version) override;
  // A turn of a group the learner plays (no retry: an error gives the group up, and its lease
  // expires).
  Result<contract::PlayStep> Play(const std::string& actor, const sched::WorkItem& work, int64_t behavior_version,
                                 std::vector<data::Turn> turns, double generate_seconds) override;

 private:
  Status Register();
  // (Re)joins the broadcast the registration reply names; on failure snapshots come directly.
  // Joins the learner's broadcast with the token it handed out (a worker's own token never
  // goes to other workers).
  void JoinBroadcast(uint32_t port, const std::string& key_pem, const std::string& token);
  // The snapshot of at least `version` by broadcast, or nullopt (none, or it timed out).
  std::optional<contract::Snapshot> FromBroadcast(int64_t version);
  // Streams GetSnapshot's answer to `req`; nullopt when it failed (Recover has run).
  std::optional<contract::Snapshot> Pull(const v1::SnapshotRequest& req);
  // A LoRA run: `snap`'s base (the adapters' metadata names its SHA-256), fetched once and
  // checked; false when it could not be had.
  bool AttachBase(contract::Snapshot& snap);
  void HeartbeatLoop();
  // Handles a failed call: re-registers on NOT_FOUND, sleeps with backoff on UNAVAILABLE.
  void Recover(int code, const std::string& what);
  std::string actor_id() const;

  RemoteLearnerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Learner::Stub> stub_;
  mutable std::mutex mu_;  // guards actor_id_, heartbeat_seconds_, route_, progress_
  std::map<uint64_t, v1::LeaseProgress> progress_;  // by group: what the next heartbeat reports
  std::string actor_id_;
  double heartbeat_seconds_ = 1.0;
  PipelineRoute route_;
  std::atomic<bool> lost_{false};  // the heartbeat was told this actor is unknown
  model::LayerRange cached_range_{-1, -1};  // of cached_, for a pipeline stage
  std::atomic<int64_t> known_version_{-1};
  std::atomic<bool> done_{false};
  std::atomic<bool> closing_{false};
  const std::atomic<bool>* stop_ = nullptr;
  double backoff_ = 0.1;
  contract::Snapshot cached_;
  std::shared_ptr<const std::string> base_;  // a LoRA run's base, and its SHA-256
  std::string base_sha_;
  std::string cached_run_spec_;
  std::string incarnation_;  // of the learner process last registered with
  std::unique_ptr<BroadcastPeer> peer_;  // joined to the learner's broadcast (actor thread only)
  // The broadcast this registration may join (actor thread only): a peer whose link broke
  // after the registration (revoked with the one before, just noticed) joins again once.
  struct BroadcastInvite {
    uint32_t port = 0;
    std::string key_pem;
    std::string token;
    bool used = false;
  } invite_;
  std::thread heartbeat_;
};

}  // namespace echelon::net
