// Supervised warm-start: a short run of next-token cross-entropy on the task's demonstrations
// (prompt -> reference answer + the first stop id), so that RL starts from a policy that sometimes succeeds
// (GRPO learns nothing from groups with no reward spread). Loss only on the answer tokens.
//
// Thread contract: runs on the calling thread; uses the model exclusively.
#pragma once

#include <cstdint>
#include <functional>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/vocabulary.h"

namespace echelon::learn {

struct WarmstartOptions {
  int64_t steps = 100;
  int64_t batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 0;
};

// Called after each step with (step, loss).
using WarmstartProgress = std::function<void(int64_t, double)>;

// Needs at least one stop id in `vocab`.
Result<double> Warmstart(model::Qwen3Model& model, const model::Vocabulary& vocab, const data::TaskAdapter& task,
                         const WarmstartOptions& options, const WarmstartProgress& progress);

}  // namespace echelon::learn
