#include "echelon/net/remote_learner.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "echelon/common/fs.h"
#include "echelon/common/sha256.h"
#include "echelon/model/snapshot_weights.h"
#include "echelon/net/address.h"
#include "echelon/net/auth.h"
#include "echelon/net/codec.h"
#include "echelon/net/protocol.h"

namespace echelon::net {
namespace {

void SleepSeconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

void SetDeadline(grpc::ClientContext& ctx, double seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(seconds)));
}

}  // namespace

RemoteLearner::RemoteLearner(RemoteLearnerOptions options) : options_(std::move(options)) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options_.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_ca_pem;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // gRPC's own redial backoff grows to two minutes by default; a learner back from a restart
  // must not wait that long for its actors.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kMaxBackoffSeconds * 1000));
  channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
  stub_ = v1::Learner::NewStub(channel_);
}

RemoteLearner::~RemoteLearner() { Close(); }

void RemoteLearner::Close() {
  closing_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::string RemoteLearner::actor_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return actor_id_;
}

Status RemoteLearner::Register() {
  grpc::ClientContext ctx;
  AttachToken(ctx, options_.token);
  SetDeadline(ctx, kRegisterDeadlineSeconds);
  v1::RegisterRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_actor_name(options_.name);
  const StageRole& role = options_.role;
  if (role.stage >= 0) {
    v1::PipelineRole* r = req.mutable_pipeline();
    r->set_pipeline(role.pipeline);
    r->set_stage(role.stage);
    r->set_stages(role.stages);
    r->set_address(role.address);
    r->set_memory_bytes(role.memory_bytes);
    r->set_seconds_per_layer(role.seconds_per_layer);
    r->set_cert_pem(role.cert_pem);
  }
  v1::RegisterReply reply;
  grpc::Status st = stub_->Register(&ctx, req, &reply);
  if (!st.ok()) {
    const std::string msg = "registering with learner " + options_.address + ": " + st.error_message();
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
      return Status(StatusCode::kUnavailable, msg);
    return FailedPrecondition(msg);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    actor_id_ = reply.actor_id();
    heartbeat_seconds_ = std::max(0.05, reply.heartbeat_seconds());
    route_ = PipelineRoute{};
  }
  lost_ = false;
  const bool restarted = !incarnation_.empty() && reply.learner_incarnation() != incarnation_;
  if (restarted) {
    // A restarted learner: its versions continue from its last checkpoint, so a snapshot
    // from before may not exist in its history. Fetch its newest instead.
    spdlog::warn("learner restarted (now at version {}); dropping snapshot v{}", reply.snapshot_version(),
                 cached_.version);
    cached_ = contract::Snapshot{};
  }
  incarnation_ = reply.learner_incarnation();
  known_version_ = reply.snapshot_version();
  cached_run_spec_ = reply.run_spec_json();
  // A peer whose origin link is gone (revoked with the registration this replaces, or a
  // restarted learner) joins again with this registration's token.
  invite_ = BroadcastInvite{reply.broadcast_port(), reply.broadcast_key_pem(), reply.broadcast_token(), false};
  if ((restarted || !peer_ || peer_->origin_gone()) && role.stage < 0) {
    invite_.used = true;
    JoinBroadcast(invite_.port, invite_.key_pem, invite_.token);
  }
  spdlog::info("registered with learner {} as {}", options_.address, reply.actor_id());
  return Status::Ok();
}

Result<std::string> RemoteLearner::Connect(const std::atomic<bool>& stop) {
  stop_ = &stop;
  double backoff = 0.1;
  while (!stop.load()) {
    Status st = Register();
    if (st.ok()) break;
    if (st.code() != StatusCode::kUnavailable) return st;
    spdlog::warn("{}; retrying in {:.1f} s", st.message(), backoff);
    SleepSeconds(backoff);
    backoff = std::min(kMaxBackoffSeconds, backoff * 2);
  }
  if (stop.load()) return Aborted("stopped before the learner answered");
  if (!heartbeat_.joinable()) heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return cached_run_spec_;
}

void RemoteLearner::HeartbeatLoop() {
  while (!closing_.load() && !(stop_ && stop_->load())) {
    double period;
    {
      std::lock_guard<std::mutex> lock(mu_);
      period = heartbeat_seconds_;
    }
    // Sleep in small slices so Close() is prompt.
    for (double slept = 0; slept < period && !closing_.load(); slept += 0.05) SleepSeconds(0.05);
    if (closing_.load()) break;
    grpc::ClientContext ctx;
    AttachToken(ctx, options_.token);
    SetDeadline(ctx, kHeartbeatDeadlineSeconds);
    v1::HeartbeatRequest req;
    req.set_actor_id(actor_id());
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [group, progress] : progress_) *req.add_progress() = progress;
      progress_.clear();
    }
    v1::HeartbeatReply reply;
    if (!stub_->Heartbeat(&ctx, req, &reply).ok()) continue;
    if (!reply.known()) {
      lost_ = true;
      continue;
    }
    known_version_ = std::max<int64_t>(known_version_.load(), reply.snapshot_version());
    if (reply.done()) done_ = true;
    if (options_.role.stage >= 0) {
      PipelineRoute route;
      const v1::PipelineView& v = reply.pipeline();
      route.epoch = v.epoch();
      route.complete = v.complete() && v.members_size() == options_.role.stages;
      for (const v1::PipelineMember& m : v.members()) {
        route.addresses.push_back(m.address());
        route.certs.push_back(m.cert_pem());
        route.layers.push_back(model::LayerRange{m.first_layer(), m.last_layer()});
      }
      std::lock_guard<std::mutex> lock(mu_);
      route_ = std::move(route);
    }
  }
}

void RemoteLearner::Recover(int code, const std::string& what) {
  if (code == grpc::StatusCode::NOT_FOUND) {
    spdlog::warn("{}: learner no longer knows this actor; registering again", what);
    while (!(stop_ && stop_->load()) && !closing_.load()) {
      Status st = Register();
      if (st.ok()) return;
      SleepSeconds(backoff_);
      backoff_ = std::min(kMaxBackoffSeconds, backoff_ * 2);
    }
    return;
  }
  spdlog::warn("{} failed (code {}); retrying in {:.1f} s", what, code, backoff_);
  SleepSeconds(backoff_);
  backoff_ = std::min(kMaxBackoffSeconds, backoff_ * 2);
}

void RemoteLearner::Progress(const std::string& /*actor*/, const sched::WorkItem& work, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::LeaseProgress& p = progress_[work.group_id];
  p.set_group_id(work.group_id);
  p.set_lease_id(work.lease_id);
  p.set_tokens(tokens);
}

std::optional<contract::Assignment> RemoteLearner::Acquire(const std::string& actor) {
  return AcquireWith(actor, contract::WorkRequest());
}

void RemoteLearner::Release(const std::string& /*actor*/, const sched::WorkItem& work) {
  grpc::ClientContext ctx;
  AttachToken(ctx, options_.token);
  SetDeadline(ctx, kHeartbeatDeadlineSeconds);
  v1::ReleaseRequest req;
  req.set_actor_id(actor_id());
  req.set_group_id(work.group_id);
  req.set_lease_id(work.lease_id);
  v1::ReleaseReply reply;
  // Best effort: unanswered, the lease ends when the learner misses this actor's heartbeats.
  (void)stub_->Release(&ctx, req, &reply);
}

bool RemoteLearner::ReportPrefix(const std::string& /*actor*/, const sched::WorkItem& work,
                                 const std::vector<contract::PrefixPart>& parts) {
  grpc::ClientContext ctx;
  AttachToken(ctx, options_.token);
  SetDeadline(ctx, kReportPrefixDeadlineSeconds);
  v1::ReportPrefixRequest req;
  req.set_actor_id(actor_id());
  req.set_group_id(work.group_id);
  req.set_lease_id(work.lease_id);
  for (const contract::PrefixPart& p : parts) EncodePrefixPart(p, req.add_parts());
  v1::ReportPrefixReply reply;
  // A failed report is not retried here: the next one (sched::kPrefixSeconds later) resends it.
  return stub_->ReportPrefix(&ctx, req, &reply).ok() && reply.kept();
}

std::optional<contract::Assignment> RemoteLearner::AcquireWith(const std::string& /*actor*/,
                                                                const contract::WorkRequest& request) {
  grpc::ClientContext ctx;
  AttachToken(ctx, options_.token);
  SetDeadline(ctx, kAcquireDeadlineSeconds);
  v1::AcquireRequest req;
  req.set_actor_id(actor_id());
  req.set_resumes(request.continues_prefixes);
  req.set_snapshot_version(request.snapshot_version);
  req.set_evaluates(request.evaluates);
  v1::AcquireReply reply;
  grpc::Status st = stub_->Acquire(&ctx, req, &reply);
  if (!st.ok()) {
    Recover(st.error_code(), "acquire");
    return std::nullopt;
  }
  backoff_ = 0.1;
  known_version_ = std::max<int64_t>(known_version_.load(), reply.snapshot_version());
  if (reply.done()) done_ = true;
  if (!reply.has_work()) return std::nullopt;
  contract::Assignment a;
  a.work.group_id = reply.group_id();
  a.work.lease_id = reply.lease_id();
  a.work.dispatch_version = reply.dispatch_version();
  a.prompt.id = reply.prompt_id();
  a.prompt.text = reply.prompt_text();
  a.prompt.reference = reply.prompt_reference();
  a.prompt.system = reply.prompt_system();
  a.group_size = reply.group_size();
  a.scored_by_learner = reply.scored_by_learner();
  a.played_by_learner = reply.played_by_learner();
  a.seed = reply.seed();
  a.report_prefix = reply.report_prefix();
  for (const v1::Turn& t : reply.prefix()) a.prefix.push_back(DecodeTurn(t));
  if (reply.evaluation()) {
    a.eval_version = std::max<int64_t>(0, reply.eval_version());
    a.eval_temperature = reply.eval_temperature();
  }
  return a;
}

Result<contract::PlayStep> RemoteLearner::Play(const std::string& /*actor*/, const sched::WorkItem& work,
                                              int64_t behavior_version, std::vector<data::Turn> turns,
                                              double generate_seconds) {
  grpc::ClientContext ctx;
  AttachToken(ctx, options_.token);
  SetDeadline(ctx, kPlayDeadlineSeconds);
  v1::PlayRequest req;
  req.set_actor_id(actor_id());
  req.set_group_id(work.group_id);
  req.set_lease_id(work.lease_id);
  req.set_behavior_version(behavior_version);
  req.set_generate_seconds(generate_seconds);
  for (const data::Turn& t : turns) EncodeTurn(t, req.add_turns());
  v1::PlayReply reply;
  grpc::Status st = stub_->Play(&ctx, req, &reply);
  if (!st.ok()) {
    const std::string what = "playing group " + std::to_string(work.group_id) + " with the learner";
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) Recover(st.error_code(), what);
    return Unavailable(what + ": " + st.error_message());
  }
  contract::PlayStep step;
  if (reply.finished()) {
    step.outcome = contract::SubmitOutcome{reply.accepted(), reply.reason()};
    return step;
  }
  for (const v1::PlayPrompt& p : reply.prompts()) step.prompts.emplace_back(p.system(), p.user());
  step.seed = reply.seed();
  return step;
}

contract::SubmitOutcome RemoteLearner::Submit(contract::GroupRollout rollout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.erase(rollout.group_id);  // done: nothing more to report
  }
  v1::SubmitRequest req;
  EncodeRollout(rollout, actor_id(), &req);
  // Routes past the message limit would fail the whole group: they go, the tokens stay.
  if (const int dropped = FitRoutes(&req, kMaxMessageBytes - kSubmitHeadroomBytes); dropped > 0)
    spdlog::warn("group {}: routes of {} completions not sent, so that it fits the {} MiB message limit (lower "
                 "rl.router_replay_margin to send fewer)",
                 rollout.group_id, dropped, kMaxMessageBytes >> 20);
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext ctx;
    AttachToken(ctx, options_.token);
    SetDeadline(ctx, kSubmitDeadlineSeconds);
    v1::SubmitReply reply;
    grpc::Status st = stub_->Submit(&ctx, req, &reply);
    if (st.ok()) return {reply.accepted(), reply.reason()};
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      // Evicted: the group was re-issued to someone else; this work is lost by design.
      Recover(st.error_code(), "submit");
      return {false, "evicted"};
    }
    Recover(st.error_code(), "submit");
  }
  return {false, "learner_unreachable"};
}

void RemoteLearner::JoinBroadcast(uint32_t port, const std::string& key_pem, const std::string& token) {
  peer_.reset();
  if (!options_.broadcast || port == 0) return;
  Result<broadcast::VerifyKey> key = broadcast::VerifyKey::FromPem(key_pem, "the learner's broadcast key");
  if (!key.ok()) {
    spdlog::warn("{}; fetching snapshots directly", key.status().message());
    return;
  }
  BroadcastPeerOptions o;
  o.origin = HostOf(options_.address) + ":" + std::to_string(port);
  o.listen = options_.broadcast_listen == "none" ? "" : options_.broadcast_listen;  // none: dial out only (NAT)
  o.name = options_.name;
  o.origin_key = std::move(key).value();
  o.token = token;
  o.tls_ca_pem = options_.tls_ca_pem;  // a learner with TLS runs its broadcast over TLS too
  o.log_each_version = false;
  o.join_timeout_seconds = kBroadcastJoinSeconds;
  o.advertise = options_.broadcast_advertise;
  if (options_.broadcast_upload_bps > 0) {
    o.upload_bps = options_.broadcast_upload_bps;
    o.pacing.declared_bps = options_.broadcast_upload_bps;
  }
  if (!o.listen.empty() && o.advertise.empty() && IsWildcardHost(HostOf(o.listen))) {
    Result<std::string> ip = LocalAddressToward(options_.address);
    if (!ip.ok()) {
      spdlog::warn("{}; fetching snapshots directly (or give --broadcast-advertise)", ip.status().message());
      return;
    }
    o.advertise = ip.value() + ":0";  // the port is filled in once bound
  }
  auto peer = std::make_unique<BroadcastPeer>(o);
  Status st = peer->Start();
  if (!st.ok()) {
    spdlog::warn("cannot join the snapshot broadcast at {}: {}; fetching snapshots directly", o.origin, st.message());
    return;
  }
  spdlog::info("joined the snapshot broadcast at {} as {} (serving chunks at {})", o.origin, peer->peer_id(),
               peer->address());
  peer_ = std::move(peer);
}

std::optional<contract::Snapshot> RemoteLearner::FromBroadcast(int64_t version) {
  if (peer_ && peer_->origin_gone() && !invite_.used) {
    invite_.used = true;  // its link broke after this registration: once more, with its token
    JoinBroadcast(invite_.port, invite_.key_pem, invite_.token);
  }
  if (!peer_ || peer_->origin_gone()) return std::nullopt;
  std::optional<uint64_t> got =
      peer_->WaitForVersion(static_cast<uint64_t>(std::max<int64_t>(version, 0)), options_.broadcast_wait_seconds);
  if (!got) {
    spdlog::warn("the broadcast did not deliver snapshot v{} within {:.0f} s; pulling it directly", version,
                 options_.broadcast_wait_seconds);
    return std::nullopt;
  }
  Result<std::string> bytes = peer_->store().Assemble(*got);
  if (!bytes.ok()) return std::nullopt;  // garbage-collected meanwhile: the next call gets a newer one
  return contract::Snapshot{static_cast<int64_t>(*got), std::make_shared<const std::string>(std::move(bytes).value()),
                            nullptr};
}

int64_t RemoteLearner::NewestVersion() {
  if (!peer_ || peer_->origin_gone()) return known_version_.load();
  const std::optional<uint64_t> held = peer_->store().NewestComplete();
  return held ? static_cast<int64_t>(*held) : -1;
}

PipelineRoute RemoteLearner::route() const {
  std::lock_guard<std::mutex> lock(mu_);
  return route_;
}

void RemoteLearner::Want(int64_t version) {
  int64_t known = known_version_.load();
  while (version > known && !known_version_.compare_exchange_weak(known, version)) {
  }
}

void RemoteLearner::KeepRegistered() {
  if (lost_.load()) Recover(grpc::StatusCode::NOT_FOUND, "heartbeat");
}

contract::Snapshot RemoteLearner::Latest() {
  const bool staged = options_.role.stage >= 0;
  model::LayerRange range{-1, -1};
  if (staged) {
    const PipelineRoute r = route();
    if (!r.complete) return contract::Snapshot{};
    range = r.layers[static_cast<size_t>(options_.role.stage)];
    if (range.first != cached_range_.first || range.last != cached_range_.last) cached_ = contract::Snapshot{};
  } else if (peer_ && !peer_->origin_gone()) {
    // A version the broadcast delivered before a heartbeat announced it (a generation that
    // moves to it midway, rollout.partial, asks at once).
    if (const std::optional<uint64_t> held = peer_->store().NewestComplete())
      known_version_ = std::max<int64_t>(known_version_.load(), static_cast<int64_t>(*held));
  }
  if (cached_.version >= known_version_.load() && cached_.version >= 0) return cached_;
  if (std::optional<contract::Snapshot> snap = staged ? std::nullopt : FromBroadcast(known_version_.load())) {
    if (!AttachBase(*snap)) return cached_;
    cached_ = std::move(*snap);
    known_version_ = std::max<int64_t>(known_version_.load(), cached_.version);
    return cached_;
  }
  v1::SnapshotRequest req;
  req.set_actor_id(actor_id());
  req.set_min_version(known_version_.load());
  if (staged) {
    req.set_ranged(true);
    req.set_first_layer(range.first);
    req.set_last_layer(range.last);
  }
  std::optional<contract::Snapshot> snap = Pull(req);
  if (!snap || !AttachBase(*snap)) return cached_;
  cached_ = std::move(*snap);
  cached_range_ = range;
  known_version_ = std::max<int64_t>(known_version_.load(), cached_.version);
  return cached_;
}

contract::Snapshot RemoteLearner::Pinned(int64_t version) {
  if (cached_.version == version && cached_.weights) return cached_;
  v1::SnapshotRequest req;
  req.set_actor_id(actor_id());
  req.set_min_version(version);
  req.set_pinned(true);
  std::optional<contract::Snapshot> snap = Pull(req);
  if (!snap || snap->version != version || !AttachBase(*snap)) return contract::Snapshot{};
  return std::move(*snap);  // not cached: the next training group goes back to the newest
}

bool RemoteLearner::AttachBase(contract::Snapshot& snap) {
  const std::string want = model::AdapterBaseOf(*snap.weights);
  if (want.empty()) return true;
  if (!base_ || base_sha_ != want) {
    v1::SnapshotRequest req;
    req.set_actor_id(actor_id());
    req.set_lora_base(true);
    std::optional<contract::Snapshot> base = Pull(req);
    if (!base) return false;
    const std::string got = Sha256Hex(*base->weights);
    if (got != want) {  // the learner moved to another base meanwhile (a restart): the next call retries
      spdlog::warn("the LoRA base pulled has SHA-256 {}, snapshot v{} adapts {}; retrying", got.substr(0, 12),
                   snap.version, want.substr(0, 12));
      return false;
    }
    spdlog::info("pulled the LoRA base ({:.1f} MB) under snapshot v{}", static_cast<double>(base->weights->size()) / 1e6,
                 snap.version);
    base_ = std::move(base->weights);
    base_sha_ = want;
  }
  snap.base = base_;
  return true;
}

std::optional<contract::Snapshot> RemoteLearner::Pull(const v1::SnapshotRequest& req) {
  grpc::ClientContext ctx;
  AttachToken(ctx, options_.token);
  // No deadline for the whole pull, which may take many minutes: a stall cancels it.
  std::mutex stall_mu;
  std::condition_variable stall_cv;
  bool pulling = true;
  auto last_piece = std::chrono::steady_clock::now();
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(stall_mu);
    while (pulling) {
      stall_cv.wait_for(lock, std::chrono::milliseconds(200));
      if (pulling && std::chrono::steady_clock::now() - last_piece > std::chrono::duration<double>(options_.snapshot_stall_seconds)) {
        ctx.TryCancel();
        break;
      }
    }
  });
  std::unique_ptr<grpc::ClientReader<v1::SnapshotPiece>> reader = stub_->GetSnapshot(&ctx, req);
  v1::SnapshotPiece piece;
  std::string bytes;
  int64_t version = -1;
  uint64_t total = 0;
  while (reader->Read(&piece)) {
    {
      std::lock_guard<std::mutex> lock(stall_mu);
      last_piece = std::chrono::steady_clock::now();
    }
    if (version < 0) {
      version = piece.version();
      total = piece.total_bytes();
      if (total > (uint64_t{1} << 36)) break;  // refuse absurd sizes (> 64 GiB)
      bytes.reserve(total);
    }
    if (piece.version() != version || piece.offset() != bytes.size()) break;
    bytes += piece.data();
  }
  grpc::Status st = reader->Finish();
  {
    std::lock_guard<std::mutex> lock(stall_mu);
    pulling = false;
  }
  stall_cv.notify_all();
  watchdog.join();
  if (!st.ok() || version < 0 || bytes.size() != total) {
    if (!st.ok()) Recover(st.error_code(), req.lora_base() ? "LoRA base fetch" : "snapshot fetch");
    return std::nullopt;
  }
  return contract::Snapshot{version, std::make_shared<const std::string>(std::move(bytes)), nullptr};
}

}  // namespace echelon::net
