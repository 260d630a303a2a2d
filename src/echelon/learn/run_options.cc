#include "echelon/learn/run_options.h"

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

}  // namespace echelon::learn
