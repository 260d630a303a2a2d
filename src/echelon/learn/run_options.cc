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
  sp.route_margin = options.learner.router_replay ? options.router_replay_margin : 0.0;
  return sp;
}

int64_t LargestStaleness(const RunOptions& options) {
  return options.staleness_control ? std::max(options.staleness_control->max, options.staleness) : options.staleness;
}

VerifyOptions VerifierOptions(const RunOptions& options, const RunSecret& secret, bool task_draws,
                              const std::string& spill_dir) {
  VerifyOptions v;
  v.fraction = options.verify_fraction;
  v.tolerance = options.verify_tolerance;
  v.token_tolerance = options.verify_token_tolerance;
  v.window = LargestStaleness(options);
  v.sampling = RolloutSampling(options);
  v.secret = secret;
  v.draws = options.verify_draws && task_draws;
  v.turn_draws = options.verify_draws;
  v.draw_tolerance = options.verify_draw_tolerance;
  v.spill_dir = spill_dir;
  v.memory_bytes = options.verify_memory_mb << 20;
  v.route_trust = options.learner.router_replay_trust;
  return v;
}

}  // namespace echelon::learn
