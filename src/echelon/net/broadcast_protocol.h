// Constants and tunables of the broadcast transport (proto/echelon/v1/broadcast.proto), each
// with the reason for its default. The policy's tunables live in broadcast/tunables.h.
//
//   grpc::ChannelArguments args = BroadcastChannelArgs();   // message limits, no SO_REUSEPORT
//
// Thread contract: constants and a pure function.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <spdlog/common.h>

#include "echelon/broadcast/tunables.h"

namespace grpc {
class ChannelArguments;
class ServerBuilder;
}  // namespace grpc

namespace echelon::net {

// Bumped on any incompatible change to broadcast.proto; checked at Hello. 2: delta chunks.
// 3: fetches need the Order's ticket.
inline constexpr uint32_t kBroadcastProtocolVersion = 3;

// Fetches one ticket allows at one node: a delta and then the whole chunk (when the delta
// fails to decode or the sender lacks it). A leaked ticket is worth one chunk, twice.
inline constexpr int kTicketUses = 2;
// Transfers a node remembers the uses of; a ticket older than all of them is refused. At about
// 1,024 chunks a version and two upload slots, a node serves far fewer within a version.
inline constexpr size_t kTicketMemory = 1 << 16;

// How long the origin waits for a TCP connection to a joining peer's advertised address
// before it treats the peer as unreachable (receive-only).
inline constexpr double kReachProbeSeconds = 2.0;

// Largest chunk the CLI accepts (--chunk-mib). Bigger chunks lengthen the relay tail
// (~log2(N) chunk times) for no gain once per-chunk overhead is already < 1%.
inline constexpr uint32_t kMaxBroadcastChunkBytes = 64u << 20;
// Message limit on both server and channel: a chunk plus framing. gRPC's 4 MiB default is
// below one default chunk, so it must be raised on both sides.
inline constexpr int kMaxBroadcastMessageBytes = static_cast<int>(kMaxBroadcastChunkBytes + (1u << 20));

// Peers heartbeat this often on their control stream; the origin declares a peer dead after
// kBroadcastDeadAfterSeconds of silence. A killed process is usually noticed sooner, from
// the broken stream; the timeout covers a hung host or a silently dropped link. 3 s is
// several beats, so one slow scheduling slice on a loaded 2-core machine is not a death.
inline constexpr double kBroadcastHeartbeatSeconds = 0.5;
inline constexpr double kBroadcastDeadAfterSeconds = 3.0;

// A sender whose chunks could not be fetched this many times in a row (unreachable,
// refused), by two receivers or more, is declared dead even while its control stream lives:
// its server is gone. Failures reported by one receiver alone only stop that receiver
// fetching from it (a receiver with a valid token could otherwise evict an honest relay).
inline constexpr int kMaxFetchFailuresInARow = 3;

// The start latency the origin's planner sizes every node's queue by
// (RelayOptions::start_latency_seconds): a sender's link idles between two transfers for an
// Outcome (receiver -> origin), the next Order (origin -> receiver) and a fetch request
// (receiver -> sender), about 1.5 round trips of ~30 ms between hosts on one continent. On
// netns links at 100 Mbit/s (1 MiB chunks: one transfer per slot) N = 16 peers took 1.06 x T1.
inline constexpr double kNetStartLatencySeconds = 0.05;

// One chunk fetch may take this long. Star mode at 16 peers shares 100 Mbit/s 16 ways, so a
// 4 MiB chunk takes ~5.4 s; 60 s is far beyond any healthy transfer yet bounds a stall.
inline constexpr double kFetchDeadlineSeconds = 60.0;

// Fetch threads per peer: as many as the downloads the planner may order at once
// (RelayOptions::max_inbound places, each holding up to max_transfers_per_slot small deltas),
// so every ordered download starts at once and no sender's slot waits behind a queue.
inline constexpr int kFetchWorkers =
    broadcast::RelayOptions{}.max_inbound * broadcast::RelayOptions{}.max_transfers_per_slot;

// Uploads planned per node over the network (RelayOptions::upload_slots; the simulator uses
// 1). Every control message (an outcome, the next order, the fetch request) queues behind
// the data in a saturated sender's or receiver's shaper (`tbf latency 50ms`: up to 50 ms each
// way), so with one slot the uplink idles ~0.1 s between 4 MiB chunks (~30% at 100 Mbit/s).
// With two, the next request is already waiting at the sender when a chunk ends; the sender
// still transmits one chunk at a time (ChunkSourceService serialises), so a chunk still
// crosses each hop in one chunk time.
inline constexpr int kNetUploadSlots = 2;

// A chunk streams in pieces of this size. A node sends one chunk at a time (the others wait
// their turn), so a chunk reaches its receiver after one chunk time instead of sharing the
// uplink; pieces let the sender hold its uplink only while its bytes are being written.
// 256 KiB keeps per-message overhead negligible at 100 Mbit/s (~20 ms per piece).
inline constexpr uint32_t kChunkPieceBytes = 256u << 10;

// A peer that declares its upload rate paces what it serves to this fraction of it, so its own
// uplink queue stays short (one that declares none finds its pace: net/uplink_pacer.h). On a
// FIFO uplink (most home modems) the acknowledgements of what a peer downloads otherwise wait
// behind its uploads: on tbf-shaped netns links busy senders moved 73-79 of their 95 Mbit/s
// (docs/BENCHMARKS.md). A paced node serves pieces of at most kPacedPieceBytes (smaller on slow
// uplinks: UplinkPacer::Pace).
inline constexpr double kUploadPaceFraction = 0.95;
inline constexpr uint32_t kPacedPieceBytes = 64u << 10;

// HTTP/2 flow-control window a receiver offers per stream (grpc.http2.lookahead_bytes).
// Each chunk is a new stream; with gRPC's 64 KiB start the sender stalls on WINDOW_UPDATEs,
// which in a swarm queue behind the receiver's own uploads in its shaper (up to 50 ms).
// 8 MiB lets a whole default chunk flow without waiting for the receiver.
inline constexpr int kStreamWindowBytes = 8 << 20;

// Initial upload estimate a peer advertises (100 Mbit/s); the origin replaces it with
// measured rates within a few chunks (RelayOptions::bandwidth_ewma_alpha).
inline constexpr double kDefaultUploadBps = 12.5e6;
// A declared rate (Hello.upload_bps, `broadcast peer --upload-mbps`) is held to 8 kbit/s ..
// 100 Gbit/s: NaN, 0 and negatives mean "not declared".
inline constexpr double kMinDeclaredUploadBps = 1e3;
inline constexpr double kMaxDeclaredUploadBps = 12.5e9;

// The origin's first estimate of a peer's upload rate from what its Hello declares.
inline double DeclaredUploadBps(double declared) {
  if (!(declared > 0)) return kDefaultUploadBps;  // NaN, 0, negative: not declared
  return declared < kMinDeclaredUploadBps ? kMinDeclaredUploadBps
                                          : (declared > kMaxDeclaredUploadBps ? kMaxDeclaredUploadBps : declared);
}

// Rewrites the bytes of chunk (version, index) before a node serves them. Test fault
// injection only (a corrupting or slow host); production code passes none.
using ServeFilter = std::function<void(uint64_t version, uint32_t index, std::string* bytes)>;

// Applies the message limits and GRPC_ARG_ALLOW_REUSEPORT=0 (two servers on one port must
// fail loudly, not split traffic) to a channel or a server.
void ApplyBroadcastLimits(grpc::ChannelArguments* args);
void ApplyBroadcastLimits(grpc::ServerBuilder* builder);

// Per-version progress lines: info for the standalone tool, debug inside a training run
// (log_each_version in the origin's and peer's options).
inline spdlog::level::level_enum VersionLogLevel(bool log_each_version) {
  return log_each_version ? spdlog::level::info : spdlog::level::debug;
}

}  // namespace echelon::net
