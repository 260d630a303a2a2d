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
// Every fetch must carry its Order's ticket (`check`; none in unit tests of the source alone):
// a node serves only transfers the origin ordered, so a peer the origin dropped gets no more
// than the Orders it already held, whatever token it kept.
//
//   TicketBook tickets;                     // a peer's: keyed by the origin's Welcome
//   ChunkSourceService source(&store, true, nullptr, [&](const v1::FetchChunkRequest& r) { return tickets.Use(r); });
//   tickets.SetKey(welcome.ticket_key());
//
// With a `pacer` (net/uplink_pacer.h) pieces of kPacedPieceBytes leave no faster than it allows,
// across fetches.
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
#include <optional>
#include <string>
#include <thread>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/net/broadcast_protocol.h"
#include "echelon/net/uplink_pacer.h"
#include "echelon/v1/broadcast.grpc.pb.h"

namespace echelon::net {

// The ticket for one transfer at one sender: HMAC-SHA256 under that sender's ticket key (which
// only the origin and the sender hold) of the transfer id, version and chunk.
std::string MakeTicket(const std::string& key, uint64_t transfer_id, uint64_t version, uint32_t chunk);
// True when the request carries MakeTicket(key, ...) of its own transfer, version and chunk
// (compared in constant time).
bool TicketMatches(const std::string& key, const v1::FetchChunkRequest& req);

// A sender's record of the tickets it honoured: each at most kTicketUses times; the uses of the
// kTicketMemory newest transfers are remembered, and older transfers are refused.
// Thread-safe.
class TicketBook {
 public:
  void SetKey(std::string key);  // until then every ticket is refused
  // True, counting one use, when the request's ticket is this key's for its transfer, version
  // and chunk and has uses left.
  bool Use(const v1::FetchChunkRequest& req);

 private:
  std::mutex mu_;
  std::string key_;
  std::map<uint64_t, int> uses_;              // transfer id -> fetches served
  std::optional<uint64_t> forgotten_below_;  // transfers at or below this are refused
};

// True when the fetch may be served (its ticket holds); nullptr serves every fetch.
using TicketCheck = std::function<bool(const v1::FetchChunkRequest&)>;

class ChunkSourceService final : public v1::ChunkSource::Service {
 public:
  ChunkSourceService(const broadcast::ChunkStore* store, bool serialize_uploads, ServeFilter filter = nullptr,
                     TicketCheck check = nullptr, double upload_deadline_seconds = kFetchDeadlineSeconds,
                     UplinkPacer* pacer = nullptr);
  ~ChunkSourceService() override;

  grpc::Status FetchChunk(grpc::ServerContext* ctx, const v1::FetchChunkRequest* req,
                          grpc::ServerWriter<v1::FetchChunkReply>* writer) override;
  // Fetches cancelled for running past the deadline.
  int64_t overdue_cancelled() const;

 private:
  void ReapLoop();

  const broadcast::ChunkStore* const store_;
  const bool serialize_uploads_;
  const ServeFilter filter_;
  const TicketCheck check_;
  std::mutex upload_mu_;  // held while one chunk's pieces are written (serialize_uploads_)
  const double upload_deadline_seconds_;
  UplinkPacer* const pacer_;  // not owned; may be null
  mutable std::mutex active_mu_;  // guards active_, stopping_, overdue_cancelled_
  std::condition_variable reap_cv_;
  std::map<grpc::ServerContext*, std::chrono::steady_clock::time_point> active_;  // running fetches: start
  bool stopping_ = false;
  int64_t overdue_cancelled_ = 0;
  std::thread reaper_;
};

}  // namespace echelon::net
