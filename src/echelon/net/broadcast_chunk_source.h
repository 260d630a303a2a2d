// ChunkSourceService: the data plane of the broadcast. The origin and every peer serve the
// verified chunks of their ChunkStore to whoever an Order names them as sender for
// (FetchChunk: version + index -> the chunk, or with `delta` the chunk's delta, in
// kChunkPieceBytes pieces). Only verified chunks
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
// With `pace_bps` > 0 pieces of kPacedPieceBytes leave no faster than that, across fetches.
//
// A fetch still running after `upload_deadline_seconds` (kFetchDeadlineSeconds) is cancelled
// from the service's side: a receiver that stops reading (or reads at a trickle) cannot hold
// this node's upload, whatever deadline it set for itself.
//
// Thread contract: FetchChunk runs on gRPC's threads concurrently; the ChunkStore is
// thread-safe and the filter must be too. upload_mu_ is held while one chunk is written; one
// reaper thread cancels overdue fetches (active_mu_ guards the table of running ones).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/net/broadcast_protocol.h"
#include "echelon/v1/broadcast.grpc.pb.h"

namespace echelon::net {

class ChunkSourceService final : public v1::ChunkSource::Service {
 public:
  // A non-empty `token` must be presented as "authorization: Bearer <token>" by every fetcher.
  ChunkSourceService(const broadcast::ChunkStore* store, bool serialize_uploads, ServeFilter filter = nullptr,
                     std::string token = "", double upload_deadline_seconds = kFetchDeadlineSeconds,
                     double pace_bps = 0);
  ~ChunkSourceService() override;

  grpc::Status FetchChunk(grpc::ServerContext* ctx, const v1::FetchChunkRequest* req,
                          grpc::ServerWriter<v1::FetchChunkReply>* writer) override;
  // Fetches cancelled for running past the deadline.
  int64_t overdue_cancelled() const;

 private:
  void ReapLoop();
  void Pace(size_t bytes);  // sleeps until `bytes` more may leave at pace_bps_

  const broadcast::ChunkStore* const store_;
  const bool serialize_uploads_;
  const ServeFilter filter_;
  const std::string token_;
  std::mutex upload_mu_;  // held while one chunk's pieces are written (serialize_uploads_)
  const double upload_deadline_seconds_;
  const double pace_bps_;
  std::mutex pace_mu_;  // guards paced_until_
  std::chrono::steady_clock::time_point paced_until_;  // when the paced uplink is next free
  mutable std::mutex active_mu_;  // guards active_, stopping_, overdue_cancelled_
  std::condition_variable reap_cv_;
  std::map<grpc::ServerContext*, std::chrono::steady_clock::time_point> active_;  // running fetches: start
  bool stopping_ = false;
  int64_t overdue_cancelled_ = 0;
  std::thread reaper_;
};

}  // namespace echelon::net
