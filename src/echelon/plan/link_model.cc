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
  const double capacity = std::max({bits / (downlink_mbps * 1e6), bits / (link.origin_uplink_mbps * 1e6),
                                     n * bits / ((link.origin_uplink_mbps + n * relay_uplink_mbps) * 1e6)});
  // The capacity term already holds the first chunk time; each further doubling adds one, at
  // the slowest of the links a chunk crosses (receivers that cannot upload: the origin's).
  const double hops = std::ceil(std::log2(n + 1) - 1e-9) - 1;
  if (hops <= 0) return capacity;
  const double relay_mbps = relay_uplink_mbps > 0 ? relay_uplink_mbps : link.origin_uplink_mbps;
  const double chunk_bits = std::min(bits, link.chunk_mb * 1048576 * 8);
  return capacity + hops * chunk_bits / (std::min({downlink_mbps, link.origin_uplink_mbps, relay_mbps}) * 1e6);
}

const char* BroadcastModeName(BroadcastMode mode) { return mode == BroadcastMode::kStar ? "star" : "relay"; }

}  // namespace echelon::plan
