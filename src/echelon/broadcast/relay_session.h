// RelaySession: runs a RelayPlanner (policy) over a Link (mechanism) for one version. It
// starts what the planner plans, feeds outcomes back, measures each uploader's rate from
// verified transfers (bytes / seconds on the injected Clock) and records when each peer
// first held every chunk.
//
//   RelayPlanner planner(opts, m.num_chunks(), origin_bps);
//   RelaySession session(&planner, &link, &clock, ChunkSizes(m));
//   NodeId p = session.AddPeer(advertised_bps, held_mask);   // also for late joiners
//   session.Pump();                                          // starts the first transfers
//   ... session.PeerDied(p);                                 // from the failure detector
//   if (session.AllComplete()) ...
//
// Thread contract: thread-safe. mu_ guards the planner and all bookkeeping; Link::Start is
// called with mu_ released, so a Link may complete transfers on its own threads (or, like
// the simulator, on the thread that runs its event loop) and call back into the session.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "echelon/broadcast/link.h"
#include "echelon/broadcast/manifest.h"
#include "echelon/broadcast/relay_planner.h"
#include "echelon/common/clock.h"

namespace echelon::broadcast {

// Bytes of each chunk of a manifest, in index order.
std::vector<uint64_t> ChunkSizes(const Manifest& m);

class RelaySession {
 public:
  RelaySession(RelayPlanner* planner, Link* link, const Clock* clock, std::vector<uint64_t> chunk_bytes);
  RelaySession(const RelaySession&) = delete;
  RelaySession& operator=(const RelaySession&) = delete;

  NodeId AddPeer(double upload_bps, const std::vector<bool>& held = {}, bool reachable = true);  // pumps
  void PeerDied(NodeId peer);                                             // pumps
  void Pump();
  // Transfers started more than `max_seconds` ago end as failed (a receiver that never reports,
  // or never reads, must not hold a sender's upload slot); returns how many. Pumps.
  int ExpireOverdue(double max_seconds);

  bool AllComplete() const;
  // Seconds (Clock time) at which `peer` first held every chunk; nullopt if it never did.
  std::optional<double> CompletedAt(NodeId peer) const;
  std::optional<double> JoinedAt(NodeId peer) const;
  bool IsBanned(NodeId node) const;  // served a corrupt chunk (RelayOptions::ban_after_corrupt)
  uint64_t bytes_moved() const;  // payload bytes of verified transfers
  RelayPlanner::Stats planner_stats() const;

 private:
  void OnDone(const Transfer& t, TransferOutcome outcome);
  void NoteCompletionLocked(NodeId n);  // requires mu_

  RelayPlanner* const planner_;
  Link* const link_;
  const Clock* const clock_;
  const std::vector<uint64_t> chunk_bytes_;

  mutable std::mutex mu_;  // guards planner_ calls and everything below
  struct Started {
    Transfer transfer;
    double at;
    int concurrent;  // uploads the sender had in flight, this one included
  };
  std::unordered_map<uint64_t, Started> started_;
  std::unordered_map<NodeId, int> uploads_;
  std::unordered_map<NodeId, double> joined_at_;
  std::unordered_map<NodeId, double> completed_at_;
  uint64_t bytes_moved_ = 0;
};

}  // namespace echelon::broadcast
