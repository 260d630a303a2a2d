// RelayPlanner: the broadcast policy. It decides which node sends which chunk to whom, and
// never moves a byte itself (see link.h for the mechanism side). It runs at the origin,
// which learns of every verified chunk, death and join through the calls below.
//
//   RelayPlanner planner(RelayOptions{}, manifest.num_chunks(), /*origin_bps=*/12.5e6);
//   NodeId a = planner.AddPeer(12.5e6, store_a.HeldMask(v));   // delta: chunks held already
//   for (const Transfer& t : planner.NextTransfers()) link.Start(t, done);
//   // in done: planner.OnTransferDone(t.id, outcome); then NextTransfers() again
//   planner.RemovePeer(a);   // a died: its receivers re-plan, keeping what they hold
//
// Swarm policy (the default), run whenever an uploader has a free slot and something new
// to offer (a verified chunk arrived, a slot freed, a peer joined or died):
//  - any node holding a verified chunk may upload it: the origin and every peer, each with
//    `upload_slots` slots of transfers in flight (as many as cover a transfer's start:
//    RelayOptions::start_latency_seconds), so a chunk is relayed as soon as it is verified
//    and the file streams through the swarm chunk by chunk (pipelining);
//  - the sender offers its rarest chunk first (fewest peers holding or receiving it), so the
//    origin's first pass sends every chunk out exactly once before it sends any duplicate;
//  - the receiver is the peer with the fewest downloads in flight, then (for a peer sender)
//    one no faster than the sender (a slow sender would hold a fast receiver's last chunk
//    while fast senders can serve it: 4 fast + 4 ten-times-slower peers go from 1.35 to 1.14 x
//    the capacity bound), then one that can relay (reachable), then the fastest measured
//    uploader (it will relay the chunk onward sooner), then the one holding fewest chunks (the
//    one furthest behind), then the lowest id. Faster uploaders pick first.
// With one chunk and equal bandwidths this is exactly the binomial broadcast tree (the
// holders double every chunk time: ceil(log2(N+1)) rounds); with many chunks every node's
// upload is busy, so the last peer finishes about one file time plus log2(N) chunk times.
// There are no fixed trees to repair: when a relay dies, the chunks it was sending go back
// to "needed" and are re-planned from any other holder; its receivers keep every verified
// chunk and resume. A sender of a chunk that failed verification is never asked to send to
// that receiver again and gets a strike (one per distinct receiver: the report may be the
// receiver's lie); after `ban_after_corrupt` strikes it never uploads again. The chunk is
// refetched from elsewhere.
// Endgame: an uploader with nothing new to offer may duplicate a chunk already in flight to a
// receiver from a slow sender (4 MiB of its transfers take over multi_slot_max_chunk_seconds)
// at least `endgame_ratio` times slower, once per receiver and chunk; the first copy verified
// counts, the other arrives as a duplicate. So slow senders cannot hold fast receivers' last
// chunks while fast uploaders idle.
// A late joiner is simply a peer with nothing (or an older version's chunks) held. A peer
// nobody can dial (NAT) receives like any other but never uploads: it dials its senders.
//
// Star policy (the baseline): only the origin uploads, to every peer at once, each peer's
// chunks in order.
//
// Thread contract: not thread-safe; one owner (RelaySession serialises calls under its
// mutex). Costs: O(peers + chunks log chunks) per transfer started.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "echelon/broadcast/link.h"
#include "echelon/broadcast/tunables.h"

namespace echelon::broadcast {

class RelayPlanner {
 public:
  struct Stats {
    uint64_t started = 0;
    uint64_t verified = 0;
    uint64_t corrupt = 0;
    uint64_t failed = 0;
    uint64_t cancelled = 0;     // in flight when an endpoint was removed
    uint64_t origin_sends = 0;  // transfers started by the origin
    uint64_t endgame = 0;       // duplicates of a chunk in flight from a much slower sender
  };

  // mean_chunk_bytes: what one transfer carries on average (deltas: their sizes), to judge how
  // long a node's chunk takes (RelayOptions::multi_slot_max_chunk_seconds).
  RelayPlanner(const RelayOptions& options, int num_chunks, double origin_upload_bps,
               double mean_chunk_bytes = kDefaultChunkBytes);
  RelayPlanner(const RelayPlanner&) = delete;
  RelayPlanner& operator=(const RelayPlanner&) = delete;

  // A new peer, at the start or late. held[c] = chunk c is already verified there (delta
  // from an older version); empty = nothing held. A peer others cannot reach (behind NAT, or
  // started without a listening address) is added with reachable = false: it only receives.
  // Returns its NodeId.
  NodeId AddPeer(double upload_bps, const std::vector<bool>& held = {}, bool reachable = true);
  // The peer died or left. Returns the transfers to or from it that were in flight; the
  // planner forgets them (a late OnTransferDone for them is ignored).
  std::vector<Transfer> RemovePeer(NodeId peer);
  // Folds a measured upload rate into the node's estimate (EWMA); the first measurement
  // replaces the rate the node was added with (declared, or a default).
  void UpdateBandwidth(NodeId node, double measured_bps);

  // Transfers to start now (every uploader with a free slot and something useful to send).
  std::vector<Transfer> NextTransfers();
  // Unknown or forgotten ids are ignored.
  void OnTransferDone(uint64_t transfer_id, TransferOutcome outcome);

  int num_chunks() const { return num_chunks_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  bool IsAlive(NodeId n) const { return nodes_[n].alive; }
  bool IsBanned(NodeId n) const { return nodes_[n].banned; }
  bool IsReachable(NodeId n) const { return nodes_[n].reachable; }
  int strikes(NodeId n) const { return nodes_[n].strikes; }
  bool Holds(NodeId n, int chunk) const { return nodes_[n].held[chunk]; }
  int HeldCount(NodeId n) const { return nodes_[n].held_count; }
  bool IsComplete(NodeId n) const { return nodes_[n].held_count == num_chunks_; }
  bool AllComplete() const;  // every live peer holds every chunk
  double bandwidth(NodeId n) const { return nodes_[n].bps; }
  size_t in_flight() const { return inflight_.size(); }
  // Transfers one of n's upload slots holds at once (RelayOptions::start_latency_seconds).
  int transfers_per_slot(NodeId n) const;
  const Stats& stats() const { return stats_; }

 private:
  struct Node {
    bool alive = true;
    bool banned = false;
    bool reachable = true;  // false: never asked to upload (nobody can dial it)
    bool dirty = true;  // may have something new to send
    int strikes = 0;             // distinct receivers that reported this node's chunks corrupt
    std::vector<bool> reported;  // by receiver: it reported this node corrupt or a fetch from it
                                 // failed (it never takes from it again)
    double bps = 0;
    bool measured = false;  // bps has been measured at least once
    double declared_bps = 0;  // the rate it was added with (its queue is sized by the faster)
    std::vector<bool> held;
    std::vector<uint8_t> incoming;  // per chunk: transfers in flight to this node (2: an endgame copy)
    int held_count = 0;
    int incoming_count = 0;
    int uploads = 0;
  };

  int UploadSlots(NodeId n) const;  // concurrent uploads: slots x transfers_per_slot(n)
  // Transfers n keeps in flight to cover a start (RelayOptions::start_latency_seconds).
  int InFlight(NodeId n) const;
  // 4 MiB of its transfers take over multi_slot_max_chunk_seconds: it sends one at a time, and
  // its transfers are what the endgame duplicates.
  bool IsSlowSender(NodeId n) const;
  int MaxInbound(NodeId n) const;     // concurrent downloads: max_inbound x transfers_per_slot(n)
  bool CanUpload(NodeId n) const;
  int BandwidthBucket(NodeId n) const;
  // Best (chunk, receiver) for uploader u; false when it has nothing useful to send.
  bool PickSwarm(NodeId u, int* chunk, NodeId* receiver) const;
  bool PickStar(NodeId u, int* chunk, NodeId* receiver) const;
  bool PickEndgame(NodeId u, int* chunk, NodeId* receiver) const;
  NodeId BestReceiver(NodeId u, int chunk) const;
  bool Reported(NodeId sender, NodeId receiver) const;
  void MarkReported(NodeId sender, NodeId receiver);
  void MarkAllDirty();
  void Forget(const Transfer& t);  // undoes a transfer's bookkeeping

  const RelayOptions options_;
  const int num_chunks_;
  const double mean_chunk_bytes_;
  const double slow_batch_bytes_;  // IsSlowSender's 4 MiB of transfers (at least one)
  std::vector<Node> nodes_;
  std::vector<int> copies_;  // per chunk: live peers holding or receiving it
  int live_peers_ = 0;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Transfer> inflight_;
  Stats stats_;
};

}  // namespace echelon::broadcast
