#include "echelon/broadcast/relay_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace echelon::broadcast {

RelayPlanner::RelayPlanner(const RelayOptions& options, int num_chunks, double origin_upload_bps,
                           double mean_chunk_bytes)
    : options_(options),
      num_chunks_(num_chunks),
      mean_chunk_bytes_(std::max(mean_chunk_bytes, 1.0)),
      // 4 MiB of transfers (at least one, at most max_transfers_per_slot): at the default 1 s a
      // 10 Mbit/s peer is slow in 1 MiB chunks, a 100 Mbit/s one is not, and on loopback nobody is.
      slow_batch_bytes_(std::max(mean_chunk_bytes_,
                                 std::min<double>(kDefaultChunkBytes,
                                                  std::max(1, options.max_transfers_per_slot) * mean_chunk_bytes_))),
      copies_(num_chunks, 0) {
  Node origin;
  origin.bps = origin_upload_bps;
  origin.declared_bps = origin_upload_bps;
  origin.held.assign(num_chunks, true);
  origin.incoming.assign(num_chunks, 0);
  origin.held_count = num_chunks;
  nodes_.push_back(std::move(origin));
}

NodeId RelayPlanner::AddPeer(double upload_bps, const std::vector<bool>& held, bool reachable) {
  Node peer;
  peer.bps = upload_bps;
  peer.declared_bps = upload_bps;
  peer.reachable = reachable;
  peer.held.assign(num_chunks_, false);
  peer.incoming.assign(num_chunks_, 0);
  for (int c = 0; c < num_chunks_ && c < static_cast<int>(held.size()); ++c) {
    if (!held[c]) continue;
    peer.held[c] = true;
    ++peer.held_count;
    ++copies_[c];
  }
  nodes_.push_back(std::move(peer));
  ++live_peers_;
  MarkAllDirty();  // everyone may have something for the newcomer
  return static_cast<NodeId>(nodes_.size() - 1);
}

std::vector<Transfer> RelayPlanner::RemovePeer(NodeId peer) {
  std::vector<Transfer> cancelled;
  if (peer == kOrigin || peer >= num_nodes() || !nodes_[peer].alive) return cancelled;
  for (auto it = inflight_.begin(); it != inflight_.end();) {
    if (it->second.from == peer || it->second.to == peer) {
      cancelled.push_back(it->second);
      Forget(it->second);
      it = inflight_.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(cancelled.begin(), cancelled.end(), [](const Transfer& a, const Transfer& b) { return a.id < b.id; });
  stats_.cancelled += cancelled.size();
  Node& n = nodes_[peer];
  for (int c = 0; c < num_chunks_; ++c) copies_[c] -= n.held[c] ? 1 : 0;
  n.alive = false;
  --live_peers_;
  MarkAllDirty();  // chunks it was relaying are needed again
  return cancelled;
}

void RelayPlanner::UpdateBandwidth(NodeId node, double measured_bps) {
  if (node < 0 || node >= num_nodes() || !(measured_bps > 0)) return;
  Node& n = nodes_[node];
  const int slots_before = UploadSlots(node);
  const int inbound_before = MaxInbound(node);
  const double a = n.measured ? options_.bandwidth_ewma_alpha : 1.0;
  n.bps = (1 - a) * n.bps + a * measured_bps;
  n.measured = true;
  // The rate sizes its slots (the first measurement may open its second) and its inbound places.
  if (UploadSlots(node) > slots_before) n.dirty = true;
  if (MaxInbound(node) > inbound_before) MarkAllDirty();
}

bool RelayPlanner::AllComplete() const {
  for (NodeId n = 1; n < num_nodes(); ++n) {
    if (nodes_[n].alive && !IsComplete(n)) return false;
  }
  return true;
}

void RelayPlanner::MarkReported(NodeId sender, NodeId receiver) {
  std::vector<bool>& r = nodes_[sender].reported;
  if (r.size() <= static_cast<size_t>(receiver)) r.resize(receiver + 1, false);
  r[receiver] = true;
}

bool RelayPlanner::Reported(NodeId sender, NodeId receiver) const {
  const std::vector<bool>& r = nodes_[sender].reported;
  return static_cast<size_t>(receiver) < r.size() && r[receiver];
}

int RelayPlanner::UploadSlots(NodeId n) const {
  if (options_.mode == RelayMode::kStar) return n == kOrigin ? std::max(1, live_peers_) : 0;
  // A slow sender, and a peer not yet measured (it may be slow), send one transfer at a time: a
  // second would wait a whole slow transfer time in its queue, holding that receiver's copy.
  if ((n != kOrigin && !nodes_[n].measured) || IsSlowSender(n)) return 1;
  return std::max(1, options_.upload_slots) * transfers_per_slot(n);
}

int RelayPlanner::InFlight(NodeId n) const {
  // One transfer sending and enough queued behind it to cover the next one's start, at the
  // rate declared or a faster one measured: a rate measured while the queue was too short
  // includes the idle starts, and would keep the queue short.
  const double bps = std::max({nodes_[n].bps, nodes_[n].declared_bps, 1.0});
  const double extra = std::ceil(std::max(0.0, options_.start_latency_seconds) * bps / mean_chunk_bytes_);
  return static_cast<int>(std::min(extra, 1e6)) + 1;
}

int RelayPlanner::transfers_per_slot(NodeId n) const {
  const int slots = std::max(1, options_.upload_slots);
  return std::clamp((InFlight(n) + slots - 1) / slots, 1, std::max(1, options_.max_transfers_per_slot));
}

bool RelayPlanner::IsSlowSender(NodeId n) const {
  return slow_batch_bytes_ / std::max(nodes_[n].bps, 1.0) > options_.multi_slot_max_chunk_seconds;
}

int RelayPlanner::MaxInbound(NodeId n) const { return std::max(1, options_.max_inbound) * transfers_per_slot(n); }

bool RelayPlanner::CanUpload(NodeId n) const {
  const Node& node = nodes_[n];
  return node.alive && node.reachable && !node.banned && node.held_count > 0 && node.uploads < UploadSlots(n);
}

int RelayPlanner::BandwidthBucket(NodeId n) const {
  double bps = std::max(nodes_[n].bps, 1.0);
  return static_cast<int>(std::floor(std::log(bps) / std::log(std::max(options_.bandwidth_bucket_ratio, 1.0001))));
}

NodeId RelayPlanner::BestReceiver(NodeId u, int chunk) const {
  NodeId best = -1;
  // A peer sends to receivers no faster than itself first: a fast receiver's chunk from a slow
  // sender would be its last to arrive, while fast senders can serve it (the origin, the only
  // source of unsent chunks, feeds the fastest relays whatever its own rate).
  const int ub = u == kOrigin ? std::numeric_limits<int>::max() : BandwidthBucket(u);
  std::tuple<int, bool, bool, int, int, NodeId> best_key;
  for (NodeId r = 1; r < num_nodes(); ++r) {
    const Node& n = nodes_[r];
    if (r == u || !n.alive || n.held[chunk] || n.incoming[chunk] || n.incoming_count >= MaxInbound(r)) continue;
    if (Reported(u, r)) continue;  // r found u's chunks corrupt before
    // Peers that can relay the chunk onward first; among them the fastest uploader.
    const int rb = BandwidthBucket(r);
    auto key = std::make_tuple(n.incoming_count, ub < rb, !n.reachable, -rb, n.held_count + n.incoming_count, r);
    if (best < 0 || key < best_key) {
      best = r;
      best_key = key;
    }
  }
  return best;
}

bool RelayPlanner::PickSwarm(NodeId u, int* chunk, NodeId* receiver) const {
  const Node& node = nodes_[u];
  std::vector<int> offer;
  for (int c = 0; c < num_chunks_; ++c) {
    // copies_ counts u itself when u is a peer; a chunk every live peer has is no offer.
    if (node.held[c] && copies_[c] < live_peers_) offer.push_back(c);
  }
  std::stable_sort(offer.begin(), offer.end(), [&](int a, int b) { return copies_[a] < copies_[b]; });
  for (int c : offer) {
    NodeId r = BestReceiver(u, c);
    if (r >= 0) {
      *chunk = c;
      *receiver = r;
      return true;
    }
  }
  return false;
}

bool RelayPlanner::PickStar(NodeId u, int* chunk, NodeId* receiver) const {
  if (u != kOrigin) return false;
  for (NodeId r = 1; r < num_nodes(); ++r) {
    const Node& n = nodes_[r];
    if (!n.alive || n.incoming_count > 0 || n.held_count == num_chunks_) continue;
    for (int c = 0; c < num_chunks_; ++c) {
      if (!n.held[c]) {
        *chunk = c;
        *receiver = r;
        return true;
      }
    }
  }
  return false;
}

bool RelayPlanner::PickEndgame(NodeId u, int* chunk, NodeId* receiver) const {
  if (options_.endgame_ratio <= 0) return false;
  const Node& node = nodes_[u];
  const Transfer* best = nullptr;
  for (const auto& [id, t] : inflight_) {
    const Node& to = nodes_[t.to];
    if (t.to == u || t.from == u || !node.held[t.chunk] || to.held[t.chunk] || to.incoming[t.chunk] != 1) continue;
    if (to.incoming_count >= MaxInbound(t.to) || Reported(u, t.to)) continue;
    if (node.bps < options_.endgame_ratio * nodes_[t.from].bps || !IsSlowSender(t.from)) continue;
    // The slowest sender's transfer first (it has the longest way to go), then the oldest.
    if (best == nullptr || nodes_[t.from].bps < nodes_[best->from].bps ||
        (nodes_[t.from].bps == nodes_[best->from].bps && t.id < best->id)) {
      best = &t;
    }
  }
  if (best == nullptr) return false;
  *chunk = best->chunk;
  *receiver = best->to;
  return true;
}

std::vector<Transfer> RelayPlanner::NextTransfers() {
  std::vector<NodeId> uploaders;
  for (NodeId n = 0; n < num_nodes(); ++n) {
    if (nodes_[n].dirty && CanUpload(n)) uploaders.push_back(n);
    nodes_[n].dirty = false;
  }
  // Faster uploaders choose first: they finish sooner and relay sooner.
  std::stable_sort(uploaders.begin(), uploaders.end(),
                   [&](NodeId a, NodeId b) { return BandwidthBucket(a) > BandwidthBucket(b); });
  std::vector<Transfer> out;
  for (NodeId u : uploaders) {
    while (CanUpload(u)) {
      int c = 0;
      NodeId r = -1;
      bool endgame = false;
      bool found = options_.mode == RelayMode::kStar ? PickStar(u, &c, &r) : PickSwarm(u, &c, &r);
      if (!found && options_.mode == RelayMode::kSwarm) found = endgame = PickEndgame(u, &c, &r);
      if (!found) break;
      Transfer t{next_id_++, u, r, c};
      nodes_[u].uploads++;
      nodes_[r].incoming[c]++;
      if (endgame) stats_.endgame++;
      nodes_[r].incoming_count++;
      copies_[c]++;
      inflight_.emplace(t.id, t);
      stats_.started++;
      if (u == kOrigin) stats_.origin_sends++;
      out.push_back(t);
    }
  }
  return out;
}

void RelayPlanner::Forget(const Transfer& t) {
  Node& from = nodes_[t.from];
  Node& to = nodes_[t.to];
  from.uploads--;
  from.dirty = true;
  if (to.incoming_count >= MaxInbound(t.to)) MarkAllDirty();  // a capped receiver opens up
  to.incoming[t.chunk]--;
  to.incoming_count--;
  copies_[t.chunk]--;
}

void RelayPlanner::OnTransferDone(uint64_t transfer_id, TransferOutcome outcome) {
  auto it = inflight_.find(transfer_id);
  if (it == inflight_.end()) return;
  const Transfer t = it->second;
  inflight_.erase(it);
  Forget(t);
  Node& to = nodes_[t.to];
  switch (outcome) {
    case TransferOutcome::kVerified:
      stats_.verified++;
      if (!to.held[t.chunk]) {
        to.held[t.chunk] = true;
        to.held_count++;
        copies_[t.chunk]++;  // Forget removed the in-flight count
      }
      to.dirty = true;  // it can relay the new chunk
      break;
    case TransferOutcome::kCorrupt: {
      stats_.corrupt++;
      Node& from = nodes_[t.from];
      // The origin's chunks are the learner's own: a report against it is the receiver's fault.
      if (t.from != kOrigin && !Reported(t.from, t.to)) {
        MarkReported(t.from, t.to);
        from.strikes++;
        if (from.strikes >= options_.ban_after_corrupt) from.banned = true;
      }
      MarkAllDirty();  // the chunk must come from someone else
      break;
    }
    case TransferOutcome::kFailed:
      stats_.failed++;
      // The receiver could not fetch from this sender (it is unreachable from there, or the
      // receiver says so): that receiver takes nothing more from it, without a strike, so a
      // receiver's report costs only its own choice of senders.
      if (t.from != kOrigin) MarkReported(t.from, t.to);
      MarkAllDirty();
      break;
  }
}

void RelayPlanner::MarkAllDirty() {
  for (Node& n : nodes_) n.dirty = true;
}

}  // namespace echelon::broadcast
