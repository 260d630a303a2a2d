#include "echelon/net/broadcast_origin.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "echelon/broadcast/delta.h"
#include "echelon/broadcast/relay_session.h"
#include "echelon/net/auth.h"
#include "echelon/net/broadcast_chunk_source.h"
#include "echelon/net/broadcast_origin_state.h"
#include "echelon/v1/broadcast.grpc.pb.h"

namespace echelon::net {

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
  UplinkPacerOptions pacing = options_.pacing;
  pacing.one_upload_at_a_time = options_.relay.mode == broadcast::RelayMode::kSwarm;
  pacer_ = std::make_unique<UplinkPacer>(pacing);
  chunk_source_ = std::make_unique<ChunkSourceService>(
      &store_, options_.relay.mode == broadcast::RelayMode::kSwarm, options_.serve_filter,
      [this](const v1::FetchChunkRequest& req) { return AllowOriginFetch(req); }, kFetchDeadlineSeconds,
      pacer_.get());
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
  pacer_->Watch(port_);
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  spdlog::info("broadcast origin listening on {} (port {}), manifest key id {}", options_.listen, port_,
               public_key_.key_id());
  return Status::Ok();
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

UplinkSummary BroadcastOrigin::uplink() const { return pacer_ ? pacer_->Summary() : UplinkSummary{}; }

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
