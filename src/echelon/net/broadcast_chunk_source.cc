#include "echelon/net/broadcast_chunk_source.h"

#include "echelon/net/auth.h"

#include <grpcpp/grpcpp.h>

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

grpc::Status ChunkSourceService::FetchChunk(grpc::ServerContext* ctx, const v1::FetchChunkRequest* req,
                                            grpc::ServerWriter<v1::FetchChunkReply>* writer) {
  if (!token_.empty() && !TokenMatches(*ctx, token_))
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token for chunk fetches");
  Result<std::shared_ptr<const std::string>> chunk = store_->GetChunk(req->version(), req->chunk());
  if (!chunk.ok()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "chunk " + std::to_string(req->chunk()) + " of version " +
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
  v1::FetchChunkReply piece;
  for (size_t off = 0; off < bytes->size(); off += kChunkPieceBytes) {
    piece.set_data(bytes->data() + off, std::min<size_t>(kChunkPieceBytes, bytes->size() - off));
    if (!writer->Write(piece)) return grpc::Status(grpc::StatusCode::CANCELLED, "receiver went away");
  }
  return grpc::Status::OK;
}

}  // namespace echelon::net
