// ChunkSourceService: the data plane of the broadcast. The origin and every peer serve the
// verified chunks of their ChunkStore to whoever an Order names them as sender for
// (FetchChunk: version + index -> the chunk in kChunkPieceBytes pieces). Only verified chunks
// are ever in a ChunkStore, so a correct node never serves bad bytes; receivers verify anyway
// (a faulty host might). With serialize_uploads, concurrent fetches take turns (FIFO-ish, one
// mutex held while a chunk's pieces are written), so each chunk leaves at the full upload
// rate and becomes relayable at its receiver as early as possible.
//
//   ChunkSourceService source(&store, /*serialize_uploads=*/true);
//   builder.RegisterService(&source);
//   // fault injection in tests: a node that corrupts what it serves
//   ChunkSourceService evil(&store, true, [](uint64_t, uint32_t, std::string* b) { (*b)[0] ^= 1; });
//
// Thread contract: FetchChunk runs on gRPC's threads concurrently; the ChunkStore is
// thread-safe and the filter must be too. upload_mu_ is held while one chunk is written.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/net/broadcast_protocol.h"
#include "echelon/v1/broadcast.grpc.pb.h"

namespace echelon::net {

class ChunkSourceService final : public v1::ChunkSource::Service {
 public:
  // A non-empty `token` must be presented as "authorization: Bearer <token>" by every fetcher.
  ChunkSourceService(const broadcast::ChunkStore* store, bool serialize_uploads, ServeFilter filter = nullptr,
                     std::string token = "")
      : store_(store), serialize_uploads_(serialize_uploads), filter_(std::move(filter)), token_(std::move(token)) {}

  grpc::Status FetchChunk(grpc::ServerContext* ctx, const v1::FetchChunkRequest* req,
                          grpc::ServerWriter<v1::FetchChunkReply>* writer) override;

 private:
  const broadcast::ChunkStore* const store_;
  const bool serialize_uploads_;
  const ServeFilter filter_;
  const std::string token_;
  std::mutex upload_mu_;  // held while one chunk's pieces are written (serialize_uploads_)
};

}  // namespace echelon::net
