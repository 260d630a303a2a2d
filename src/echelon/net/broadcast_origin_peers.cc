// BroadcastOrigin's side facing its peers: who may join (tokens, admission, revocation), the
// Hello's checks, each control stream's loop, and declaring a peer dead (broken stream, silent
// heartbeats, revoked). See broadcast_origin.h.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "echelon/common/sha256.h"
#include "echelon/net/address.h"
#include "echelon/net/auth.h"
#include "echelon/net/broadcast_origin.h"
#include "echelon/net/broadcast_origin_state.h"

namespace echelon::net {

grpc::Status BroadcastOrigin::Service::Control(grpc::ServerContext* ctx, Stream* stream) {
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

}  // namespace echelon::net
