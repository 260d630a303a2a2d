#include "echelon/learn/run_options.h"

#include <algorithm>

namespace echelon::learn {

model::SamplingParams RolloutSampling(const RunOptions& options) {
  model::SamplingParams sp;
  sp.temperature = options.temperature;
  sp.top_p = options.top_p;
  sp.top_k = options.top_k;
  sp.min_p = options.min_p;
  sp.max_new_tokens = options.max_new_tokens;
  sp.slots = options.slots;
  return sp;
}

int64_t LargestStaleness(const RunOptions& options) {
  return options.staleness_control ? std::max(options.staleness_control->max, options.staleness) : options.staleness;
}

}  // namespace echelon::learn
