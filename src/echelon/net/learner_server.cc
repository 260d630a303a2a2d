#include "echelon/net/learner_server.h"

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>

#include "echelon/common/fs.h"
#include "echelon/learn/hosted_episodes.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/safetensors.h"
#include "echelon/net/address.h"
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
      if (s_->refusal_log_.Allow("protocol_version")) spdlog::warn("refused registration from {}: {}", ctx->peer(), msg);
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, msg);
    }
    // A worker with its own token is named by it, whatever name it asks for.
    const std::string name = who->empty() ? SafeName(req->actor_name()) : *who;
    StageRole role;
    if (req->has_pipeline()) {
      Result<StageRole> r = CheckRole(req->pipeline());
      if (!r.ok()) {
        Count("bad_pipeline_role");
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, r.status().message());
      }
      role = std::move(r).value();
      // Under TLS the stage before dials this one with the worker's token and sends it
      // activations: a stage that brings no certificate would be dialled in plaintext.
      if (role.stage > 0 && role.cert_pem.empty() && !s_->options_.tls_cert_file.empty()) {
        Count("bad_pipeline_role");
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "pipeline stage " + std::to_string(role.stage) + "/" + std::to_string(role.stages) +
                                ": this learner runs TLS, so a stage must present the certificate it serves with "
                                "(an echelon actor started with --tls-ca makes one)");
      }
    }
    // A shared token's actors choose their names: strikes and quarantine count against the name
    // at its address, so a liar can neither take a name at another address nor evict a neighbour
    // behind the same one (a NAT); one that renames itself escapes, which is why a fleet one does
    // not trust needs a token per worker (`echelon tokens`).
    const std::string worker = who->empty() ? name + " at " + PeerHost(ctx->peer()) : *who;
    std::lock_guard<std::mutex> lock(s_->mu_);
    if (s_->quarantined_.count(worker)) return QuarantinedLocked(worker);
    if (role.stage >= 0) {
      auto it = s_->pipelines_.find(role.pipeline);
      if (it != s_->pipelines_.end() && it->second.identity != *who) {
        ++s_->counters_["foreign_pipeline"];
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            "pipeline '" + role.pipeline + "' belongs to another worker's token");
      }
      if (it != s_->pipelines_.end() && it->second.stages != role.stages) {
        ++s_->counters_["bad_pipeline_role"];
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "pipeline '" + role.pipeline + "' has " + std::to_string(it->second.stages) +
                                " stages; this stage says " + std::to_string(role.stages));
      }
    }
    DropOldestRegistrationLocked(worker);
    ActorInfo info;
    info.id = name + "#" + RandomToken();
    info.name = name;
    info.identity = *who;
    info.worker = worker;
    info.peer = ctx->peer();
    info.registered_at = info.last_seen = s_->clock_->Now();
    info.role = role;
    s_->actors_[info.id] = info;
    if (role.stage >= 0) {
      PipelineState& p = s_->pipelines_[role.pipeline];
      p.identity = *who;
      p.stages = role.stages;
      s_->ReformLocked(role.pipeline);
      spdlog::info("actor {} registered from {} as stage {}/{} of pipeline {}", name, info.peer, role.stage,
                   role.stages, role.pipeline);
    } else {
      spdlog::info("actor {} registered from {}", name, info.peer);
    }
    reply->set_actor_id(info.id);
    reply->set_run_spec_json(s_->options_.run_spec_json);
    reply->set_heartbeat_seconds(s_->options_.heartbeat_seconds);
    reply->set_snapshot_version(s_->snapshots_->Latest().version);
    reply->set_learner_incarnation(s_->incarnation_);
    reply->set_broadcast_port(static_cast<uint32_t>(s_->options_.broadcast_port));
    reply->set_broadcast_key_pem(s_->options_.broadcast_key_pem);
    // Pipeline stages take their layers from the learner, not the broadcast.
    if (role.stage < 0 && s_->options_.broadcast_admit) reply->set_broadcast_token(s_->options_.broadcast_admit(info.id, info.worker));
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
      FillView(req->actor_id(), reply->mutable_pipeline());
      // Only the lease's own holder can renew it (Dispatcher::Renew checks the actor).
      for (int i = 0; i < std::min(req->progress_size(), kMaxProgressReports); ++i) {
        sched::WorkItem work;
        work.group_id = req->progress(i).group_id();
        work.lease_id = req->progress(i).lease_id();
        s_->work_->Progress(req->actor_id(), work, req->progress(i).tokens());
      }
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
    {
      std::lock_guard<std::mutex> lock(s_->mu_);
      const StageRole& role = s_->actors_.at(req->actor_id()).role;
      if (role.stage > 0) {
        ++s_->counters_["stage_acquire"];
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "a pipeline stage after the first takes no work; its head does");
      }
      if (role.stage == 0) {
        const PipelineState& p = s_->pipelines_.at(role.pipeline);
        if (!p.complete || p.active[0] != req->actor_id()) return grpc::Status::OK;  // no work until formed
      }
    }
    std::optional<contract::Assignment> a =
        s_->work_->AcquireWith(req->actor_id(),
                               {req->resumes(), std::max<int64_t>(-1, req->snapshot_version()), req->evaluates()});
    if (!a) return grpc::Status::OK;
    reply->set_has_work(true);
    reply->set_group_id(a->work.group_id);
    reply->set_lease_id(a->work.lease_id);
    reply->set_dispatch_version(a->work.dispatch_version);
    reply->set_group_size(a->group_size);
    if (s_->options_.episodes != nullptr && s_->options_.episodes->Host(req->actor_id(), *a)) {
      reply->set_played_by_learner(true);  // the prompt (a deal, a seed) stays here
      return grpc::Status::OK;
    }
    reply->set_prompt_id(a->prompt.id);
    reply->set_prompt_text(a->prompt.text);
    reply->set_prompt_reference(a->prompt.reference);
    reply->set_prompt_system(a->prompt.system);
    reply->set_scored_by_learner(a->scored_by_learner);
    reply->set_seed(a->seed);
    reply->set_report_prefix(a->report_prefix);
    for (const data::Turn& t : a->prefix) EncodeTurn(t, reply->add_prefix());
    if (a->eval_version >= 0) {
      reply->set_evaluation(true);
      reply->set_eval_version(a->eval_version);
      reply->set_eval_temperature(a->eval_temperature);
    }
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req, v1::ReleaseReply*) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    sched::WorkItem work;
    work.group_id = req->group_id();
    work.lease_id = req->lease_id();
    s_->work_->Release(req->actor_id(), work);  // only the lease's own holder's (Dispatcher::Release)
    return grpc::Status::OK;
  }

  grpc::Status ReportPrefix(grpc::ServerContext* ctx, const v1::ReportPrefixRequest* req,
                            v1::ReportPrefixReply* reply) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    sched::WorkItem work;
    work.group_id = req->group_id();
    work.lease_id = req->lease_id();
    if (req->parts_size() > kMaxPrefixParts)  // one a sample of a group: nothing honest sends more
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "more prefix parts than a group has samples");
    std::vector<contract::PrefixPart> parts;
    for (const v1::PrefixPart& p : req->parts()) parts.push_back(DecodePrefixPart(p));
    // Only the lease's own holder's report is kept (TrajectoryIntake::ReportPrefix checks it).
    reply->set_kept(s_->work_->ReportPrefix(req->actor_id(), work, parts));
    return grpc::Status::OK;
  }

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req, v1::SubmitReply* reply) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    // A played group reaches the intake from the learner's own table (Play), never from a
    // worker: one handed in here skipped the environment (a one-action hand "won" a pot).
    const bool played_here = s_->options_.episodes != nullptr && s_->options_.episodes->PlaysEveryGroup();
    const contract::SubmitOutcome out = played_here ? contract::SubmitOutcome{false, "played_group_submitted", true}
                                                    : s_->sink_->Submit(DecodeRollout(*req, req->actor_id()));
    CountOutcome(req->actor_id(), out);
    reply->set_accepted(out.accepted);
    reply->set_reason(out.reason);
    return grpc::Status::OK;
  }

  grpc::Status Play(grpc::ServerContext* ctx, const v1::PlayRequest* req, v1::PlayReply* reply) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    if (s_->options_.episodes == nullptr)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this learner plays no environment");
    std::vector<data::Turn> turns;
    turns.reserve(req->turns_size());
    for (const v1::Turn& t : req->turns()) turns.push_back(DecodeTurn(t));
    sched::WorkItem work;
    work.group_id = req->group_id();
    work.lease_id = req->lease_id();
    Result<contract::PlayStep> step = s_->options_.episodes->Play(req->actor_id(), work, req->behavior_version(),
                                                                std::move(turns), req->generate_seconds());
    if (!step.ok()) {
      // Completions that do not answer the prompts, or another actor's group: forged.
      const bool forged = step.status().code() == StatusCode::kInvalidArgument;
      std::lock_guard<std::mutex> lock(s_->mu_);
      ++s_->counters_[forged ? "play_forged" : "play_refused"];
      auto it = s_->actors_.find(req->actor_id());
      if (forged && it != s_->actors_.end()) StrikeLocked(it->second, "play: " + step.status().message());
      return grpc::Status(forged ? grpc::StatusCode::INVALID_ARGUMENT : grpc::StatusCode::FAILED_PRECONDITION,
                          step.status().message());
    }
    if (step->outcome) {
      const contract::SubmitOutcome& out = *step->outcome;
      CountOutcome(req->actor_id(), out);
      reply->set_finished(true);
      reply->set_accepted(out.accepted);
      reply->set_reason(out.reason);
      return grpc::Status::OK;
    }
    for (const data::PolicyPrompt& p : step->prompts) {
      v1::PlayPrompt* m = reply->add_prompts();
      m->set_system(p.system);
      m->set_user(p.user);
    }
    reply->set_seed(step->seed);
    return grpc::Status::OK;
  }

  grpc::Status GetSnapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                           grpc::ServerWriter<v1::SnapshotPiece>* writer) override {
    if (grpc::Status st = Admit(*ctx, req->actor_id()); !st.ok()) return st;
    if (req->pinned() && (req->ranged() || req->lora_base()))
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a pinned snapshot is whole: neither ranged nor a LoRA base");
    contract::Snapshot snap = req->pinned() ? s_->snapshots_->Pinned(req->min_version()) : s_->snapshots_->Latest();
    if (req->pinned() && snap.version < 0)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "snapshot " + std::to_string(req->min_version()) + " is not kept (no evaluation round pins it)");
    if (snap.version < 0 || snap.version < req->min_version() || !snap.weights)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no snapshot at or above version " +
                                                             std::to_string(req->min_version()) + " yet");
    std::shared_ptr<const std::string> weights = snap.weights;
    if (req->lora_base()) {
      if (!snap.base)
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this run's snapshots are whole: it has no LoRA base");
      weights = snap.base;
    } else if (req->ranged()) {
      if (grpc::Status st = CheckStageRange(req->actor_id(), req->first_layer(), req->last_layer()); !st.ok())
        return st;
      Result<std::shared_ptr<const std::string>> ranged =
          s_->RangedSnapshot(snap, req->first_layer(), req->last_layer());
      if (!ranged.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, ranged.status().message());
      weights = std::move(ranged).value();
    }
    const std::string& bytes = *weights;
    StreamWatch watch(s_, ctx);
    for (uint64_t off = 0; off < bytes.size() || off == 0; off += kSnapshotPieceBytes) {
      v1::SnapshotPiece piece;
      piece.set_version(snap.version);
      piece.set_total_bytes(bytes.size());
      piece.set_offset(off);
      piece.set_data(bytes.substr(off, kSnapshotPieceBytes));
      if (!writer->Write(piece)) return grpc::Status(grpc::StatusCode::CANCELLED, "actor went away, or stopped reading");
      watch.Wrote();
      if (bytes.empty()) break;
    }
    return grpc::Status::OK;
  }

 private:
  // A snapshot stream the learner may cut (LearnerServer::EvictSilent) once no piece could be
  // written for kSnapshotStallSeconds; registered for as long as the handler runs.
  class StreamWatch {
   public:
    StreamWatch(LearnerServer* s, grpc::ServerContext* ctx) : s_(s), ctx_(ctx) {
      std::lock_guard<std::mutex> lock(s_->mu_);
      s_->streams_[ctx_] = s_->clock_->Now();
    }
    ~StreamWatch() {
      std::lock_guard<std::mutex> lock(s_->mu_);
      s_->streams_.erase(ctx_);
    }
    void Wrote() {
      std::lock_guard<std::mutex> lock(s_->mu_);
      if (auto it = s_->streams_.find(ctx_); it != s_->streams_.end()) it->second = s_->clock_->Now();
    }

   private:
    LearnerServer* s_;
    grpc::ServerContext* ctx_;
  };

  // A ranged snapshot is for a stage of a formed pipeline, of the layers the pipeline gave it:
  // any other caller could ask for every (first, last) pair and fill the learner's cache.
  grpc::Status CheckStageRange(const std::string& id, int64_t first, int64_t last) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    const auto found = s_->actors_.find(id);  // evicted since Admit: no pipeline's stage
    if (found == s_->actors_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "actor is not registered");
    const ActorInfo& a = found->second;
    const auto p = s_->pipelines_.find(a.role.pipeline);
    if (a.role.stage < 0 || p == s_->pipelines_.end() || !p->second.complete ||
        p->second.active[static_cast<size_t>(a.role.stage)] != id) {
      ++s_->counters_["ranged_refused"];
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "ranged snapshots are for the stages of a formed pipeline; this actor is none");
    }
    const auto [have_first, have_last] = p->second.layers[static_cast<size_t>(a.role.stage)];
    if (first == have_first && last == have_last) return grpc::Status::OK;
    ++s_->counters_["ranged_refused"];
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "layers [" + std::to_string(first) + ", " + std::to_string(last) + ") are not this stage's: " +
                            "pipeline " + a.role.pipeline + " gave it [" + std::to_string(have_first) + ", " +
                            std::to_string(have_last) + ")");
  }

  static Result<StageRole> CheckRole(const v1::PipelineRole& r) {
    StageRole role;
    role.pipeline = r.pipeline();
    role.stage = r.stage();
    role.stages = r.stages();
    role.address = r.address();
    role.memory_bytes = r.memory_bytes();
    role.seconds_per_layer = r.seconds_per_layer();
    role.cert_pem = r.cert_pem();
    const std::string what = "pipeline stage " + std::to_string(role.stage) + "/" + std::to_string(role.stages);
    if (role.pipeline.empty() || role.pipeline.size() > 64)
      return InvalidArgument(what + ": the pipeline's name must hold 1..64 characters");
    if (role.stages < 2 || role.stages > kMaxPipelineStages)
      return InvalidArgument(what + ": a pipeline has 2.." + std::to_string(kMaxPipelineStages) + " stages");
    if (role.stage < 0 || role.stage >= role.stages) return InvalidArgument(what + ": no such stage");
    if (role.stage > 0) {
      const size_t colon = role.address.rfind(':');
      if (role.address.size() > 255 || colon == std::string::npos || colon == 0 || colon + 1 == role.address.size() ||
          role.address.find_first_not_of("0123456789", colon + 1) != std::string::npos)
        return InvalidArgument(what + ": needs the HOST:PORT where the stage before reaches it, not \"" +
                               role.address.substr(0, 64) + "\"");
    }
    if (role.cert_pem.size() > kMaxStageCertBytes)
      return InvalidArgument(what + ": a certificate of at most " + std::to_string(kMaxStageCertBytes) + " bytes");
    if (!std::isfinite(role.memory_bytes) || role.memory_bytes < 0 || !std::isfinite(role.seconds_per_layer) ||
        role.seconds_per_layer < 0 || role.seconds_per_layer > 1e6)
      return InvalidArgument(what + ": memory and seconds per layer must be finite and >= 0");
    return role;
  }

  void FillView(const std::string& id, v1::PipelineView* view) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    const auto a = s_->actors_.find(id);
    if (a == s_->actors_.end() || a->second.role.stage < 0) return;
    const PipelineState& p = s_->pipelines_.at(a->second.role.pipeline);
    view->set_epoch(p.epoch);
    view->set_your_stage(a->second.role.stage);
    view->set_complete(p.complete && p.active[static_cast<size_t>(a->second.role.stage)] == id);
    if (!view->complete()) return;
    for (int i = 0; i < p.stages; ++i) {
      v1::PipelineMember* m = view->add_members();
      m->set_stage(i);
      const StageRole& member = s_->actors_.at(p.active[static_cast<size_t>(i)]).role;
      m->set_address(member.address);
      m->set_cert_pem(member.cert_pem);
      m->set_first_layer(p.layers[static_cast<size_t>(i)].first);
      m->set_last_layer(p.layers[static_cast<size_t>(i)].second);
    }
  }

  std::optional<std::string> Authenticate(const grpc::ServerContext& ctx) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    return s_->tokens_.Identify(ctx);
  }

  grpc::Status Unauthenticated(const grpc::ServerContext& ctx) {
    Count("unauthenticated");
    if (s_->refusal_log_.Allow("unauthenticated"))
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

  // At kMaxRegistrationsPerWorker live registrations, the worker's least recently seen one goes
  // (its leases are re-issued, as an eviction's are), making room for the one now registering.
  void DropOldestRegistrationLocked(const std::string& worker) {
    int live = 0;
    const ActorInfo* oldest = nullptr;
    for (const auto& [id, a] : s_->actors_) {
      if (a.worker != worker) continue;
      ++live;
      if (oldest == nullptr || a.last_seen < oldest->last_seen) oldest = &a;
    }
    if (live < kMaxRegistrationsPerWorker) return;
    ++s_->counters_["registration_replaced"];
    const std::string id = oldest->id;
    s_->RemoveActorsLocked([&](const ActorInfo& a) { return a.id == id; });
  }

  grpc::Status QuarantinedLocked(const std::string& worker) {
    ++s_->counters_["quarantined_call"];
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "worker '" + worker + "' is quarantined: its submissions were refused as forged " +
                            std::to_string(s_->forged_[worker]) + " times (see the learner's log)");
  }

  // Counts how the actor's group was taken (a submission, or a group the learner played).
  void CountOutcome(const std::string& actor_id, const contract::SubmitOutcome& out) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->actors_.find(actor_id);
    if (it == s_->actors_.end()) return;
    ++(out.accepted ? it->second.submitted : it->second.refused);
    if (out.forged) StrikeLocked(it->second, out.reason);
  }

 public:
  // LearnerServer::Strike.
  void Strike(const std::string& actor_id, const std::string& reason) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->actors_.find(actor_id);
    if (it != s_->actors_.end()) StrikeLocked(it->second, reason);
  }

 private:
  // Counts a forged submission against the actor's worker; quarantines it at the limit.
  void StrikeLocked(ActorInfo& actor, const std::string& reason) {
    ++actor.forged;
    const std::string worker = actor.worker;
    const int64_t n = ++s_->forged_[worker];
    if (n < s_->options_.quarantine_after_forged || s_->quarantined_.count(worker)) return;
    s_->quarantined_.insert(worker);
    ++s_->counters_["quarantined"];
    spdlog::error("quarantined worker {}: {} submissions refused as forged (the last: {}); its leases are re-issued",
                  worker, n, reason);
    s_->RemoveActorsLocked([&](const ActorInfo& a) { return a.worker == worker; });
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

LearnerServer::LearnerServer(LearnerServerOptions options, contract::WorkSource* work, contract::TrajectorySink* sink,
                             contract::SnapshotSource* snapshots, const Clock* clock)
    : options_(std::move(options)),
      work_(work),
      sink_(sink),
      snapshots_(snapshots),
      clock_(clock),
      refusal_log_(LogBudget::kLines, LogBudget::kPeriodSeconds, clock),
      tokens_(options_.tokens),
      incarnation_([] {
        std::random_device rd;
        char buf[9];
        std::snprintf(buf, sizeof buf, "%08x", rd());
        return std::string(buf);
      }()) {
  const nlohmann::json spec = nlohmann::json::parse(options_.run_spec_json, nullptr, /*allow_exceptions=*/false);
  if (spec.is_object() && spec.contains("model")) {
    Result<model::ModelConfig> m = model::ModelConfig::FromJson(spec["model"], "run spec");
    if (m.ok()) model_ = std::move(m).value();
  }
}

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
  std::set<std::string> pipelines;
  for (auto it = actors_.begin(); it != actors_.end();) {
    if (which(it->second)) {
      removed_.push_back(it->first);
      if (it->second.role.stage >= 0) pipelines.insert(it->second.role.pipeline);
      it = actors_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& p : pipelines) ReformLocked(p);
}

void LearnerServer::ReformLocked(const std::string& name) {
  auto found = pipelines_.find(name);
  if (found == pipelines_.end()) return;
  PipelineState& p = found->second;
  std::vector<sched::StageCandidate> candidates;
  for (const auto& [id, a] : actors_)
    if (a.role.stage >= 0 && a.role.pipeline == name) candidates.push_back({id, a.role.stage, a.registered_at});
  if (candidates.empty()) {
    pipelines_.erase(found);
    return;
  }
  sched::StageMembers members = sched::ChooseStageMembers(p.stages, p.active, candidates);
  if (!members.changed) return;
  if (!members.reissue_head.empty()) reissue_.push_back(members.reissue_head);
  p.active = std::move(members.active);
  ++p.epoch;
  p.complete = false;
  p.layers.clear();
  if (!members.complete) {
    spdlog::info("pipeline {} (epoch {}): waiting for {} of {} stages", name, p.epoch,
                 std::count(p.active.begin(), p.active.end(), std::string()), p.stages);
    return;
  }
  if (!model_) {
    spdlog::error("pipeline {}: this learner's run spec names no model; pipelines cannot be formed", name);
    return;
  }
  if (!options_.split_layers) {
    spdlog::error("pipeline {}: this learner was given no layer split; pipelines cannot be formed", name);
    return;
  }
  const model::ModelConfig& m = *model_;
  sched::PipelineModelShape shape;
  shape.layers = m.num_hidden_layers;
  shape.parameters = static_cast<double>(m.NumParameters());
  shape.vocab_size = m.vocab_size;
  shape.hidden_size = m.hidden_size;
  shape.tied_embeddings = m.tie_word_embeddings;
  shape.dtype = m.torch_dtype;
  std::vector<sched::StageOffer> offers;
  for (int i = 0; i < p.stages; ++i) {
    const StageRole& r = actors_.at(p.active[static_cast<size_t>(i)]).role;
    offers.push_back({r.pipeline + "/" + std::to_string(i), r.memory_bytes, r.seconds_per_layer});
  }
  Result<std::vector<int64_t>> split = options_.split_layers(shape, offers);
  if (!split.ok()) {
    spdlog::error("pipeline {}: {}", name, split.status().message());
    return;
  }
  int64_t at = 0;
  std::string text;
  for (int64_t n : split.value()) {
    p.layers.emplace_back(at, at + n);
    text += (text.empty() ? "" : ", ") + std::to_string(at) + "-" + std::to_string(at + n - 1);
    at += n;
  }
  p.complete = true;
  spdlog::info("pipeline {} formed (epoch {}): layers {}", name, p.epoch, text);
}

Result<std::shared_ptr<const std::string>> LearnerServer::RangedSnapshot(const contract::Snapshot& snap, int64_t first,
                                                                         int64_t last) {
  const int64_t layers = model_ ? model_->num_hidden_layers : 0;
  if (snap.base) return FailedPrecondition("pipeline stages take no LoRA adapter snapshots (learner.lora) yet");
  if (first < 0 || first >= last || last > layers)
    return InvalidArgument("layers [" + std::to_string(first) + ", " + std::to_string(last) + ") are not a range of the " +
                           std::to_string(layers) + "-layer model");
  std::lock_guard<std::mutex> lock(ranged_mu_);
  const auto key = std::make_tuple(snap.version, first, last);
  if (auto it = ranged_.find(key); it != ranged_.end()) return it->second;
  // Only the newest version's ranges are kept (the ranges formed pipelines gave their stages),
  // and at most twice the whole snapshot's bytes of them (pipelines split alike share them).
  size_t kept = 0;
  for (auto it = ranged_.begin(); it != ranged_.end();) {
    if (std::get<0>(it->first) != snap.version) {
      it = ranged_.erase(it);
    } else {
      kept += it->second->size();
      ++it;
    }
  }
  if (kept > snap.weights->size()) ranged_.clear();  // with the new range, it could pass twice the whole
  const std::string where = "snapshot v" + std::to_string(snap.version);
  ECHELON_ASSIGN_OR_RETURN(model::SafetensorsFile f, model::ParseSafetensors(*snap.weights, where));
  std::map<std::string, at::Tensor> held;
  for (auto& [name, t] : f.tensors)
    if (model::StageHolds(name, model::LayerRange{first, last})) held.emplace(name, t);
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, model::SerializeSafetensors(held, f.metadata));
  auto out = std::make_shared<const std::string>(std::move(bytes));
  ranged_[key] = out;
  return out;
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
  const double now = clock_->Now();
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (now - it->second <= kSnapshotStallSeconds) {
      ++it;
      continue;
    }
    spdlog::warn("cutting a snapshot stream: nothing could be written to it for {:.0f} s", now - it->second);
    ++counters_["snapshot_stream_cut"];
    it->first->TryCancel();  // its handler's Write fails, and it returns
    it = streams_.erase(it);
  }
  RemoveActorsLocked([&](const ActorInfo& a) {
    if (now - a.last_seen <= options_.evict_after_seconds) return false;
    spdlog::warn("evicting actor {}: silent for {:.1f} s", a.id, now - a.last_seen);
    ++counters_["evicted"];
    return true;
  });
  std::vector<std::string> evicted = std::move(removed_);
  removed_.clear();
  for (std::string& head : reissue_) {
    spdlog::warn("re-issuing the groups of pipeline head {}: a stage of its pipeline left", head);
    ++counters_["pipeline_reissued"];
    evicted.push_back(std::move(head));
  }
  reissue_.clear();
  return evicted;
}

std::vector<ActorInfo> LearnerServer::Actors() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ActorInfo> out;
  for (const auto& [id, info] : actors_) out.push_back(info);
  return out;
}

std::map<std::string, PipelineState> LearnerServer::Pipelines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pipelines_;
}

std::map<std::string, int64_t> LearnerServer::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void LearnerServer::Strike(const std::string& actor_id, const std::string& reason) {
  if (service_) service_->Strike(actor_id, reason);
}

}  // namespace echelon::net
