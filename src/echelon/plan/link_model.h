// Link model: how long a snapshot of M bytes takes to reach a worker, for the planner and
// the simulator alike (one formula, so they agree). A closed form of the two broadcast shapes;
// the relay formula is checked against the broadcast/ relay policy itself on simulated links
// (LinkModelAgainstRelayPolicy in broadcast_sim_test.cc).
//
//   star  (learner sends to every worker, sharing its uplink U):
//           T_i = max(M / d_i, n * M / U)
//   relay (the swarm of broadcast/relay_planner.h: every holder uploads what it holds, chunk
//          size c, receivers' mean uplink u):
//           T_i = max(M / d_i, M / U, n * M / (U + n * u))  +  (ceil(log2(n + 1)) - 1) * c / min(d_i, U, u)
// d_i is the worker's downlink. The first term is the capacity bound: the worker's own
// downlink, the origin sending every byte once, and all uploaders together carrying n copies.
// The second is the pipeline: a chunk is forwarded as soon as it is verified, and the holders of
// the last chunk double every chunk time (one chunk time is in the first term already; with one
// chunk this is the binomial tree's ceil(log2(n + 1)) chunk times). So the relay time is nearly flat in n (one transfer
// plus log2(n) chunk times), while the star grows linearly in n.
//
//   LinkSpec link{.mode = BroadcastMode::kRelay, .origin_uplink_mbps = 10000};
//   double t = SnapshotSeconds(link, bytes, /*downlink=*/1000, /*receivers=*/64, /*relay_up=*/500);
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace echelon::plan {

enum class BroadcastMode { kStar, kRelay };

struct LinkSpec {
  BroadcastMode mode = BroadcastMode::kRelay;
  double origin_uplink_mbps = 10000;  // learner's uplink (U)
  double chunk_mb = 4;                // c: the broadcast's chunk size (broadcast/tunables.h: 4 MiB)
};

// Seconds for one receiver with `downlink_mbps` among `receivers`; relay_uplink_mbps is the
// mean uplink of the receivers acting as relays. Zero bytes take zero seconds.
double SnapshotSeconds(const LinkSpec& link, double bytes, double downlink_mbps, int64_t receivers,
                       double relay_uplink_mbps);

const char* BroadcastModeName(BroadcastMode mode);

}  // namespace echelon::plan
