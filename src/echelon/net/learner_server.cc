#include "echelon/net/learner_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "echelon/common/fs.h"
#include "echelon/net/auth.h"
#include "echelon/net/codec.h"
#include "echelon/net/protocol.h"
#include "echelon/v1/learner.grpc.pb.h"

namespace echelon::net {

class LearnerServer::Service final : public v1::Learner::Service {
 public:
  explicit Service(LearnerServer* s) : s_(s) {}

  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req, v1::RegisterReply* reply) override {
    std::optional<std::string> who = Authenticate(*ctx);
    if (!who) return Unauthenticated(*ctx);
    if (req->protocol_version() != kProtocolVersion) {
      Count("protocol_version");
      const std::string msg = "actor speaks protocol version " + std::to_string(req->protocol_version()) +
                              ", this learner speaks " + std::to_string(kProtocolVersion) +
                              "; run the same echelon release on both";
      spdlog::warn("refused registration from {}: {}", ctx->peer(), msg);
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, msg);
    }
    // A worker with its own token is named by it, whatever name it asks for.
    std::string name = who->empty() ? req->actor_name().substr(0, 64) : *who;
    if (name.empty()) name = "actor";
    std::lock_guard<std::mutex> lock(s_->mu_);
    if (s_->quarantined_.count(name)) return QuarantinedLocked(name);
    ActorInfo info;
    info.id = name + "#" + RandomToken();
    info.name = name;
    info.identity = *who;
    info.peer = ctx->peer();
    info.registered_at = info.last_seen = s_->clock_->Now();
    s_->actors_[info.id] = info;
    spdlog::info("actor {} registered from {}", name, info.peer);
    reply->set_actor_id(info.id);
    reply->set_run_spec_json(s_->options_.run_spec_json);
    reply->set_heartbeat_seconds(s_->options_.heartbeat_seconds);
    reply->set_snapshot_version(s_->snapshots_->Latest().version);
    reply->set_learner_incarnation(s_->incarnation_);
    reply->set_broadcast_port(static_cast<uint32_t>(s_->options_.broadcast_port));
    reply->set_broadcast_key_pem(s_->options_.broadcast_key_pem);
    reply->set_broadcast_token(s_->options_.broadcast_token);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatReply* reply) override {
    grpc::Status st = Admit(*ctx, req->actor_id());
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      reply->set_known(false);  // register again
    } else if (!st.ok()) {
      return st;
    } else {
      reply->set_known(true);
    }
    reply->set_snapshot_version(s_->snapshots_->Latest().version);
    reply->set_done(Done());
    if (reply->done()) MarkTold(req->actor_id());
    return grpc::Status::OK;
  }

  grpc::Status Acquire(grpc::ServerContext* ctx, const v1::AcquireRequest* req, v1::AcquireReply* reply) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    reply->set_done(Done());
    reply->set_snapshot_version(s_->snapshots_->Latest().version);
    if (reply->done()) {
      MarkTold(req->actor_id());
      return grpc::Status::OK;
    }
    std::optional<rollout::Assignment> a = s_->work_->Acquire(req->actor_id());
    if (!a) return grpc::Status::OK;
    reply->set_has_work(true);
    reply->set_group_id(a->work.group_id);
    reply->set_lease_id(a->work.lease_id);
    reply->set_dispatch_version(a->work.dispatch_version);
    reply->set_prompt_id(a->prompt.id);
    reply->set_prompt_text(a->prompt.text);
    reply->set_prompt_reference(a->prompt.reference);
    reply->set_prompt_system(a->prompt.system);
    reply->set_group_size(a->group_size);
    return grpc::Status::OK;
  }

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req, v1::SubmitReply* reply) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    rollout::SubmitOutcome out = s_->sink_->Submit(DecodeRollout(*req, req->actor_id()));
    {
      std::lock_guard<std::mutex> lock(s_->mu_);
      auto it = s_->actors_.find(req->actor_id());
      if (it != s_->actors_.end()) {
        ++(out.accepted ? it->second.submitted : it->second.refused);
        if (out.forged) StrikeLocked(it->second, out.reason);
      }
    }
    reply->set_accepted(out.accepted);
    reply->set_reason(out.reason);
    return grpc::Status::OK;
  }

  grpc::Status GetSnapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                           grpc::ServerWriter<v1::SnapshotPiece>* writer) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    rollout::Snapshot snap = s_->snapshots_->Latest();
    if (snap.version < 0 || snap.version < req->min_version() || !snap.weights)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no snapshot at or above version " +
                                                             std::to_string(req->min_version()) + " yet");
    const std::string& bytes = *snap.weights;
    for (uint64_t off = 0; off < bytes.size() || off == 0; off += kSnapshotPieceBytes) {
      v1::SnapshotPiece piece;
      piece.set_version(snap.version);
      piece.set_total_bytes(bytes.size());
      piece.set_offset(off);
      piece.set_data(bytes.substr(off, kSnapshotPieceBytes));
      if (!writer->Write(piece)) return grpc::Status(grpc::StatusCode::CANCELLED, "actor went away");
      if (bytes.empty()) break;
    }
    return grpc::Status::OK;
  }

 private:
  std::optional<std::string> Authenticate(const grpc::ServerContext& ctx) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    return s_->tokens_.Identify(ctx);
  }

  grpc::Status Unauthenticated(const grpc::ServerContext& ctx) {
    Count("unauthenticated");
    spdlog::warn("refused a call from {}: missing or wrong bearer token", ctx.peer());
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token (--token-file)");
  }

  // A call about a registered actor: the caller's token must be the one the actor registered
  // with, and its worker not quarantined. Marks the actor alive.
  grpc::Status Admit(const grpc::ServerContext& ctx, const std::string& id) {
    std::optional<std::string> who = Authenticate(ctx);
    if (!who) return Unauthenticated(ctx);
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->actors_.find(id);
    if (it == s_->actors_.end() || it->second.identity != *who) {
      // Another worker's actor reads as unknown: its existence is not the caller's to learn.
      ++s_->counters_[it == s_->actors_.end() ? "unknown_actor" : "foreign_actor"];
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "actor is not registered (evicted?); register again");
    }
    it->second.last_seen = s_->clock_->Now();
    return grpc::Status::OK;
  }

  grpc::Status QuarantinedLocked(const std::string& worker) {
    ++s_->counters_["quarantined_call"];
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "worker '" + worker + "' is quarantined: its submissions were refused as forged " +
                            std::to_string(s_->forged_[worker]) + " times (see the learner's log)");
  }

  // Counts a forged submission against the actor's worker; quarantines it at the limit.
  void StrikeLocked(ActorInfo& actor, const std::string& reason) {
    ++actor.forged;
    const std::string worker = actor.name;
    const int64_t n = ++s_->forged_[worker];
    if (n < s_->options_.quarantine_after_forged || s_->quarantined_.count(worker)) return;
    s_->quarantined_.insert(worker);
    ++s_->counters_["quarantined"];
    spdlog::error("quarantined worker {}: {} submissions refused as forged (the last: {}); its leases are re-issued",
                  worker, n, reason);
    s_->RemoveActorsLocked([&](const ActorInfo& a) { return a.name == worker; });
  }

  bool Done() {
    std::lock_guard<std::mutex> lock(s_->mu_);
    return s_->done_;
  }

  // Records that this actor has seen the end of the run.
  void MarkTold(const std::string& id) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->actors_.find(id);
    if (it != s_->actors_.end() && s_->done_) it->second.told_done = true;
  }

  void Count(const std::string& reason) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    ++s_->counters_[reason];
  }

  LearnerServer* s_;
};

LearnerServer::LearnerServer(LearnerServerOptions options, rollout::WorkSource* work, rollout::TrajectorySink* sink,
                             rollout::SnapshotSource* snapshots, const Clock* clock)
    : options_(std::move(options)),
      work_(work),
      sink_(sink),
      snapshots_(snapshots),
      clock_(clock),
      tokens_(options_.tokens),
      incarnation_([] {
        std::random_device rd;
        char buf[9];
        std::snprintf(buf, sizeof buf, "%08x", rd());
        return std::string(buf);
      }()) {}

LearnerServer::~LearnerServer() { Shutdown(); }

Status LearnerServer::Start() {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
    ECHELON_ASSIGN_OR_RETURN(std::string cert, ReadFile(options_.tls_cert_file));
    ECHELON_ASSIGN_OR_RETURN(std::string key, ReadFile(options_.tls_key_file));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, creds, &port_);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0)
    return Internal("cannot listen on " + options_.listen + " (address in use or not local?)");
  spdlog::info("learner listening on {} (port {})", options_.listen, port_);
  return Status::Ok();
}

void LearnerServer::Shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

void LearnerServer::SetDone() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
}

void LearnerServer::WaitUntilActorsTold(double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool all = true;
      for (const auto& [id, info] : actors_) all = all && info.told_done;
      if (all) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void LearnerServer::RemoveActorsLocked(const std::function<bool(const ActorInfo&)>& which) {
  for (auto it = actors_.begin(); it != actors_.end();) {
    if (which(it->second)) {
      removed_.push_back(it->first);
      it = actors_.erase(it);
    } else {
      ++it;
    }
  }
}

Status LearnerServer::ReloadTokens() {
  if (options_.token_file.empty()) return FailedPrecondition("no token file to reload");
  ECHELON_ASSIGN_OR_RETURN(TokenTable tokens, TokenTable::Load(options_.token_file));
  std::set<std::string> names;
  for (const std::string& n : tokens.names()) names.insert(n);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t before = removed_.size();
  // With per-worker tokens, an actor whose worker's line is gone loses its registration; a
  // shared token that changed leaves every actor of the old one unable to call, and evicted
  // when silent.
  if (tokens.per_actor())
    RemoveActorsLocked([&](const ActorInfo& a) { return !a.identity.empty() && names.count(a.identity) == 0; });
  counters_["revoked"] += static_cast<int64_t>(removed_.size() - before);
  tokens_ = std::move(tokens);
  spdlog::info("reloaded {}: {} worker tokens, {} actors revoked", options_.token_file, names.size(),
               removed_.size() - before);
  return Status::Ok();
}

std::set<std::string> LearnerServer::Quarantined() const {
  std::lock_guard<std::mutex> lock(mu_);
  return quarantined_;
}

std::vector<std::string> LearnerServer::EvictSilent() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> evicted = std::move(removed_);
  removed_.clear();
  const double now = clock_->Now();
  for (auto it = actors_.begin(); it != actors_.end();) {
    if (now - it->second.last_seen > options_.evict_after_seconds) {
      spdlog::warn("evicting actor {}: silent for {:.1f} s", it->first, now - it->second.last_seen);
      evicted.push_back(it->first);
      ++counters_["evicted"];
      it = actors_.erase(it);
    } else {
      ++it;
    }
  }
  return evicted;
}

std::vector<ActorInfo> LearnerServer::Actors() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ActorInfo> out;
  for (const auto& [id, info] : actors_) out.push_back(info);
  return out;
}

std::map<std::string, int64_t> LearnerServer::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace echelon::net
