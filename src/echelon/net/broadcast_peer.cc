#include "echelon/net/broadcast_peer.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "echelon/broadcast/manifest.h"
#include "echelon/net/address.h"
#include "echelon/net/auth.h"

namespace echelon::net {
namespace {

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(seconds));
}

// `root_pem` empty: plaintext. Else TLS trusting only it; `peer`: a peer's self-signed
// certificate, named kPeerTlsName whatever address it is dialled at.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const std::string& root_pem, bool peer) {
  grpc::ChannelArguments args;
  ApplyBroadcastLimits(&args);
  if (peer && !root_pem.empty()) SetPeerTargetName(&args);
  return grpc::CreateCustomChannel(address, ChannelCredentials(root_pem), args);
}

// "HOST:PORT" -> HOST (IPv6 in brackets kept as is).
}  // namespace

struct BroadcastPeer::Control {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::BroadcastOrigin::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::PeerToOrigin, v1::OriginToPeer>> stream;
};

BroadcastPeer::BroadcastPeer(BroadcastPeerOptions options)
    : options_(std::move(options)), store_(options_.keep_versions) {}

BroadcastPeer::~BroadcastPeer() { Shutdown(); }

UplinkSummary BroadcastPeer::uplink() const { return pacer_ ? pacer_->Summary() : UplinkSummary{}; }

std::string BroadcastPeer::origin_key_id() const { return origin_key_ ? origin_key_->key_id() : ""; }

Status BroadcastPeer::Serve(TlsIdentity* identity) {
  pacer_ = std::make_unique<UplinkPacer>(options_.pacing);
  source_ = std::make_unique<ChunkSourceService>(
      &store_, /*serialize_uploads=*/true, options_.serve_filter,
      [this](const v1::FetchChunkRequest& req) { return tickets_.Use(req); }, kFetchDeadlineSeconds,
      pacer_.get());
  if (!options_.tls_ca_pem.empty()) {
    ECHELON_ASSIGN_OR_RETURN(*identity, SelfSignedIdentity());
  }
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, ServerCredentials(*identity), &port);
  ApplyBroadcastLimits(&builder);
  builder.RegisterService(source_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    return Status(StatusCode::kUnavailable,
                  "broadcast peer cannot listen on " + options_.listen + " (address in use or not local?)");
  }
  pacer_->Watch(port);
  if (!options_.advertise.empty()) {
    address_ = options_.advertise;
    // "HOST:0": the host given, the port this peer was bound to.
    if (address_.size() > 2 && address_.compare(address_.size() - 2, 2, ":0") == 0)
      address_ = HostOf(address_) + ":" + std::to_string(port);
    return Status::Ok();
  }
  const std::string host = HostOf(options_.listen);
  if (IsWildcardHost(host)) {
    return InvalidArgument("--listen " + options_.listen +
                           " binds every interface; say which address other peers should dial (--advertise HOST:PORT)");
  }
  address_ = host + ":" + std::to_string(port);
  return Status::Ok();
}

Status BroadcastPeer::Start() {
  TlsIdentity identity;
  if (!options_.listen.empty()) ECHELON_RETURN_IF_ERROR(Serve(&identity));
  // else: dials out only (behind NAT); the Hello's empty address tells the origin it receives
  // and never relays.

  control_ = std::make_unique<Control>();
  control_->channel = MakeChannel(options_.origin, options_.tls_ca_pem, /*peer=*/false);
  if (!control_->channel->WaitForConnected(DeadlineIn(options_.join_timeout_seconds))) {
    return Status(StatusCode::kUnavailable, "cannot reach broadcast origin " + options_.origin + " within " +
                                                std::to_string(options_.join_timeout_seconds) + " s");
  }
  control_->stub = v1::BroadcastOrigin::NewStub(control_->channel);
  AttachToken(control_->ctx, options_.token);
  control_->stream = control_->stub->Control(&control_->ctx);
  v1::PeerToOrigin hello;
  hello.mutable_hello()->set_protocol_version(kBroadcastProtocolVersion);
  hello.mutable_hello()->set_address(address_);
  hello.mutable_hello()->set_name(options_.name);
  hello.mutable_hello()->set_upload_bps(options_.upload_bps);
  hello.mutable_hello()->set_cert_pem(identity.cert_pem);
  v1::OriginToPeer welcome;
  if (!control_->stream->Write(hello) || !control_->stream->Read(&welcome) || !welcome.has_welcome()) {
    control_->ctx.TryCancel();
    grpc::Status st = control_->stream->Finish();
    return FailedPrecondition("joining broadcast origin " + options_.origin + ": " +
                              (st.ok() ? std::string("no Welcome") : st.error_message()));
  }
  Result<broadcast::VerifyKey> key =
      broadcast::VerifyKey::FromPem(welcome.welcome().origin_key_pem(), "the origin's Welcome");
  Status key_ok = key.status();
  if (key.ok() && options_.origin_key && key->raw() != options_.origin_key->raw()) {
    key_ok = FailedPrecondition("origin " + options_.origin + " presented key id " + key->key_id() +
                                ", but the pinned --origin-key is key id " + options_.origin_key->key_id());
  }
  if (!key_ok.ok()) {
    control_->ctx.TryCancel();
    control_->stream->Finish();
    return key_ok;
  }
  if (options_.origin_key) {
    origin_key_ = options_.origin_key;
  } else {
    origin_key_ = key.value();
    spdlog::warn("trusting origin key id {} on first use; pin it with --origin-key PUB.pem", key->key_id());
  }
  peer_id_ = welcome.welcome().peer_id();
  tickets_.SetKey(welcome.welcome().ticket_key());
  if (welcome.welcome().heartbeat_seconds() > 0) heartbeat_seconds_ = welcome.welcome().heartbeat_seconds();
  spdlog::info("joined broadcast origin {} as {}; serving chunks at {}", options_.origin, peer_id_, address_);

  reader_ = std::thread([this] { ReadLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  for (int i = 0; i < kFetchWorkers; ++i) fetchers_.emplace_back([this] { FetchLoop(); });
  return Status::Ok();
}

void BroadcastPeer::Shutdown() {
  if (closing_.exchange(true)) return;
  // Cancel first, without write_mu_: it unblocks a Write stuck on flow control.
  if (control_) control_->ctx.TryCancel();
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    link_down_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);  // no waiter can miss closing_
    cv_.notify_all();
    orders_cv_.notify_all();
  }
  if (server_) server_->Shutdown(DeadlineIn(0));
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  for (auto& t : fetchers_) t.join();
  fetchers_.clear();
}

bool BroadcastPeer::Send(const v1::PeerToOrigin& message) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return !link_down_ && control_->stream->Write(message);
}

void BroadcastPeer::ReadLoop() {
  v1::OriginToPeer msg;
  std::string why = "control stream closed";
  while (control_->stream->Read(&msg)) {
    if (msg.has_announce()) {
      HandleAnnounce(msg.announce().version(), msg.announce().signed_manifest());
    } else if (msg.has_order()) {
      const v1::BroadcastOrder& m = msg.order();
      Order o{m.transfer_id(), m.version(), m.chunk(), m.from_address(), m.from_cert_pem(), m.ticket(), m.origin_ticket()};
      std::lock_guard<std::mutex> lock(mu_);
      orders_.push_back(std::move(o));
      orders_cv_.notify_one();  // its own cv: a notify_one on cv_ could wake a non-fetcher
    } else if (msg.has_complete()) {
      std::lock_guard<std::mutex> lock(mu_);
      swarm_complete_ = std::max(swarm_complete_, msg.complete().version());
      cv_.notify_all();
    } else if (msg.has_stop()) {
      why = "origin said stop: " + msg.stop().reason();
      break;
    }
  }
  control_->ctx.TryCancel();  // also ends the stream when we left on Stop
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    link_down_ = true;
  }
  grpc::Status st = control_->stream->Finish();
  if (!closing_.load()) {
    spdlog::warn("broadcast origin {} is gone ({}{})", options_.origin, why,
                 st.ok() || st.error_code() == grpc::StatusCode::CANCELLED ? "" : ": " + st.error_message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  origin_gone_ = true;
  cv_.notify_all();
}

void BroadcastPeer::HandleAnnounce(uint64_t version, const std::string& envelope) {
  Result<broadcast::Manifest> m = broadcast::VerifySignedManifest(envelope, *origin_key_);
  if (!m.ok()) {
    spdlog::error("refusing manifest of version {} from origin {}: {}", version, options_.origin, m.status().message());
    return;
  }
  if (m->version != version) {
    spdlog::error("refusing manifest announced as version {}: it is signed as version {}", version, m->version);
    return;
  }
  if (Status st = store_.AddVersion(m.value()); !st.ok()) {
    spdlog::error("cannot take version {}: {}", version, st.message());
    return;
  }
  Result<std::vector<bool>> held = store_.HeldMask(version);
  if (!held.ok()) return;  // collected meanwhile by a newer version
  std::string mask(held->size(), '\0');
  size_t have = 0;
  for (size_t i = 0; i < held->size(); ++i) {
    mask[i] = held.value()[i] ? 1 : 0;
    have += held.value()[i] ? 1 : 0;
  }
  spdlog::log(VersionLogLevel(options_.log_each_version),
              "version {} announced: {} bytes, {} chunks, {} held already", version, m->total_bytes,
              m->num_chunks(), have);
  v1::PeerToOrigin reply;
  reply.mutable_have()->set_version(version);
  reply.mutable_have()->set_held(mask);
  Send(reply);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();  // a fully held (delta) version is complete at once
}

void BroadcastPeer::HeartbeatLoop() {
  v1::PeerToOrigin beat;
  beat.mutable_heartbeat();
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(heartbeat_seconds_));
  auto next = std::chrono::steady_clock::now() + period;
  std::unique_lock<std::mutex> lock(mu_);
  while (!closing_.load() && !origin_gone_) {
    // cv_ also wakes for orders and completions: beat only when the period is up.
    if (cv_.wait_until(lock, next) != std::cv_status::timeout) continue;
    lock.unlock();
    Send(beat);
    lock.lock();
    next = std::chrono::steady_clock::now() + period;
  }
}

void BroadcastPeer::FetchLoop() {
  while (true) {
    Order order;
    {
      std::unique_lock<std::mutex> lock(mu_);
      orders_cv_.wait(lock, [&] { return closing_.load() || !orders_.empty(); });
      if (closing_.load()) return;
      order = std::move(orders_.front());
      orders_.pop_front();
    }
    Fetch(order);
  }
}

Result<std::string> BroadcastPeer::FetchBytes(const Order& order, bool delta) {
  std::shared_ptr<grpc::Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A peer back on the same address has a new certificate: the channel is per both.
    const std::string key = order.from_address + "\n" + order.from_cert_pem;
    auto it = channels_.find(key);
    if (it == channels_.end()) {
      if (order.from_address.empty()) {
        channel = control_->channel;
      } else if (!options_.tls_ca_pem.empty() && order.from_cert_pem.empty()) {
        return FailedPrecondition("the origin named sender " + order.from_address + " without its certificate");
      } else {
        channel = MakeChannel(order.from_address, options_.tls_ca_pem.empty() ? "" : order.from_cert_pem, true);
      }
      channels_[key] = channel;
    } else {
      channel = it->second;
    }
  }
  auto stub = v1::ChunkSource::NewStub(channel);
  grpc::ClientContext ctx;  // no bearer token: it is the origin's to see, not other peers'
  ctx.set_deadline(DeadlineIn(options_.fetch_deadline_seconds));
  v1::FetchChunkRequest req;
  req.set_version(order.version);
  req.set_chunk(order.chunk);
  req.set_delta(delta);
  req.set_transfer_id(order.transfer_id);
  req.set_ticket(order.from_address.empty() ? order.origin_ticket : order.ticket);
  std::unique_ptr<grpc::ClientReader<v1::FetchChunkReply>> reader = stub->FetchChunk(&ctx, req);
  // The signed size bounds what the sender may send, and reserving it spares the copies and
  // fresh pages of a string doubling its way up to a chunk.
  const uint64_t limit = store_.SignedBytes(order.version, order.chunk, delta).value_or(kMaxBroadcastChunkBytes);
  std::string bytes;
  bytes.reserve(limit);
  v1::FetchChunkReply piece;
  bool too_big = false;
  while (reader->Read(&piece)) {
    if (bytes.size() + piece.data().size() > limit) {
      too_big = true;  // a hostile sender: stop reading; verification would refuse it anyway
      ctx.TryCancel();
      break;
    }
    bytes += piece.data();
  }
  grpc::Status st = reader->Finish();
  bytes_received_ += bytes.size();
  if (too_big) {
    return DataLoss("sender " + order.from_address + " sent more than the " + std::to_string(limit) +
                    " bytes signed for " + (delta ? "the delta of chunk " : "chunk ") + std::to_string(order.chunk));
  }
  if (!st.ok()) {
    const std::string from = order.from_address.empty() ? options_.origin : order.from_address;
    return Status(st.error_code() == grpc::StatusCode::NOT_FOUND ? StatusCode::kNotFound : StatusCode::kUnavailable,
                  std::string(delta ? "fetching the delta of chunk " : "fetching chunk ") +
                      std::to_string(order.chunk) + " of version " + std::to_string(order.version) + " from " + from +
                      ": " + st.error_message());
  }
  return bytes;
}

Status BroadcastPeer::FetchAndStore(const Order& order, uint64_t* bytes) {
  if (options_.deltas && store_.CanTakeDelta(order.version, order.chunk)) {
    Result<std::string> delta = FetchBytes(order, /*delta=*/true);
    bool from_origin = false;
    if (delta.status().code() == StatusCode::kNotFound && !order.from_address.empty()) {
      // The sender got the chunk whole (it lacked the base): the origin holds every delta, and
      // a delta is a small fraction of the chunk this peer would otherwise pull.
      Order origin_order = order;
      origin_order.from_address.clear();
      origin_order.from_cert_pem.clear();
      delta = FetchBytes(origin_order, /*delta=*/true);
      from_origin = true;
    }
    Status st = delta.status();
    if (delta.ok()) {
      *bytes += delta.value().size();
      // PutDeltaChunk checks the delta and what it decodes to against the signed manifest.
      st = store_.PutDeltaChunk(order.version, order.chunk, std::move(delta).value());
    }
    // Bad bytes from the origin are not the ordered sender's fault: a failure, not corruption.
    if (from_origin && st.code() == StatusCode::kDataLoss) st = Internal("the origin's delta: " + st.message());
    // The base went meanwhile (FailedPrecondition) or nobody holds the delta: pull it whole.
    if (st.code() != StatusCode::kFailedPrecondition && st.code() != StatusCode::kNotFound) return st;
  }
  ECHELON_ASSIGN_OR_RETURN(std::string whole, FetchBytes(order, /*delta=*/false));
  *bytes += whole.size();
  // PutChunk hashes the bytes against the signed manifest before anything is stored.
  return store_.PutChunk(order.version, order.chunk, std::move(whole));
}

void BroadcastPeer::Fetch(const Order& order) {
  v1::PeerToOrigin msg;
  v1::BroadcastOutcome* out = msg.mutable_outcome();
  out->set_transfer_id(order.transfer_id);
  Result<broadcast::ChunkState> state = store_.State(order.version, order.chunk);
  if (state.ok() && state.value() == broadcast::ChunkState::kVerified) {
    // Already here (a transfer the origin cancelled still arrived): no need to fetch again.
    out->set_result(v1::BROADCAST_RESULT_VERIFIED);
  } else {
    uint64_t bytes = 0;
    Status st = FetchAndStore(order, &bytes);
    out->set_bytes(bytes);
    if (st.ok()) {
      out->set_result(v1::BROADCAST_RESULT_VERIFIED);
    } else {
      // Bytes that arrived but fail verification blame the sender; anything else is a failed fetch.
      out->set_result(st.code() == StatusCode::kDataLoss ? v1::BROADCAST_RESULT_CORRUPT : v1::BROADCAST_RESULT_FAILED);
      out->set_detail(st.message());
      if (st.code() == StatusCode::kDataLoss) {
        spdlog::warn("chunk {} of version {} from {}: {}", order.chunk, order.version,
                     order.from_address.empty() ? "origin" : order.from_address, st.message());
      }
    }
  }
  Send(msg);
  if (out->result() == v1::BROADCAST_RESULT_VERIFIED && store_.IsComplete(order.version)) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

Status BroadcastPeer::AddBase(const std::string& blob, uint32_t chunk_bytes) {
  ECHELON_ASSIGN_OR_RETURN(broadcast::Manifest m,
                           broadcast::BuildManifest(0, blob, chunk_bytes > 0 ? chunk_bytes : broadcast::ChunkBytesFor(blob.size())));
  return store_.AddBlob(m, blob);
}

std::optional<uint64_t> BroadcastPeer::WaitForVersion(uint64_t min_version, double timeout_s) {
  auto ready = [&]() -> std::optional<uint64_t> {
    std::optional<uint64_t> v = store_.NewestComplete();
    if (v && *v >= min_version) return v;
    return std::nullopt;
  };
  std::unique_lock<std::mutex> lock(mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (std::optional<uint64_t> v = ready()) return v;
    if (origin_gone_ || closing_.load()) return std::nullopt;
    if (cv_.wait_until(lock, until) == std::cv_status::timeout) return ready();
  }
}

bool BroadcastPeer::WaitForSwarmComplete(uint64_t version, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return swarm_complete_ >= version || origin_gone_ || closing_.load(); });
  return swarm_complete_ >= version;
}

bool BroadcastPeer::origin_gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return origin_gone_;
}

}  // namespace echelon::net
