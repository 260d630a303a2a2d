// Link model: how long a snapshot of M bytes takes to reach a worker, for the planner and
// the simulator alike (one formula, so they agree). This is a latency model of the two
// broadcast shapes, not the broadcast/ relay policy itself.
//
//   star  (learner sends to every worker, sharing its uplink U):
//           T_i = max(M / d_i, n * M / U)
//   relay (pipelined peer relay, chunk size c, fan-out f, relays' mean uplink u):
//           rate_i = min(d_i, U / f, u / f),  depth = ceil(log_f(n + 1))
//           T_i = (M + (depth - 1) * c) / rate_i
// d_i is the worker's downlink. In the relay shape every chunk is forwarded as soon as it
// arrives, so depth adds one chunk time per hop instead of a whole model time; the time is
// nearly flat in n, while the star grows linearly in n.
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
  int64_t fanout = 2;                 // f: peers each holder forwards to
  double chunk_mb = 4;                // c: the design's 4 MiB chunks
};

// Seconds for one receiver with `downlink_mbps` among `receivers`; relay_uplink_mbps is the
// mean uplink of the receivers acting as relays. Zero bytes take zero seconds.
double SnapshotSeconds(const LinkSpec& link, double bytes, double downlink_mbps, int64_t receivers,
                       double relay_uplink_mbps);

const char* BroadcastModeName(BroadcastMode mode);

}  // namespace echelon::plan
