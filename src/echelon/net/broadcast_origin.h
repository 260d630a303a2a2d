// BroadcastOrigin: the origin of the weight broadcast over gRPC. It publishes versioned blobs
// (split, hashed, signed: broadcast/manifest.h), accepts peers on a control stream (protocol
// version checked at Hello), announces the signed manifest, and runs one RelaySession per
// version whose Link is this origin: each planned Transfer becomes an Order to the receiving
// peer, which pulls the chunk straight from the sender's ChunkSource (peer to peer, or from
// the origin's own), verifies it, and reports the outcome, which goes back to the planner.
// Access: with `token`, peers present it; with `admission`, a peer presents a token Admit()
// made for one holder (a registered actor), and Revoke(holder) cuts that holder's streams at
// once. Every Order carries tickets (net/broadcast_chunk_source.h) that the sender's
// ChunkSource checks, so a revoked peer fetches at most the Orders it already held and
// relays nothing: nobody is ordered to fetch from a dead peer.
// Dead peers (broken stream, heartbeats silent for dead_after_seconds, or a ChunkSource that
// failed kMaxFetchFailuresInARow fetches in a row for two workers or more) are reported to every session (PeerDied): their
// in-flight chunks are re-planned from other holders and their receivers keep what they
// verified.
//
//   BroadcastOrigin origin(opts, std::move(signing_key), &clock);
//   ECHELON_RETURN_IF_ERROR(origin.Start());            // opts.listen "0.0.0.0:7800" or ":0"
//   origin.WaitForPeers(8, /*timeout_s=*/60);
//   ECHELON_ASSIGN_OR_RETURN(Manifest m, origin.Publish(/*version=*/1, blob));
//   origin.WaitComplete(1, /*timeout_s=*/600);          // every live peer holds version 1
//   for (const BroadcastPeerReport& r : origin.Report(1)) ...
//
// Thread contract: every public method is safe from any thread. gRPC runs one handler thread
// per peer stream plus a watchdog thread. mu_ guards the peer and version tables and the
// pending transfers; it is never held while calling into a RelaySession (which calls back
// into Start), nor while writing to a stream (each peer has its own write mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/broadcast/ed25519.h"
#include "echelon/broadcast/manifest.h"
#include "echelon/broadcast/relay_planner.h"
#include "echelon/broadcast/tunables.h"
#include "echelon/common/clock.h"
#include "echelon/common/log.h"
#include "echelon/common/status.h"
#include "echelon/net/broadcast_protocol.h"
#include "echelon/net/tls.h"
#include "echelon/net/uplink_pacer.h"

namespace grpc {
class Server;
class ServerContext;
}

namespace echelon::v1 {
class FetchChunkRequest;
}

namespace echelon::net {

class ChunkSourceService;

// RelayOptions defaults with kNetUploadSlots and kNetStartLatencySeconds.
inline broadcast::RelayOptions NetRelayOptions() {
  broadcast::RelayOptions o;
  o.upload_slots = kNetUploadSlots;
  o.start_latency_seconds = kNetStartLatencySeconds;
  return o;
}

struct BroadcastOriginOptions {
  std::string listen = "127.0.0.1:0";  // port 0: the system picks one (see port())
  broadcast::RelayOptions relay = NetRelayOptions();  // kStar = the baseline (origin sends all)
  uint32_t chunk_bytes = 0;  // 0: broadcast::ChunkBytesFor(the blob's size), per version
  int keep_versions = broadcast::kDefaultKeepVersions;
  double origin_upload_bps = kDefaultUploadBps;  // initial estimate; measured afterwards
  // How what the origin serves is paced (net/uplink_pacer.h). Not by default: the origin
  // downloads nothing, so its queue delays only its Orders, while any pace below its line rate
  // bounds the whole broadcast (on FIFO netns links, 8 / 16 peers took 1.08 / 1.19 x T1 with
  // the origin paced, 1.06 / 1.12 without). Its uplink is still estimated and reported.
  UplinkPacerOptions pacing{/*declared_bps=*/0, /*pace=*/false};
  double heartbeat_seconds = kBroadcastHeartbeatSeconds;
  double dead_after_seconds = kBroadcastDeadAfterSeconds;
  ServeFilter serve_filter;  // tests only: applied to every chunk the origin serves
  std::string token;         // non-empty: peers may join presenting it (the control stream)
  bool admission = false;    // peers may join presenting a token Admit() made (only those, without `token`)
  TlsIdentity tls;           // non-empty: serve over TLS with this certificate (net/tls.h)
  bool log_each_version = true;  // info lines per version (publish, nodes, completion); else debug
  // Each version after the first also goes as deltas against the one published before it
  // (broadcast/delta.h): peers holding that one pull the deltas, the others whole chunks.
  bool delta_from_previous = false;
  // Threads that hash, delta-encode and store a published version (0: one per core); a
  // publish is a few passes over the model, which at 16 GB is minutes on one core.
  int threads = 0;
  // Dial each peer's advertised address at join (kReachProbeSeconds); one that does not answer
  // (behind NAT, a firewalled port) is kept as a peer that receives but never relays.
  bool probe_peers = true;
  // A peer's advertised address must be the address it calls from (its host; any port), so a
  // Hello cannot make this origin, or the peers it orders to fetch there, dial a host of the
  // peer's choosing. Hosts listed here may be advertised by any peer as well: a relay whose
  // address toward the others differs from the one the origin sees (IP literals only).
  std::vector<std::string> advertise_hosts;
  // Keep a record of every reported transfer (Transfers()); `broadcast origin --trace` sets it.
  bool record_transfers = false;
};

struct BroadcastPeerReport {
  std::string peer_id;  // "name#k", unique per connection
  std::string address;  // where its ChunkSource listens
  broadcast::NodeId node = 0;
  bool alive = false;
  bool banned = false;                // served a corrupt chunk: never asked to upload again
  double joined_s = 0;                // seconds after Publish (may be > 0 for late joiners)
  std::optional<double> completed_s;  // seconds after Publish when it held every chunk
};

// A version's outcome over its peers. A peer that held every chunk counts as holding it even if
// it left afterwards (a peer may exit once told the swarm is complete, before anyone reads
// this); dead ones are those that went away without it.
struct BroadcastTally {
  int held = 0;
  int dead = 0;
  std::optional<double> last_completed_s;  // the slowest holder, seconds after Publish
};
BroadcastTally Tally(const std::vector<BroadcastPeerReport>& reports);

// One transfer of a version as the origin saw it: ordered to the receiver, then reported by it.
// Where a broadcast spent its time (idle uplinks, slow tails) is read off these.
struct BroadcastTransferRecord {
  uint32_t chunk = 0;
  std::string from;         // peer id, or "origin"
  std::string to;           // peer id
  double ordered_s = 0;     // seconds after Publish when the Order was written
  double reported_s = 0;    // seconds after Publish when the receiver's Outcome arrived
  uint64_t bytes = 0;       // payload the receiver says it pulled (chunk or delta)
  std::string result;       // "verified", "corrupt" or "failed"
};

class BroadcastOrigin {
 public:
  BroadcastOrigin(BroadcastOriginOptions options, broadcast::SigningKey key, const Clock* clock);
  ~BroadcastOrigin();
  BroadcastOrigin(const BroadcastOrigin&) = delete;
  BroadcastOrigin& operator=(const BroadcastOrigin&) = delete;

  // Binds and serves; Unavailable naming the address when it cannot be bound.
  Status Start();
  int port() const { return port_; }
  const broadcast::VerifyKey& public_key() const { return public_key_; }

  // Splits, hashes, signs and announces `blob` as `version`, which must be newer than every
  // version published before. Connected peers get it at once, later ones when they join. With
  // `delta_base` (or delta_from_previous) the manifest also offers each chunk as its delta
  // against that blob; the relay plans with the deltas' sizes.
  Result<broadcast::Manifest> Publish(uint64_t version, const std::string& blob,
                                      const std::string* delta_base = nullptr);

  // Peers whose control stream is up.
  size_t live_peers() const;
  bool WaitForPeers(size_t n, double timeout_s);
  // True once every live peer that was offered `version` holds all of it (and at least one
  // peer took part); false on timeout or an unknown version.
  bool WaitComplete(uint64_t version, double timeout_s);
  bool IsComplete(uint64_t version) const;

  std::vector<BroadcastPeerReport> Report(uint64_t version) const;
  broadcast::RelayPlanner::Stats Stats(uint64_t version) const;
  // Payload bytes the peers said they pulled for `version` (chunks and deltas); 0 if unknown.
  uint64_t BytesPulled(uint64_t version) const;
  // With record_transfers, every transfer of `version` whose receiver reported back, in report
  // order (transfers cancelled by a death are not in it); else empty.
  std::vector<BroadcastTransferRecord> Transfers(uint64_t version) const;

  // A token for `holder` to join with (options.admission); it stays good until Revoke(holder).
  // It opens one control stream at a time (a new one replaces the old). `worker` is whom the
  // holder's reports count for: failures of a sender must come from two workers to kill it.
  std::string Admit(const std::string& holder, const std::string& worker = "");
  // Forgets `holder`'s tokens and declares its peers dead: no more Orders to or from them, and
  // the Orders' tickets they still hold die with their transfers at the origin.
  void Revoke(const std::string& holder);

  // Tells every peer to stop (Stop message), then closes streams and the server.
  void Shutdown();
  // Its uplink as its pacer sees it; empty before Start.
  UplinkSummary uplink() const;

  class Service;  // the gRPC service (broadcast_origin_state.h)
  struct Conn;
  struct Version;

 private:
  friend class Service;
  friend struct Version;
  // Whom the call's token admits ("" for the shared token, or with no access control), or nullopt.
  std::optional<std::string> Holder(const grpc::ServerContext& ctx) const;
  // The origin's ChunkSource check: the ticket is the origin's for a pending Order whose
  // receiver is alive, with uses left.
  bool AllowOriginFetch(const v1::FetchChunkRequest& req);
  void RunControl(const std::shared_ptr<Conn>& conn);
  void Announce(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Version>& v);
  void OnHave(const std::shared_ptr<Conn>& conn, uint64_t version, const std::string& held);
  void OnOutcome(const std::shared_ptr<Conn>& conn, uint64_t wire_id, int result, const std::string& detail,
                 uint64_t bytes);
  void StartTransfer(Version* v, const broadcast::Transfer& t, std::function<void(const broadcast::Transfer&, broadcast::TransferOutcome)> done);
  void DeclareDead(const std::shared_ptr<Conn>& conn, const std::string& why);
  void CheckComplete(const std::shared_ptr<Version>& v);
  void WatchdogLoop();

  const BroadcastOriginOptions options_;
  const broadcast::SigningKey key_;
  const broadcast::VerifyKey public_key_;
  const std::string ticket_key_;  // the origin's own ChunkSource's
  const Clock* const clock_;
  broadcast::ChunkStore store_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<UplinkPacer> pacer_;  // outlives chunk_source_, which paces through it
  std::unique_ptr<ChunkSourceService> chunk_source_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread watchdog_;
  LogBudget log_budget_;  // refusals a caller can provoke at will

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;  // peers joined, a version completed, shutdown
  bool shutting_down_ = false;
  uint64_t next_conn_ = 0;
  uint64_t next_wire_id_ = 1;
  std::vector<std::shared_ptr<Conn>> conns_;             // live connections
  std::map<uint64_t, std::shared_ptr<Version>> versions_;  // the newest keep_versions
  struct Pending;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;  // by wire transfer id
  std::map<std::string, std::string> admitted_;            // SHA-256 of an Admit() token -> holder
  std::map<std::string, std::string> admitted_workers_;    // holder -> its worker ("": none named)
};

}  // namespace echelon::net
