// Router replay (rl.router_replay): the experts a mixture-of-experts policy chose at some of a
// sequence's positions, one entry per (position, layer): the position in prompt + completion,
// the decoder's layer number (a sparse one), and the layer's k experts in the order chosen.
// An actor keeps the entries whose top-k margin was below rl.router_replay_margin; the learner
// trains those positions with the same experts (model::RouteTape) and recomputes the rest.
//
//   const int64_t chosen[] = {5, 1};
//   Routes r;  r.Add(17, 3, chosen, 2);  // position 17, layer 3, experts 5 and 1 (k = 2)
//
// Thread contract: a value type.
#pragma once

#include <cstdint>
#include <vector>

namespace echelon {

struct Routes {
  std::vector<int32_t> positions;
  std::vector<int16_t> layers;
  std::vector<int16_t> experts;  // k per entry

  size_t size() const { return positions.size(); }
  bool empty() const { return positions.empty(); }
  // Experts per entry (0 when empty).
  size_t k() const { return positions.empty() ? 0 : experts.size() / positions.size(); }
  void Add(int32_t position, int16_t layer, const int64_t* chosen, size_t k) {
    positions.push_back(position);
    layers.push_back(layer);
    for (size_t i = 0; i < k; ++i) experts.push_back(static_cast<int16_t>(chosen[i]));
  }
  bool operator==(const Routes& o) const {
    return positions == o.positions && layers == o.layers && experts == o.experts;
  }
};

}  // namespace echelon
