// LinkSimulator: a discrete-event Link. Each node has an upload bandwidth shared equally by
// its concurrent sends (processor sharing, as TCP flows behind one `tc tbf` shaper roughly
// behave), or with SetSerialUploads given whole to its oldest started send, the others
// waiting (as a network ChunkSource sends one chunk at a time); downloads are unconstrained. A transfer takes `latency` seconds to start, then
// bytes / share. Time is a SimulatedClock advanced by Run(), so the RelaySession and
// RelayPlanner run unchanged on simulated links, with no sockets and no sleeps.
//
//   SimulatedClock clock;
//   LinkSimulator sim(&clock, ChunkSizes(manifest), /*latency_s=*/0.001);
//   sim.SetUploadBps(kOrigin, 12.5e6);  ... one per node
//   sim.At(3.0, [&] { sim.Kill(4); session.PeerDied(4); });   // fault injection
//   session.Pump();
//   ECHELON_RETURN_IF_ERROR(sim.Run(/*max_seconds=*/1e4));
//
// SimulateBroadcast() wraps the above for one whole scenario.
//
// Thread contract: single-threaded. Start, At and Kill may be called from inside callbacks
// that Run() makes (that is how the session reacts), but not from another thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "echelon/broadcast/link.h"
#include "echelon/broadcast/relay_planner.h"
#include "echelon/broadcast/tunables.h"
#include "echelon/common/clock.h"
#include "echelon/common/status.h"

namespace echelon::broadcast {

class LinkSimulator : public Link {
 public:
  // Decides a delivered transfer's outcome (e.g. by really hashing bytes into a ChunkStore).
  using DeliverFn = std::function<TransferOutcome(const Transfer&)>;

  LinkSimulator(SimulatedClock* clock, std::vector<uint64_t> chunk_bytes, double latency_s);

  void SetUploadBps(NodeId node, double bps);
  void SetDeliver(DeliverFn deliver) { deliver_ = std::move(deliver); }
  // Each node sends one transfer at a time, in the order they were started (after their start
  // latency, which overlaps): net/broadcast_chunk_source.h does this for peer-assisted mode.
  void SetSerialUploads(bool serial) { serial_uploads_ = serial; }
  // Each transfer moves at its sender's rate times a factor drawn uniformly from
  // [1 - jitter, 1 + jitter] (seeded): real flows vary, and the planner's measured rates with them.
  void SetRateJitter(double jitter, uint64_t seed);
  // Runs `action` when simulated time reaches t.
  void At(double t, std::function<void()> action);
  // The node stops: its transfers (both directions) vanish without a callback, as a
  // crashed host's would; later Starts touching it are dropped.
  void Kill(NodeId node);

  void Start(const Transfer& t, DoneFn done) override;
  // Runs until nothing is in flight and nothing is scheduled. Aborted past max_seconds.
  Status Run(double max_seconds);

  uint64_t transfers_delivered() const { return transfers_delivered_; }

 private:
  struct Active {
    Transfer t;
    DoneFn done;
    double wait_left;        // latency still to elapse
    double bytes_left;
    double speed = 1;        // this transfer's share of its sender's rate (SetRateJitter)
  };

  SimulatedClock* const clock_;
  const std::vector<uint64_t> chunk_bytes_;
  const double latency_s_;
  std::vector<double> upload_bps_;  // index = NodeId
  std::set<NodeId> dead_;
  std::vector<Active> active_;
  std::multimap<double, std::function<void()>> scheduled_;
  DeliverFn deliver_;
  bool serial_uploads_ = false;
  double jitter_ = 0;
  std::mt19937_64 rng_;
  uint64_t transfers_delivered_ = 0;
};

struct BroadcastScenario {
  RelayOptions options;
  int peers = 8;
  int chunks = 32;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  double origin_bps = 12.5e6;            // bytes/s (100 Mbit/s)
  std::vector<double> peer_bps;          // per peer; empty = origin_bps for all
  // false: the planner starts every peer at origin_bps and learns peer_bps from transfers (a
  // peer that declares no rate); true: peers declare their true rates.
  bool rates_declared = true;
  double latency_s = 0.0;
  bool serial_uploads = false;           // LinkSimulator::SetSerialUploads
  double rate_jitter = 0;                // LinkSimulator::SetRateJitter
  uint64_t seed = 1;
  bool log_transfers = false;            // fill BroadcastResult::transfers
  std::vector<std::vector<bool>> held;   // per peer initial chunks (delta); empty = none
  std::map<double, std::vector<NodeId>> kills;  // time -> peers that die then
  std::set<NodeId> corrupt_senders;      // every chunk these peers upload fails verification
  std::map<double, int> late_joiners;    // time -> number of peers that join then
};

// One simulated transfer: started by the session, then delivered (or dropped: no `finished`).
struct SimulatedTransfer {
  Transfer transfer;
  double started = 0;
  std::optional<double> finished;
};

struct BroadcastResult {
  std::vector<std::optional<double>> completed_at;  // index = NodeId (0, the origin, unused)
  double last_completion = 0;                      // over peers alive at the end
  uint64_t bytes_moved = 0;
  RelayPlanner::Stats stats;
  std::vector<bool> banned;                        // index = NodeId
  std::vector<int> received;                       // verified chunks delivered, index = NodeId
  bool all_complete = false;
  std::vector<SimulatedTransfer> transfers;        // in start order (log_transfers)
};

// Runs a whole broadcast of `chunks` chunks to `peers` peers on simulated links.
Result<BroadcastResult> SimulateBroadcast(const BroadcastScenario& s);

}  // namespace echelon::broadcast
