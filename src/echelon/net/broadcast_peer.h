// BroadcastPeer: a receiver and relay of the weight broadcast over gRPC. It serves the verified
// chunks of its ChunkStore (ChunkSourceService) on its own address, joins the origin on a
// control stream (Hello with the protocol version; the origin's Welcome carries its public
// key, checked against a pinned key when one is given), verifies each announced manifest's
// signature, answers with the chunks it already holds (delta), and then carries out Orders:
// pull chunk i of version v from the named sender, verify it (ChunkStore::PutChunk hashes
// it), and report verified / corrupt / failed. When the manifest offers the chunk as a delta
// (broadcast/delta.h) and this peer holds the base whole, it pulls the delta instead, decodes it
// onto the base and checks the result against the chunk's signed hash; a sender that has no
// delta for it (it got the chunk whole) answers NotFound, and the delta is pulled from the
// origin, which holds them all (or, failing that, the chunk whole from the sender). Verified chunks are relayable at once, because
// the origin plans relays from this peer as soon as it hears of them.
//
//   BroadcastPeerOptions opts;
//   opts.origin = "10.0.0.1:7800";
//   opts.listen = "10.0.0.2:7801";
//   opts.origin_key = VerifyKey::LoadPem("origin.pub").value();  // optional pinning
//   BroadcastPeer peer(opts);
//   ECHELON_RETURN_IF_ERROR(peer.Start());
//   std::optional<uint64_t> v = peer.WaitForVersion(1, /*timeout_s=*/600);
//   if (v) peer.store().WriteVersion(*v, "model.safetensors");
//   peer.WaitForSwarmComplete(*v, 600);   // keep relaying until every peer has it
//
// Trust: without origin_key the first key the origin presents is trusted (logged with its
// key id, a warning); every manifest must then be signed by it, and every chunk must match
// the manifest, so a man in the middle after the Welcome cannot inject data.
//
// Thread contract: public methods are safe from any thread. Internally: one thread reads the
// control stream, one sends heartbeats, kFetchWorkers threads fetch chunks, and gRPC's
// threads serve chunks. write_mu_ serialises writes to the control stream; mu_ guards the
// order queue, the stub cache and the flags below it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/broadcast/ed25519.h"
#include "echelon/common/status.h"
#include "echelon/net/broadcast_chunk_source.h"
#include "echelon/net/broadcast_protocol.h"
#include "echelon/net/tls.h"
#include "echelon/net/uplink_pacer.h"

namespace grpc {
class Channel;
class ClientContext;
class Server;
template <class W, class R>
class ClientReaderWriter;
}  // namespace grpc

namespace echelon::net {

struct BroadcastPeerOptions {
  std::string origin;                  // HOST:PORT of the origin
  // Where this peer's ChunkSource listens; port 0 = any. Empty: it listens nowhere and only
  // dials out (a host behind NAT): it receives everything and is never asked to relay.
  std::string listen = "127.0.0.1:0";
  std::string advertise;               // HOST:PORT others dial ("HOST:0": the bound port); default: listen's host + bound port
  std::string name = "peer";
  std::optional<broadcast::VerifyKey> origin_key;  // pinned; none = trust on first use
  int keep_versions = broadcast::kDefaultKeepVersions;
  double upload_bps = kDefaultUploadBps;  // what Hello declares: the origin's first estimate
  // How what it serves is paced (net/uplink_pacer.h): adaptive by default; a declared rate
  // (pacing.declared_bps, `--upload-mbps`) paces to 95% of it; pacing.pace false: never.
  UplinkPacerOptions pacing;
  double join_timeout_seconds = 10.0;  // to reach the origin at Start
  double fetch_deadline_seconds = kFetchDeadlineSeconds;
  ServeFilter serve_filter;  // tests only: corrupts what this peer serves
  std::string token;         // presented to the origin only (fetches carry the Order's ticket)
  // Non-empty: the broadcast runs over TLS; the origin must present a certificate this CA
  // signed, and this peer serves its chunks with a self-signed certificate it makes at Start
  // (net/tls.h).
  std::string tls_ca_pem;
  bool log_each_version = true;  // an info line per announced version; else debug
  bool deltas = true;            // pull a chunk's delta when this peer holds the base it is against
};

class BroadcastPeer {
 public:
  explicit BroadcastPeer(BroadcastPeerOptions options);
  ~BroadcastPeer();
  BroadcastPeer(const BroadcastPeer&) = delete;
  BroadcastPeer& operator=(const BroadcastPeer&) = delete;

  // Serves, joins and checks the origin's key. Unavailable when the origin cannot be reached
  // or this address cannot be bound; FailedPrecondition when the origin refuses (protocol
  // version) or presents a key other than the pinned one.
  Status Start();
  const std::string& address() const { return address_; }  // empty when it listens nowhere
  const std::string& peer_id() const { return peer_id_; }
  std::string origin_key_id() const;
  const broadcast::ChunkStore& store() const { return store_; }

  // The newest complete version >= min_version, once there is one; nullopt on timeout, or
  // when the origin link is gone before one completed.
  std::optional<uint64_t> WaitForVersion(uint64_t min_version, double timeout_s);
  // True once the origin said every live peer holds `version` (this peer may then leave);
  // false on timeout, Stop or a lost origin link.
  bool WaitForSwarmComplete(uint64_t version, double timeout_s);
  // The origin sent Stop, or the control stream broke.
  bool origin_gone() const;

  // A blob this peer holds already (the previous snapshot on disk, `echelon broadcast peer
  // --have`), kept as version 0 before Start: chunks with its hashes are never fetched, and
  // deltas taken against it are decoded onto it. Unsigned: it is the peer's own file.
  // chunk_bytes 0: cut as an origin with default options would (broadcast::ChunkBytesFor).
  Status AddBase(const std::string& blob, uint32_t chunk_bytes = 0);
  // Payload bytes pulled so far (chunks and deltas, verified or not).
  uint64_t bytes_received() const { return bytes_received_.load(); }
  // Its uplink as its pacer sees it (estimated rate, pace, queueing delay); empty before Start
  // or when it listens nowhere (it serves nothing).
  UplinkSummary uplink() const;

  // Abrupt exit: stops serving and closes the control stream at once (the origin sees a
  // broken stream). Also what the destructor does.
  void Shutdown();

  struct Order {
    uint64_t transfer_id = 0;
    uint64_t version = 0;
    uint32_t chunk = 0;
    std::string from_address;
    std::string from_cert_pem;  // with TLS: the sender's certificate, as the origin vouched for it
    std::string ticket;         // for that sender
    std::string origin_ticket;  // for the origin (a delta the sender lacks)
  };

 private:
  Status Serve(TlsIdentity* identity);  // starts the ChunkSource and sets address_
  void ReadLoop();
  void HeartbeatLoop();
  void FetchLoop();
  void HandleAnnounce(uint64_t version, const std::string& envelope);
  void Fetch(const Order& order);
  bool Send(const v1::PeerToOrigin& message);  // false once the link is down
  // The chunk (or with `delta` its delta) from the order's sender; NotFound when the sender does
  // not hold what was asked for.
  Result<std::string> FetchBytes(const Order& order, bool delta);
  // Fetches and stores the order's chunk, as a delta when possible; the status says how it ended.
  Status FetchAndStore(const Order& order, uint64_t* bytes);

  const BroadcastPeerOptions options_;
  broadcast::ChunkStore store_;
  TicketBook tickets_;  // what this peer's ChunkSource serves: keyed by the origin's Welcome
  std::unique_ptr<UplinkPacer> pacer_;  // outlives source_, which paces through it
  std::unique_ptr<ChunkSourceService> source_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::string peer_id_;
  std::optional<broadcast::VerifyKey> origin_key_;
  double heartbeat_seconds_ = kBroadcastHeartbeatSeconds;

  struct Control;  // channel, stub, context and stream to the origin (broadcast_peer.cc)
  std::unique_ptr<Control> control_;
  std::mutex write_mu_;  // guards writes to the control stream and link_down_
  bool link_down_ = false;

  std::atomic<bool> closing_{false};
  std::atomic<uint64_t> bytes_received_{0};
  std::thread reader_;
  std::thread heartbeat_;
  std::vector<std::thread> fetchers_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable orders_cv_;  // an order was queued (fetch workers only), or closing
  std::condition_variable cv_;         // a version completed, the origin spoke or left, closing
  std::deque<Order> orders_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // by sender address
  uint64_t swarm_complete_ = 0;  // newest version the origin declared complete
  bool origin_gone_ = false;
};

}  // namespace echelon::net
