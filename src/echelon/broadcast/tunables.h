// The one table of weight-broadcast tunables, each with the reason for its default.
//
//   RelayOptions opts;                  // defaults below
//   opts.upload_slots = 2;              // e.g. a transport that wants two chunks in flight
//   RelayPlanner planner(opts, manifest.num_chunks(), origin_bps);
//
// Thread contract: plain values.
#pragma once

#include <cstdint>

namespace echelon::broadcast {

// 4 MiB: the chunk size of BuildManifest callers that name none (tests, the simulator). At
// 100 Mbit/s a 4 MiB chunk takes ~335 ms, so one round trip per chunk costs < 1% (Ray uses
// 5 MiB for the same reason). The network origin cuts snapshots by ChunkBytesFor below instead.
inline constexpr uint32_t kDefaultChunkBytes = 4u << 20;

// The chunk size a snapshot is cut into when none is given: about kTargetChunks chunks, a power of
// two from 1 MiB to 64 MiB (128 MiB -> 1 MiB, 16 GB -> 16 MiB). The relay tail and the first
// hops cost a few chunk times, so more, smaller chunks bring every peer closer to one transfer
// time; the origin plans every transfer, and a fast node's slot holds several small transfers
// at once (RelayOptions::start_latency_seconds), so up to ~1,000 chunks cost neither planning
// time nor idle links.
// Measured on netns links with small packets first (docs/BENCHMARKS.md), 128 MiB to 8 peers:
// 1.13 x T1 in 4 MiB chunks, 1.09 in 1 MiB; to 16 peers 1.35 against 1.13; 4 fast + 4 slow
// peers, endgame 3, 1.23 against 1.07 x the capacity bound; its 2% delta 2.11 s against 2.25 s.
// Simulated, 16 GB to 1,000 peers: 1.02 x T1 in 4 MiB and 16 MiB chunks, 1.08 in 64 MiB.
inline constexpr uint64_t kTargetChunks = 1024;
inline constexpr uint32_t kMinAutoChunkBytes = 1u << 20;
inline constexpr uint32_t kMaxAutoChunkBytes = 64u << 20;
inline uint32_t ChunkBytesFor(uint64_t total_bytes) {
  uint32_t chunk = kMinAutoChunkBytes;
  while (chunk < kMaxAutoChunkBytes && static_cast<uint64_t>(chunk) * kTargetChunks < total_bytes) chunk <<= 1;
  return chunk;
}

// Chunks below this size are refused: the manifest would grow past the payload it names.
inline constexpr uint32_t kMinChunkBytes = 1u << 10;

// Keep the newest 3 versions: the one in use, the one arriving, and one spare for an actor
// that is a version behind (staleness S >= 1) while the next one streams in.
inline constexpr int kDefaultKeepVersions = 3;

enum class RelayMode {
  kSwarm,  // peer-assisted: every holder of a verified chunk may relay it (the default)
  kStar,   // baseline: only the origin uploads, to every peer in parallel
};

struct RelayOptions {
  RelayMode mode = RelayMode::kSwarm;
  // Concurrent uploads per node. 1 sends each chunk at the full upload rate, so it is
  // verified (and relayable) as early as possible; a real transport may use 2 to hide the
  // gap between chunks. Star mode ignores this for the origin (one slot per peer).
  int upload_slots = 1;
  // A node uses its upload_slots only while 4 MiB of its transfers (at least one) take at most
  // this long at its measured rate; a slower node sends one transfer at a time. Its queued
  // second chunk would wait a whole chunk time, holding that receiver's download, to save one
  // round trip (~0.1 s): with 4 of 8
  // peers at a tenth of the others' rate, two slots everywhere took 1.46 x the capacity bound
  // (simulated, 50 ms per transfer start), one slot on the slow peers 1.24 x.
  double multi_slot_max_chunk_seconds = 1.0;
  // Concurrent downloads per receiver: bounds the receiver's download link share and
  // spreads senders across receivers. 4 x 100 Mbit/s senders still fit a 1 Gbit/s NIC.
  int max_inbound = 4;
  // How many transfers a node has in flight: enough to keep its link busy through a transfer's
  // start, and no more. Every transfer pays a start (an Outcome to the origin, the next Order, a
  // fetch request: round trips through queued links) that queued transfers must cover, or the
  // link idles; but each transfer queued behind others is a plan made that much earlier, on
  // older knowledge, and holds a chunk back from relays that could send it sooner. So a node
  // keeps ceil(start latency x its rate / mean transfer) + 1 in flight (its declared rate, or a
  // faster one measured: a rate measured while its queue was too short includes idle starts),
  // spread over its slots (at least one per slot, at most max_transfers_per_slot), and each
  // receiver's inbound place takes one of its own slots' worth. Simulated with serial uploads,
  // 128 MiB in 1 MiB chunks to 4 / 16 / 64 peers at 1 Gbit/s, the best fixed depth per slot was
  // 1 at 1 ms starts (1.02 / 1.05 / 1.07 x T1; 4 gave 1.06 / 1.13 / 1.16, the origin sending
  // 6-16% duplicate copies), 2 at 20 ms and 4 at 50 ms (1.12 / 1.18 / 1.24; 1 gave 3.6-3.8 x:
  // idle links), which is what the rule picks. 0: instant starts, as the simulator's and the
  // tests' links (the simulator sets its own); the network origin uses
  // net::kNetStartLatencySeconds, 0.05 s, at which deltas (a 2% delta of a 4 MiB chunk is
  // ~90 KB, 7 ms at 100 Mbit/s) fill a slot with up to 8.
  double start_latency_seconds = 0;
  int max_transfers_per_slot = 8;
  // A node reported corrupt by this many distinct receivers never uploads again (it still
  // receives). TCP already catches line noise, so one corrupt chunk means a faulty host, but
  // the report comes from the receiver, who may be the liar: one report only stops that
  // receiver taking from that sender again (a lying receiver hurts itself), and two distinct
  // reporters ban the sender for everyone.
  int ban_after_corrupt = 2;
  // Bandwidths within this ratio are treated as equal when ranking receivers, so that
  // measurement noise does not reorder otherwise identical peers.
  double bandwidth_bucket_ratio = 1.25;
  // Weight of a new measurement in a node's bandwidth estimate (EWMA). 0.3 follows a
  // changed link within ~3 chunks while smoothing one slow transfer.
  double bandwidth_ewma_alpha = 0.3;
  // Endgame: an uploader with nothing new to offer may also send a chunk that is already on
  // its way to a receiver from a slow sender (see multi_slot_max_chunk_seconds)
  // at least this many times slower (measured), once per receiver and chunk; whichever arrives
  // first counts, the other is a duplicate. 0 turns it off. On netns links with 4 fast + 4
  // ten-times-slower peers 3 took 1.20-1.21 to 1.07-1.11 x the capacity bound (ACK-priority
  // links) and 1.53 to 1.37 (FIFO), at ~2% duplicate transfers; simulated with noisy transfers
  // and undeclared rates 1.26 to 1.16. Only slow senders are duplicated, because between equal
  // peers measured rates differ by 2-3x on loopback (concurrent sends, TCP ramp-up) and a bare
  // ratio fired there; a node whose chunk takes under a second is never waited on for long.
  double endgame_ratio = 3;
};

}  // namespace echelon::broadcast
