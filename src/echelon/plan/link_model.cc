#include "echelon/plan/link_model.h"

#include <algorithm>
#include <cmath>

namespace echelon::plan {

double SnapshotSeconds(const LinkSpec& link, double bytes, double downlink_mbps, int64_t receivers,
                       double relay_uplink_mbps) {
  if (bytes <= 0) return 0;
  const double bits = bytes * 8;
  const double n = std::max<int64_t>(1, receivers);
  if (link.mode == BroadcastMode::kStar) {
    return std::max(bits / (downlink_mbps * 1e6), n * bits / (link.origin_uplink_mbps * 1e6));
  }
  const double f = std::max<int64_t>(1, link.fanout);
  const double rate_mbps = std::min({downlink_mbps, link.origin_uplink_mbps / f, relay_uplink_mbps / f});
  // A fan-out of 1 is a chain: depth n.
  const double depth = f <= 1 ? n : std::ceil(std::log(n + 1) / std::log(f) - 1e-9);
  const double chunk_bits = std::min(bits, link.chunk_mb * 1048576 * 8);
  return (bits + std::max(0.0, depth - 1) * chunk_bits) / (rate_mbps * 1e6);
}

const char* BroadcastModeName(BroadcastMode mode) { return mode == BroadcastMode::kStar ? "star" : "relay"; }

}  // namespace echelon::plan
