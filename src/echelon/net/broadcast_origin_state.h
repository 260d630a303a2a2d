// The origin's own records of its peers, versions and pending transfers, shared by its two
// files: broadcast_origin.cc (publishing, orders, outcomes, completion) and
// broadcast_origin_peers.cc (who may join, the control streams, deaths). Not an interface:
// only those two include it.
//
// Thread contract: as BroadcastOrigin's (broadcast_origin.h): the fields marked so are guarded
// by BroadcastOrigin::mu_.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "echelon/broadcast/relay_session.h"
#include "echelon/net/broadcast_origin.h"
#include "echelon/v1/broadcast.grpc.pb.h"

namespace echelon::net {

using broadcast::NodeId;
using broadcast::Transfer;
using broadcast::TransferOutcome;
using DoneFn = std::function<void(const Transfer&, TransferOutcome)>;
using Stream = grpc::ServerReaderWriter<v1::OriginToPeer, v1::PeerToOrigin>;

// One peer's control stream. The stream pointer is valid only while its handler runs:
// writers take write_mu and check `closed`, which the handler sets before it returns.
struct BroadcastOrigin::Conn {
  std::string id;
  std::string holder;      // whom its token was admitted for ("" for the shared token)
  // Whose reports against a sender count as one receiver's: the worker its token was admitted
  // for, else (a shared token) this connection. A worker that opens many connections is still
  // one reporter, so it cannot get an honest relay declared dead on its own.
  std::string reporter;
  std::string ticket_key;  // its ChunkSource's (sent in the Welcome)
  std::string address;   // of its ChunkSource; empty: it dials out only (NAT) and never uploads
  std::string cert_pem;  // with TLS: what its ChunkSource serves with
  double upload_bps = kDefaultUploadBps;
  grpc::ServerContext* ctx = nullptr;
  Stream* stream = nullptr;

  std::mutex write_mu;  // guards stream writes, ctx cancellation and `closed`
  bool closed = false;

  // Guarded by BroadcastOrigin::mu_.
  bool alive = true;
  double last_seen = 0;
  std::map<uint64_t, NodeId> nodes;  // version -> this peer's node in that version's session
  std::map<uint64_t, bool> offered;  // versions announced and not yet answered with a Have
  int fetch_failures_in_a_row = 0;   // as a sender
  std::set<std::string> failure_reporters;  // the receivers (reporters) of those failures
  std::set<std::string> corrupt_reporters;  // reporters that said a chunk from it was corrupt

  bool Write(const v1::OriginToPeer& m) {
    std::lock_guard<std::mutex> lock(write_mu);
    return !closed && stream->Write(m);
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(write_mu);
    if (!closed) ctx->TryCancel();
  }
};

// One published version: its manifest, and the planner + session whose Link is the origin.
struct BroadcastOrigin::Version : public broadcast::Link {
  BroadcastOrigin* origin = nullptr;
  broadcast::Manifest manifest;
  std::string envelope;  // signed manifest
  double published_at = 0;
  std::unique_ptr<broadcast::RelayPlanner> planner;
  std::unique_ptr<broadcast::RelaySession> session;
  // Guarded by BroadcastOrigin::mu_.
  std::map<NodeId, std::shared_ptr<Conn>> conns;  // every node ever added, dead ones too
  std::map<NodeId, std::vector<std::pair<Transfer, DoneFn>>> parked;  // endpoint not yet registered
  bool complete = false;
  uint64_t bytes_pulled = 0;  // as the receivers reported it
  std::vector<BroadcastTransferRecord> transfers;  // reported ones

  void Start(const Transfer& t, DoneFn done) override { origin->StartTransfer(this, t, std::move(done)); }
};

struct BroadcastOrigin::Pending {
  std::shared_ptr<Version> version;
  Transfer transfer;
  DoneFn done;
  std::shared_ptr<Conn> receiver;
  std::shared_ptr<Conn> sender;  // null for the origin
  double ordered_at = 0;
  int origin_fetches = 0;  // served by the origin's ChunkSource under this Order's ticket
};

class BroadcastOrigin::Service final : public v1::BroadcastOrigin::Service {
 public:
  explicit Service(BroadcastOrigin* o) : o_(o) {}

  grpc::Status Control(grpc::ServerContext* ctx, Stream* stream) override;

 private:
  BroadcastOrigin* const o_;
};

}  // namespace echelon::net
