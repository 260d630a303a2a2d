#include "echelon/net/broadcast_chunk_source.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>

#include "echelon/net/broadcast_protocol.h"

namespace echelon::net {

void ApplyBroadcastLimits(grpc::ChannelArguments* args) {
  args->SetMaxReceiveMessageSize(kMaxBroadcastMessageBytes);
  args->SetMaxSendMessageSize(kMaxBroadcastMessageBytes);
  args->SetInt(GRPC_ARG_ALLOW_REUSEPORT, 0);
  args->SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
}

void ApplyBroadcastLimits(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxBroadcastMessageBytes);
  builder->SetMaxSendMessageSize(kMaxBroadcastMessageBytes);
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
}

std::string MakeTicket(const std::string& key, uint64_t transfer_id, uint64_t version, uint32_t chunk) {
  unsigned char message[20];
  for (int i = 0; i < 8; ++i) message[i] = static_cast<unsigned char>(transfer_id >> (8 * i));
  for (int i = 0; i < 8; ++i) message[8 + i] = static_cast<unsigned char>(version >> (8 * i));
  for (int i = 0; i < 4; ++i) message[16 + i] = static_cast<unsigned char>(chunk >> (8 * i));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message, sizeof(message), mac, &n);
  return std::string(reinterpret_cast<const char*>(mac), n);
}

bool TicketMatches(const std::string& key, const v1::FetchChunkRequest& req) {
  const std::string want = MakeTicket(key, req.transfer_id(), req.version(), req.chunk());
  return req.ticket().size() == want.size() && CRYPTO_memcmp(req.ticket().data(), want.data(), want.size()) == 0;
}

void TicketBook::SetKey(std::string key) {
  std::lock_guard<std::mutex> lock(mu_);
  key_ = std::move(key);
}

bool TicketBook::Use(const v1::FetchChunkRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  if (key_.empty() || !TicketMatches(key_, req)) return false;
  if (forgotten_below_ && req.transfer_id() <= *forgotten_below_) return false;
  int& used = uses_[req.transfer_id()];
  if (used >= kTicketUses) return false;
  ++used;
  if (uses_.size() > kTicketMemory) {
    forgotten_below_ = uses_.begin()->first;
    uses_.erase(uses_.begin());
  }
  return true;
}

ChunkSourceService::ChunkSourceService(const broadcast::ChunkStore* store, bool serialize_uploads, ServeFilter filter,
                                       TicketCheck check, double upload_deadline_seconds, UplinkPacer* pacer)
    : store_(store),
      serialize_uploads_(serialize_uploads),
      filter_(std::move(filter)),
      check_(std::move(check)),
      upload_deadline_seconds_(upload_deadline_seconds),
      pacer_(pacer),
      reaper_([this] { ReapLoop(); }) {}

ChunkSourceService::~ChunkSourceService() {
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    stopping_ = true;
  }
  reap_cv_.notify_all();
  reaper_.join();
}

void ChunkSourceService::ReapLoop() {
  const auto deadline = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(upload_deadline_seconds_));
  const auto period = std::min<std::chrono::steady_clock::duration>(deadline / 4, std::chrono::seconds(1));
  std::unique_lock<std::mutex> lock(active_mu_);
  while (!stopping_) {
    reap_cv_.wait_for(lock, period);
    const auto now = std::chrono::steady_clock::now();
    for (auto& [ctx, started] : active_) {
      if (now - started <= deadline) continue;
      ctx->TryCancel();  // its blocked Write returns false; the handler removes it
      started = std::chrono::steady_clock::time_point::max() - deadline;  // cancel once
      ++overdue_cancelled_;
    }
  }
}

int64_t ChunkSourceService::overdue_cancelled() const {
  std::lock_guard<std::mutex> lock(active_mu_);
  return overdue_cancelled_;
}

grpc::Status ChunkSourceService::FetchChunk(grpc::ServerContext* ctx, const v1::FetchChunkRequest* req,
                                            grpc::ServerWriter<v1::FetchChunkReply>* writer) {
  if (check_ && !check_(*req))
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "no valid ticket for transfer " + std::to_string(req->transfer_id()) +
                            " (a fetch needs an Order from the origin; a ticket serves " +
                            std::to_string(kTicketUses) + " fetches)");
  Result<std::shared_ptr<const std::string>> chunk =
      req->delta() ? store_->GetDelta(req->version(), req->chunk()) : store_->GetChunk(req->version(), req->chunk());
  if (!chunk.ok()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, std::string(req->delta() ? "the delta of " : "") + "chunk " +
                                                         std::to_string(req->chunk()) + " of version " +
                                                         std::to_string(req->version()) +
                                                         " is not held here: " + chunk.status().message());
  }
  std::shared_ptr<const std::string> bytes = chunk.value();
  if (filter_) {
    auto filtered = std::make_shared<std::string>(*bytes);
    filter_(req->version(), req->chunk(), filtered.get());
    bytes = filtered;
  }
  std::unique_lock<std::mutex> turn(upload_mu_, std::defer_lock);
  if (serialize_uploads_) turn.lock();
  // The deadline runs from here: waiting for the turn is not the receiver's doing.
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    active_[ctx] = std::chrono::steady_clock::now();
  }
  struct Done {
    ChunkSourceService* s;
    grpc::ServerContext* ctx;
    ~Done() {
      std::lock_guard<std::mutex> lock(s->active_mu_);
      s->active_.erase(ctx);
    }
  } done{this, ctx};
  v1::FetchChunkReply piece;
  for (size_t off = 0; off < bytes->size();) {
    const size_t left = bytes->size() - off;
    const size_t n = pacer_ != nullptr ? pacer_->Pace(left) : std::min<size_t>(kChunkPieceBytes, left);
    piece.set_data(bytes->data() + off, n);
    if (!writer->Write(piece)) return grpc::Status(grpc::StatusCode::CANCELLED, "receiver went away");
    off += n;
  }
  return grpc::Status::OK;
}

}  // namespace echelon::net
