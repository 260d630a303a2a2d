#include "echelon/broadcast/relay_session.h"

namespace echelon::broadcast {

std::vector<uint64_t> ChunkSizes(const Manifest& m) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < m.num_chunks(); ++i) out.push_back(m.ChunkSize(i));
  return out;
}

RelaySession::RelaySession(RelayPlanner* planner, Link* link, const Clock* clock, std::vector<uint64_t> chunk_bytes)
    : planner_(planner), link_(link), clock_(clock), chunk_bytes_(std::move(chunk_bytes)) {}

NodeId RelaySession::AddPeer(double upload_bps, const std::vector<bool>& held, bool reachable) {
  NodeId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = planner_->AddPeer(upload_bps, held, reachable);
    joined_at_[id] = clock_->Now();
    NoteCompletionLocked(id);
  }
  Pump();
  return id;
}

void RelaySession::PeerDied(NodeId peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Transfer& t : planner_->RemovePeer(peer)) {
      started_.erase(t.id);
      uploads_[t.from]--;
    }
  }
  Pump();
}

void RelaySession::Pump() {
  std::vector<Transfer> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo = planner_->NextTransfers();
    const double now = clock_->Now();
    for (const Transfer& t : todo) {
      int concurrent = ++uploads_[t.from];
      started_[t.id] = Started{t, now, concurrent};
    }
  }
  for (const Transfer& t : todo) {
    link_->Start(t, [this](const Transfer& done, TransferOutcome outcome) { OnDone(done, outcome); });
  }
}

void RelaySession::OnDone(const Transfer& t, TransferOutcome outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = started_.find(t.id);
    if (it == started_.end()) return;  // cancelled when an endpoint died
    const Started s = it->second;
    started_.erase(it);
    uploads_[t.from]--;
    // The slower copy of an endgame pair finds the chunk held already (it may not even have
    // moved, if the receiver checked first): it says nothing about the sender's rate.
    if (outcome == TransferOutcome::kVerified && !planner_->Holds(t.to, t.chunk)) {
      const uint64_t bytes = chunk_bytes_[t.chunk];
      bytes_moved_ += bytes;
      const double seconds = clock_->Now() - s.at;
      // Concurrent sends share the uplink, so one transfer's rate understates it.
      if (seconds > 0) planner_->UpdateBandwidth(t.from, bytes / seconds * s.concurrent);
    }
    planner_->OnTransferDone(t.id, outcome);
    NoteCompletionLocked(t.to);
  }
  Pump();
}

int RelaySession::ExpireOverdue(double max_seconds) {
  std::vector<Transfer> overdue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now = clock_->Now();
    for (const auto& [id, s] : started_)
      if (now - s.at > max_seconds) overdue.push_back(s.transfer);
  }
  for (const Transfer& t : overdue) OnDone(t, TransferOutcome::kFailed);
  return static_cast<int>(overdue.size());
}

void RelaySession::NoteCompletionLocked(NodeId n) {
  if (planner_->IsAlive(n) && planner_->IsComplete(n) && !completed_at_.count(n)) completed_at_[n] = clock_->Now();
}

bool RelaySession::AllComplete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return planner_->AllComplete();
}

std::optional<double> RelaySession::CompletedAt(NodeId peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = completed_at_.find(peer);
  if (it == completed_at_.end()) return std::nullopt;
  return it->second;
}

std::optional<double> RelaySession::JoinedAt(NodeId peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = joined_at_.find(peer);
  if (it == joined_at_.end()) return std::nullopt;
  return it->second;
}

bool RelaySession::IsBanned(NodeId node) const {
  std::lock_guard<std::mutex> lock(mu_);
  return node >= 0 && node < planner_->num_nodes() && planner_->IsBanned(node);
}

uint64_t RelaySession::bytes_moved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_moved_;
}

RelayPlanner::Stats RelaySession::planner_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return planner_->stats();
}

}  // namespace echelon::broadcast
