#include "echelon/net/broadcast_origin.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "echelon/broadcast/delta.h"
#include "echelon/broadcast/relay_session.h"
#include "echelon/common/sha256.h"
#include "echelon/net/address.h"
#include "echelon/net/auth.h"
#include "echelon/net/broadcast_chunk_source.h"
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

  grpc::Status Control(grpc::ServerContext* ctx, Stream* stream) override {
    std::optional<std::string> holder = o_->Holder(*ctx);
    if (!holder) {
      if (o_->log_budget_.Allow("unauthenticated"))
        spdlog::warn("refused broadcast peer {}: missing, wrong or revoked bearer token", ctx->peer());
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing, wrong or revoked bearer token");
    }
    v1::PeerToOrigin first;
    if (!stream->Read(&first) || !first.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message on the control stream must be a Hello");
    }
    const v1::BroadcastHello& hello = first.hello();
    if (hello.protocol_version() != kBroadcastProtocolVersion) {
      const std::string msg = "peer speaks broadcast protocol version " + std::to_string(hello.protocol_version()) +
                              ", this origin speaks " + std::to_string(kBroadcastProtocolVersion) +
                              "; run the same echelon release on both";
      if (o_->log_budget_.Allow("protocol_version")) spdlog::warn("refused peer {}: {}", ctx->peer(), msg);
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, msg);
    }
    auto conn = std::make_shared<Conn>();
    conn->holder = *holder;
    conn->ticket_key = RandomToken();
    conn->address = hello.address();
    conn->cert_pem = hello.cert_pem();
    if (!o_->options_.tls.empty() && !conn->address.empty() && conn->cert_pem.empty())
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this broadcast runs over TLS: the Hello must carry the peer's certificate");
    if (!conn->address.empty() && !AdvertisesOwnHost(ctx->peer(), conn->address, o_->options_.advertise_hosts)) {
      if (o_->log_budget_.Allow("advertised_elsewhere"))
        spdlog::warn("peer {} advertises {}, not the address it calls from: it will receive but never relay (list "
                     "that host with --broadcast-peer-hosts if it is the peer's own)",
                     ctx->peer(), conn->address);
      conn->address.clear();
    }
    if (!conn->address.empty() && o_->options_.probe_peers && !TcpReachable(conn->address, kReachProbeSeconds)) {
      spdlog::warn("peer {} advertises {}, which this origin cannot dial: it will receive but never relay (a peer "
                   "behind NAT: start it with --no-listen, or an actor with --broadcast-listen none)",
                   ctx->peer(), conn->address);
      conn->address.clear();
    }
    // The declared rate is only a first estimate (the first measured chunk replaces it), and is
    // held to [kMinDeclaredUploadBps, kMaxDeclaredUploadBps] so a claim cannot win every ranking.
    conn->upload_bps = DeclaredUploadBps(hello.upload_bps());
    conn->ctx = ctx;
    conn->stream = stream;
    std::vector<std::shared_ptr<Conn>> replaced;
    std::string name = hello.name().substr(0, 64);
    if (name.empty()) name = "peer";
    {
      std::lock_guard<std::mutex> lock(o_->mu_);
      if (o_->shutting_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "origin is shutting down");
      conn->id = name + "#" + std::to_string(++o_->next_conn_);
      conn->last_seen = o_->clock_->Now();
      const auto worker = o_->admitted_workers_.find(conn->holder);
      conn->reporter = worker != o_->admitted_workers_.end() && !worker->second.empty() ? worker->second : conn->id;
      // One control stream per admitted token: a new one replaces the old (a reconnect).
      if (!conn->holder.empty())
        for (const auto& c : o_->conns_)
          if (c->holder == conn->holder) replaced.push_back(c);
    }
    for (const auto& c : replaced) o_->DeclareDead(c, "replaced by a new control stream with its token");
    o_->RunControl(conn);
    {
      std::lock_guard<std::mutex> lock(conn->write_mu);
      conn->closed = true;
    }
    return grpc::Status::OK;
  }

 private:
  BroadcastOrigin* const o_;
};

BroadcastOrigin::BroadcastOrigin(BroadcastOriginOptions options, broadcast::SigningKey key, const Clock* clock)
    : options_(std::move(options)),
      key_(std::move(key)),
      public_key_(key_.public_key()),
      ticket_key_(RandomToken()),
      clock_(clock),
      store_(options_.keep_versions) {}

BroadcastOrigin::~BroadcastOrigin() { Shutdown(); }

Status BroadcastOrigin::Start() {
  service_ = std::make_unique<Service>(this);
  // Star is the baseline of parallel sends from the origin, so only swarm mode serialises.
  chunk_source_ = std::make_unique<ChunkSourceService>(
      &store_, options_.relay.mode == broadcast::RelayMode::kSwarm, options_.serve_filter,
      [this](const v1::FetchChunkRequest& req) { return AllowOriginFetch(req); });
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, ServerCredentials(options_.tls), &port_);
  ApplyBroadcastLimits(&builder);
  builder.RegisterService(service_.get());
  builder.RegisterService(chunk_source_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    return Status(StatusCode::kUnavailable, "broadcast origin cannot listen on " + options_.listen +
                                                " (address in use or not local?)");
  }
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  spdlog::info("broadcast origin listening on {} (port {}), manifest key id {}", options_.listen, port_,
               public_key_.key_id());
  return Status::Ok();
}

std::optional<std::string> BroadcastOrigin::Holder(const grpc::ServerContext& ctx) const {
  if (options_.token.empty() && !options_.admission) return std::string();
  if (!options_.token.empty() && TokenMatches(ctx, options_.token)) return std::string();
  std::optional<std::string> token = BearerToken(ctx);
  if (!token || !options_.admission) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = admitted_.find(Sha256(*token));
  if (it == admitted_.end()) return std::nullopt;
  return it->second;
}

std::string BroadcastOrigin::Admit(const std::string& holder, const std::string& worker) {
  std::string token = RandomToken();
  std::lock_guard<std::mutex> lock(mu_);
  admitted_[Sha256(token)] = holder;
  admitted_workers_[holder] = worker;
  return token;
}

void BroadcastOrigin::Revoke(const std::string& holder) {
  std::vector<std::shared_ptr<Conn>> cut;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = admitted_.begin(); it != admitted_.end();) {
      if (it->second == holder) it = admitted_.erase(it);
      else ++it;
    }
    admitted_workers_.erase(holder);
    for (auto& c : conns_) {
      if (c->holder == holder) cut.push_back(c);
    }
  }
  for (auto& c : cut) DeclareDead(c, "its access was revoked");
}

bool BroadcastOrigin::AllowOriginFetch(const v1::FetchChunkRequest& req) {
  if (!TicketMatches(ticket_key_, req)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(req.transfer_id());
  if (it == pending_.end()) return false;
  Pending& p = *it->second;
  return p.receiver->alive && p.version->manifest.version == req.version() &&
         p.transfer.chunk == static_cast<int>(req.chunk()) && ++p.origin_fetches <= kTicketUses;
}

void BroadcastOrigin::Shutdown() {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    conns = conns_;
  }
  cv_.notify_all();
  v1::OriginToPeer stop;
  stop.mutable_stop()->set_reason("origin shutting down");
  for (auto& c : conns) c->Write(stop);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (watchdog_.joinable()) watchdog_.join();
}

Result<broadcast::Manifest> BroadcastOrigin::Publish(uint64_t version, const std::string& blob,
                                                     const std::string* delta_base) {
  std::optional<uint64_t> previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!versions_.empty() && version <= versions_.rbegin()->first) {
      return InvalidArgument("publishing version " + std::to_string(version) + ": version " +
                             std::to_string(versions_.rbegin()->first) + " is already published; versions must grow");
    }
    if (!versions_.empty()) previous = versions_.rbegin()->first;
  }
  ECHELON_ASSIGN_OR_RETURN(broadcast::Manifest m,
                           broadcast::BuildManifest(version, blob,
                                                    options_.chunk_bytes > 0 ? options_.chunk_bytes
                                                                             : broadcast::ChunkBytesFor(blob.size()),
                                                    options_.threads));
  std::vector<std::string> deltas;
  if (delta_base != nullptr) {
    ECHELON_ASSIGN_OR_RETURN(deltas, broadcast::AddDeltas(&m, blob, *delta_base, options_.threads));
  } else if (options_.delta_from_previous && previous) {
    // The previous version as the store holds it (its chunks, hashed when it was published):
    // no copy of the model and no second pass over it.
    Result<broadcast::BaseBytes> base = store_.Bytes(*previous);
    Result<broadcast::Manifest> base_manifest = store_.GetManifest(*previous);
    if (base.ok() && base_manifest.ok()) {
      ECHELON_ASSIGN_OR_RETURN(deltas, broadcast::AddDeltas(&m, blob, base.value(), base_manifest->file_sha256,
                                                            options_.threads));
    }
  }
  ECHELON_ASSIGN_OR_RETURN(std::string envelope, broadcast::SignManifest(m, key_));
  ECHELON_RETURN_IF_ERROR(store_.AddBlob(m, blob, options_.threads).WithContext("publishing version " + std::to_string(version)));
  for (size_t i = 0; i < m.num_chunks(); ++i) {
    if (m.HasDelta(i)) ECHELON_RETURN_IF_ERROR(store_.PutDelta(version, i, std::move(deltas[i])));
  }
  auto v = std::make_shared<Version>();
  v->origin = this;
  v->manifest = m;
  v->envelope = std::move(envelope);
  // Planned with the deltas' sizes: what peers that hold the base (in a run, all but late
  // joiners) pull.
  std::vector<uint64_t> sizes = broadcast::ChunkSizes(m);
  double total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (m.HasDelta(i)) sizes[i] = m.delta_bytes[i];
    total += static_cast<double>(sizes[i]);
  }
  v->planner = std::make_unique<broadcast::RelayPlanner>(options_.relay, static_cast<int>(m.num_chunks()),
                                                         options_.origin_upload_bps,
                                                         total / std::max<size_t>(1, sizes.size()));
  v->session = std::make_unique<broadcast::RelaySession>(v->planner.get(), v.get(), clock_, std::move(sizes));
  v->published_at = clock_->Now();
  std::vector<std::shared_ptr<Conn>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    versions_[version] = v;
    while (static_cast<int>(versions_.size()) > std::max(1, options_.keep_versions)) {
      const uint64_t old = versions_.begin()->first;
      versions_.erase(versions_.begin());
      for (auto& c : conns_) {
        c->nodes.erase(old);
        c->offered.erase(old);
      }
    }
    targets = conns_;
  }
  uint64_t delta_total = 0;
  for (uint64_t d : m.delta_bytes) delta_total += d;
  spdlog::log(VersionLogLevel(options_.log_each_version), "published version {}: {} bytes in {} chunks{}, file sha256 {}",
              version, m.total_bytes, m.num_chunks(),
              m.has_deltas() ? " (deltas: " + std::to_string(delta_total) + " bytes)" : std::string(), m.file_sha256);
  for (auto& c : targets) Announce(c, v);
  return m;
}

void BroadcastOrigin::Announce(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Version>& v) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!conn->alive) return;
    conn->offered[v->manifest.version] = true;
    v->complete = false;
  }
  v1::OriginToPeer msg;
  msg.mutable_announce()->set_version(v->manifest.version);
  msg.mutable_announce()->set_signed_manifest(v->envelope);
  conn->Write(msg);
}

void BroadcastOrigin::RunControl(const std::shared_ptr<Conn>& conn) {
  v1::OriginToPeer welcome;
  welcome.mutable_welcome()->set_peer_id(conn->id);
  welcome.mutable_welcome()->set_origin_key_pem(public_key_.ToPem());
  welcome.mutable_welcome()->set_heartbeat_seconds(options_.heartbeat_seconds);
  welcome.mutable_welcome()->set_ticket_key(conn->ticket_key);
  if (!conn->Write(welcome)) return;
  std::shared_ptr<Version> newest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(conn);
    if (!versions_.empty()) newest = versions_.rbegin()->second;
  }
  cv_.notify_all();
  spdlog::info("peer {} joined from {} ({})", conn->id, conn->ctx->peer(),
               conn->address.empty() ? "dials out only: receives, never relays" : "serves chunks at " + conn->address);
  if (newest) Announce(conn, newest);
  v1::PeerToOrigin msg;
  while (conn->stream->Read(&msg)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      conn->last_seen = clock_->Now();
    }
    if (msg.has_have()) {
      OnHave(conn, msg.have().version(), msg.have().held());
    } else if (msg.has_outcome()) {
      OnOutcome(conn, msg.outcome().transfer_id(), msg.outcome().result(), msg.outcome().detail(),
                msg.outcome().bytes());
    }
  }
  DeclareDead(conn, "control stream closed");
}

void BroadcastOrigin::OnHave(const std::shared_ptr<Conn>& conn, uint64_t version, const std::string& held_bytes) {
  std::shared_ptr<Version> v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end() || !conn->offered.count(version) || !conn->alive) return;
    conn->offered.erase(version);
    v = it->second;
  }
  std::vector<bool> held(v->manifest.num_chunks(), false);
  if (held_bytes.size() == held.size()) {
    for (size_t i = 0; i < held.size(); ++i) held[i] = held_bytes[i] != 0;
  } else {
    spdlog::warn("peer {}: Have for version {} has {} entries, manifest has {} chunks; treating as nothing held",
                 conn->id, version, held_bytes.size(), held.size());
  }
  // may plan transfers at once (parked)
  const NodeId node = v->session->AddPeer(conn->upload_bps, held, /*reachable=*/!conn->address.empty());
  std::vector<std::pair<Transfer, DoneFn>> parked;
  bool alive;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v->conns[node] = conn;
    alive = conn->alive;
    if (alive) conn->nodes[version] = node;
    auto it = v->parked.find(node);
    if (it != v->parked.end()) {
      parked = std::move(it->second);
      v->parked.erase(it);
    }
  }
  const size_t held_count = std::count(held.begin(), held.end(), true);
  spdlog::log(VersionLogLevel(options_.log_each_version),
              "peer {} is node {} of version {} (holds {}/{} chunks already)", conn->id, node, version, held_count,
              held.size());
  for (auto& [t, done] : parked) StartTransfer(v.get(), t, std::move(done));
  if (!alive) v->session->PeerDied(node);
  CheckComplete(v);
}

void BroadcastOrigin::StartTransfer(Version* v, const Transfer& t, DoneFn done) {
  std::shared_ptr<Pending> p;
  uint64_t wire_id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto to = v->conns.find(t.to);
    auto from = v->conns.find(t.from);
    // An endpoint added but not yet registered (its AddPeer is still returning): park.
    if (to == v->conns.end()) {
      v->parked[t.to].emplace_back(t, std::move(done));
      return;
    }
    if (t.from != broadcast::kOrigin && from == v->conns.end()) {
      v->parked[t.from].emplace_back(t, std::move(done));
      return;
    }
    // A dead endpoint: the session has been (or is being) told, and drops the transfer.
    if (!to->second->alive || (t.from != broadcast::kOrigin && !from->second->alive)) return;
    auto version = versions_.find(v->manifest.version);
    if (version == versions_.end()) return;  // dropped as too old; nothing more is fetched
    p = std::make_shared<Pending>();
    p->version = version->second;
    p->transfer = t;
    p->done = std::move(done);
    p->receiver = to->second;
    if (t.from != broadcast::kOrigin) p->sender = from->second;
    p->ordered_at = clock_->Now();
    wire_id = next_wire_id_++;
    pending_[wire_id] = p;
  }
  v1::OriginToPeer msg;
  v1::BroadcastOrder* order = msg.mutable_order();
  order->set_transfer_id(wire_id);
  order->set_version(v->manifest.version);
  order->set_chunk(static_cast<uint32_t>(t.chunk));
  const uint64_t version = v->manifest.version;
  order->set_origin_ticket(MakeTicket(ticket_key_, wire_id, version, order->chunk()));
  if (p->sender) {
    order->set_from_address(p->sender->address);
    order->set_from_cert_pem(p->sender->cert_pem);
    order->set_ticket(MakeTicket(p->sender->ticket_key, wire_id, version, order->chunk()));
  } else {
    order->set_ticket(order->origin_ticket());
  }
  // A failed write means a broken stream: its handler notices and declares the peer dead.
  p->receiver->Write(msg);
}

void BroadcastOrigin::OnOutcome(const std::shared_ptr<Conn>& conn, uint64_t wire_id, int result,
                                const std::string& detail, uint64_t bytes) {
  std::shared_ptr<Pending> p;
  std::shared_ptr<Conn> failing_sender;
  size_t failure_reporters = 0;  // read under mu_ for the log line
  TransferOutcome outcome = TransferOutcome::kFailed;
  if (result == v1::BROADCAST_RESULT_VERIFIED) outcome = TransferOutcome::kVerified;
  if (result == v1::BROADCAST_RESULT_CORRUPT) outcome = TransferOutcome::kCorrupt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(wire_id);
    if (it == pending_.end() || it->second->receiver != conn) return;
    p = it->second;
    pending_.erase(it);
    // A metric only: a receiver can say no more than a chunk and its delta could hold.
    bytes = std::min<uint64_t>(bytes, 2ull * kMaxBroadcastChunkBytes);
    p->version->bytes_pulled += bytes;
    const double published = p->version->published_at;
    if (options_.record_transfers) {
      p->version->transfers.push_back({static_cast<uint32_t>(p->transfer.chunk), p->sender ? p->sender->id : "origin",
                                       conn->id, p->ordered_at - published, clock_->Now() - published, bytes,
                                       outcome == TransferOutcome::kVerified  ? "verified"
                                       : outcome == TransferOutcome::kCorrupt ? "corrupt"
                                                                              : "failed"});
    }
    if (p->sender) {
      // Dead as a sender only when the failures came from two receivers or more: one
      // receiver's reports (true or not) cost only its own fetches from that sender.
      Conn& s = *p->sender;
      // A ban takes corrupt reports from several receivers (the planner counts nodes): a
      // second report from a worker that made one already, on another connection, goes to the
      // planner as a failure, which costs only that receiver its fetches from the sender.
      if (outcome == TransferOutcome::kCorrupt && !s.corrupt_reporters.insert(conn->reporter).second)
        outcome = TransferOutcome::kFailed;
      if (outcome == TransferOutcome::kFailed) {
        s.failure_reporters.insert(conn->reporter);
        if (++s.fetch_failures_in_a_row >= kMaxFetchFailuresInARow && s.failure_reporters.size() >= 2 && s.alive)
          failing_sender = p->sender;
        failure_reporters = s.failure_reporters.size();
      } else {
        s.fetch_failures_in_a_row = 0;
        s.failure_reporters.clear();
      }
    }
  }
  const std::string from = p->sender ? p->sender->id : "origin";
  if (outcome == TransferOutcome::kCorrupt) {
    if (log_budget_.Allow("chunk_corrupt"))
      spdlog::warn("version {} chunk {} from {} to {} failed verification ({}); {} gets a strike toward a ban from "
                   "uploading",
                   p->version->manifest.version, p->transfer.chunk, from, conn->id, detail, from);
  } else if (outcome == TransferOutcome::kFailed && log_budget_.Allow("chunk_failed")) {
    spdlog::warn("version {} chunk {} from {} to {} failed: {}", p->version->manifest.version, p->transfer.chunk, from,
                 conn->id, detail);
  }
  p->done(p->transfer, outcome);
  if (failing_sender) {
    DeclareDead(failing_sender, std::to_string(kMaxFetchFailuresInARow) + " fetches from its ChunkSource at " +
                                    failing_sender->address + " failed in a row, reported by " +
                                    std::to_string(failure_reporters) + " workers");
  }
  CheckComplete(p->version);
}

void BroadcastOrigin::DeclareDead(const std::shared_ptr<Conn>& conn, const std::string& why) {
  std::vector<std::pair<std::shared_ptr<Version>, NodeId>> nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!conn->alive) return;
    conn->alive = false;
    conns_.erase(std::remove(conns_.begin(), conns_.end(), conn), conns_.end());
    for (auto& [version, node] : conn->nodes) {
      auto it = versions_.find(version);
      if (it != versions_.end()) nodes.emplace_back(it->second, node);
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->receiver == conn) it = pending_.erase(it);
      else ++it;
    }
    if (shutting_down_) return;
  }
  spdlog::warn("peer {} is dead ({}); re-planning its transfers", conn->id, why);
  conn->Cancel();
  for (auto& [v, node] : nodes) {
    v->session->PeerDied(node);
    CheckComplete(v);
  }
  cv_.notify_all();
}

void BroadcastOrigin::CheckComplete(const std::shared_ptr<Version>& v) {
  const uint64_t version = v->manifest.version;
  bool awaiting = false;
  int live = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) awaiting = awaiting || c->offered.count(version);
    for (auto& [node, c] : v->conns) live += c->alive ? 1 : 0;
  }
  const bool complete = !awaiting && live > 0 && v->session->AllComplete();
  std::vector<std::shared_ptr<Conn>> tell;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (complete == v->complete) return;
    v->complete = complete;
    if (!complete) return;
    for (auto& [node, c] : v->conns) {
      if (c->alive) tell.push_back(c);
    }
  }
  spdlog::log(VersionLogLevel(options_.log_each_version),
              "version {} is complete on all {} live peers ({:.2f} s after publishing)", version, live,
              clock_->Now() - v->published_at);
  v1::OriginToPeer msg;
  msg.mutable_complete()->set_version(version);
  for (auto& c : tell) c->Write(msg);
  cv_.notify_all();
}

void BroadcastOrigin::WatchdogLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.05, options_.heartbeat_seconds / 2)));
    if (shutting_down_) break;
    const double now = clock_->Now();
    std::vector<std::shared_ptr<Conn>> silent;
    for (auto& c : conns_) {
      if (now - c->last_seen > options_.dead_after_seconds) silent.push_back(c);
    }
    std::vector<std::pair<uint64_t, std::shared_ptr<Version>>> versions(versions_.begin(), versions_.end());
    lock.unlock();
    for (auto& c : silent) DeclareDead(c, "no heartbeat for " + std::to_string(options_.dead_after_seconds) + " s");
    // A receiver past its fetch deadline that has not reported is not coming back to it.
    for (auto& [number, v] : versions) {
      const int expired = v->session->ExpireOverdue(kFetchDeadlineSeconds + options_.dead_after_seconds);
      if (expired > 0) spdlog::warn("version {}: {} transfers overdue, re-planned", number, expired);
    }
    lock.lock();
  }
}

size_t BroadcastOrigin::live_peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return conns_.size();
}

bool BroadcastOrigin::WaitForPeers(size_t n, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return shutting_down_ || conns_.size() >= n; }) &&
         conns_.size() >= n;
}

bool BroadcastOrigin::IsComplete(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  return it != versions_.end() && it->second->complete;
}

bool BroadcastOrigin::WaitComplete(uint64_t version, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] {
    auto it = versions_.find(version);
    return shutting_down_ || it == versions_.end() || it->second->complete;
  };
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done);
  auto it = versions_.find(version);
  return it != versions_.end() && it->second->complete;
}

std::vector<BroadcastPeerReport> BroadcastOrigin::Report(uint64_t version) const {
  std::shared_ptr<Version> v;
  std::vector<BroadcastPeerReport> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) return out;
    v = it->second;
    for (auto& [node, c] : v->conns) {
      BroadcastPeerReport r;
      r.peer_id = c->id;
      r.address = c->address;
      r.node = node;
      r.alive = c->alive;
      out.push_back(r);
    }
  }
  for (BroadcastPeerReport& r : out) {
    r.banned = v->session->IsBanned(r.node);
    if (auto j = v->session->JoinedAt(r.node)) r.joined_s = *j - v->published_at;
    if (auto c = v->session->CompletedAt(r.node)) r.completed_s = *c - v->published_at;
  }
  return out;
}

BroadcastTally Tally(const std::vector<BroadcastPeerReport>& reports) {
  BroadcastTally t;
  for (const BroadcastPeerReport& r : reports) {
    if (r.completed_s) {
      ++t.held;
      t.last_completed_s = std::max(t.last_completed_s.value_or(0.0), *r.completed_s);
    } else if (!r.alive) {
      ++t.dead;
    }
  }
  return t;
}

broadcast::RelayPlanner::Stats BroadcastOrigin::Stats(uint64_t version) const {
  std::shared_ptr<Version> v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) return {};
    v = it->second;
  }
  return v->session->planner_stats();
}

uint64_t BroadcastOrigin::BytesPulled(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  return it == versions_.end() ? 0 : it->second->bytes_pulled;
}

std::vector<BroadcastTransferRecord> BroadcastOrigin::Transfers(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = versions_.find(version);
  return it == versions_.end() ? std::vector<BroadcastTransferRecord>{} : it->second->transfers;
}

}  // namespace echelon::net
