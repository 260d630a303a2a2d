#include "echelon/broadcast/link_simulator.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "echelon/broadcast/relay_session.h"

namespace echelon::broadcast {

LinkSimulator::LinkSimulator(SimulatedClock* clock, std::vector<uint64_t> chunk_bytes, double latency_s)
    : clock_(clock), chunk_bytes_(std::move(chunk_bytes)), latency_s_(latency_s) {}

void LinkSimulator::SetUploadBps(NodeId node, double bps) {
  if (node >= static_cast<NodeId>(upload_bps_.size())) upload_bps_.resize(node + 1, 0.0);
  upload_bps_[node] = bps;
}

void LinkSimulator::SetRateJitter(double jitter, uint64_t seed) {
  jitter_ = jitter;
  rng_.seed(seed);
}

void LinkSimulator::At(double t, std::function<void()> action) { scheduled_.emplace(t, std::move(action)); }

void LinkSimulator::Kill(NodeId node) {
  dead_.insert(node);
  active_.erase(std::remove_if(active_.begin(), active_.end(),
                               [&](const Active& a) { return a.t.from == node || a.t.to == node; }),
                active_.end());
}

void LinkSimulator::Start(const Transfer& t, DoneFn done) {
  if (dead_.count(t.from) || dead_.count(t.to)) return;
  if (t.from >= static_cast<NodeId>(upload_bps_.size())) SetUploadBps(t.from, 0.0);
  double speed = 1;
  if (jitter_ > 0) speed = std::uniform_real_distribution<double>(1 - jitter_, 1 + jitter_)(rng_);
  active_.push_back(Active{t, std::move(done), latency_s_, static_cast<double>(chunk_bytes_[t.chunk]), speed});
}

Status LinkSimulator::Run(double max_seconds) {
  const double kInf = std::numeric_limits<double>::infinity();
  std::vector<int> sending;
  std::vector<const Active*> head;  // serial uploads: each node's oldest ready send
  while (!active_.empty() || !scheduled_.empty()) {
    const double now = clock_->Now();
    sending.assign(upload_bps_.size(), 0);
    head.assign(upload_bps_.size(), nullptr);
    for (const Active& a : active_) {  // in start order
      if (a.wait_left > 0) continue;
      sending[a.t.from]++;
      if (head[a.t.from] == nullptr) head[a.t.from] = &a;
    }
    auto rate = [&](const Active& a) {
      if (serial_uploads_) return head[a.t.from] == &a ? upload_bps_[a.t.from] * a.speed : 0.0;
      return upload_bps_[a.t.from] * a.speed / sending[a.t.from];
    };
    double dt = kInf;
    for (const Active& a : active_) {
      double r = a.wait_left > 0 ? 0 : rate(a);
      dt = std::min(dt, a.wait_left > 0 ? a.wait_left : (r > 0 ? a.bytes_left / r : kInf));
    }
    if (!scheduled_.empty()) dt = std::min(dt, std::max(0.0, scheduled_.begin()->first - now));
    if (dt == kInf) return Aborted("link simulator stalled: transfers in flight from a node with no bandwidth");
    if (now + dt > max_seconds) return Aborted("link simulator passed " + std::to_string(max_seconds) + " s");
    for (Active& a : active_) {
      if (a.wait_left > 0) {
        a.wait_left = a.wait_left - dt <= 1e-12 ? 0 : a.wait_left - dt;
      } else {
        a.bytes_left -= rate(a) * dt;
      }
    }
    clock_->Set(now + dt);
    // Finished transfers first, then due actions, each with callbacks made after the state
    // update, because callbacks Start new transfers.
    std::vector<Active> finished;
    for (auto it = active_.begin(); it != active_.end();) {
      if (it->wait_left <= 0 && it->bytes_left <= 1e-6 * chunk_bytes_[it->t.chunk] + 1e-9) {
        finished.push_back(std::move(*it));
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
    for (Active& a : finished) {
      if (dead_.count(a.t.from) || dead_.count(a.t.to)) continue;
      ++transfers_delivered_;
      a.done(a.t, deliver_ ? deliver_(a.t) : TransferOutcome::kVerified);
    }
    while (!scheduled_.empty() && scheduled_.begin()->first <= clock_->Now() + 1e-12) {
      auto action = std::move(scheduled_.begin()->second);
      scheduled_.erase(scheduled_.begin());
      action();
    }
  }
  return Status::Ok();
}

namespace {

// Passes transfers on to the simulator, logging when each started and was delivered.
class LoggingLink : public Link {
 public:
  LoggingLink(Link* inner, const Clock* clock, std::vector<SimulatedTransfer>* log)
      : inner_(inner), clock_(clock), log_(log) {}
  void Start(const Transfer& t, DoneFn done) override {
    const size_t i = log_->size();
    log_->push_back({t, clock_->Now(), std::nullopt});
    inner_->Start(t, [this, i, done = std::move(done)](const Transfer& d, TransferOutcome outcome) {
      (*log_)[i].finished = clock_->Now();
      done(d, outcome);
    });
  }

 private:
  Link* const inner_;
  const Clock* const clock_;
  std::vector<SimulatedTransfer>* const log_;
};

}  // namespace

Result<BroadcastResult> SimulateBroadcast(const BroadcastScenario& s) {
  SimulatedClock clock;
  std::vector<uint64_t> sizes(s.chunks, s.chunk_bytes);
  RelayOptions options = s.options;
  options.start_latency_seconds = s.latency_s;  // the planner knows the links' start latency
  RelayPlanner planner(options, s.chunks, s.origin_bps, static_cast<double>(s.chunk_bytes));
  LinkSimulator sim(&clock, sizes, s.latency_s);
  sim.SetSerialUploads(s.serial_uploads);
  sim.SetRateJitter(s.rate_jitter, s.seed);
  std::vector<SimulatedTransfer> log;
  LoggingLink logging(&sim, &clock, &log);
  RelaySession session(&planner, s.log_transfers ? static_cast<Link*>(&logging) : &sim, &clock, sizes);
  sim.SetUploadBps(kOrigin, s.origin_bps);
  int added = 0;
  auto add_peer = [&](const std::vector<bool>& held) {
    double bps = added < static_cast<int>(s.peer_bps.size()) ? s.peer_bps[added] : s.origin_bps;
    ++added;
    sim.SetUploadBps(planner.num_nodes(), bps);  // the id AddPeer is about to assign
    session.AddPeer(s.rates_declared ? bps : s.origin_bps, held);
  };
  for (int i = 0; i < s.peers; ++i) add_peer(i < static_cast<int>(s.held.size()) ? s.held[i] : std::vector<bool>());
  for (const auto& [t, victims] : s.kills) {
    sim.At(t, [&, victims = victims] {
      for (NodeId v : victims) {
        sim.Kill(v);
        session.PeerDied(v);
      }
    });
  }
  for (const auto& [t, count] : s.late_joiners) {
    sim.At(t, [&, count = count] {
      for (int k = 0; k < count; ++k) add_peer({});
    });
  }
  std::vector<int> received;
  sim.SetDeliver([&](const Transfer& t) {
    if (s.corrupt_senders.count(t.from)) return TransferOutcome::kCorrupt;
    if (t.to >= static_cast<NodeId>(received.size())) received.resize(t.to + 1, 0);
    ++received[t.to];
    return TransferOutcome::kVerified;
  });
  session.Pump();
  ECHELON_RETURN_IF_ERROR(sim.Run(1e7));

  BroadcastResult r;
  r.completed_at.resize(planner.num_nodes());
  r.banned.resize(planner.num_nodes());
  for (NodeId n = 1; n < planner.num_nodes(); ++n) {
    r.completed_at[n] = session.CompletedAt(n);
    r.banned[n] = planner.IsBanned(n);
    if (planner.IsAlive(n) && r.completed_at[n]) r.last_completion = std::max(r.last_completion, *r.completed_at[n]);
  }
  r.received = received;
  r.received.resize(planner.num_nodes(), 0);
  r.bytes_moved = session.bytes_moved();
  r.stats = session.planner_stats();
  r.all_complete = planner.AllComplete();
  r.transfers = std::move(log);
  return r;
}

}  // namespace echelon::broadcast
