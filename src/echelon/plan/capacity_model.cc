#include "echelon/plan/capacity_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <utility>

namespace echelon::plan {
namespace {

// ceil() that ignores floating-point dust: 2.0000000001 steps is 2 steps.
int64_t CeilSteps(double x) { return static_cast<int64_t>(std::ceil(x - 1e-9)); }

double MeanRelayUplink(const std::vector<WorkerClass>& classes, int64_t* receivers) {
  double up = 0;
  *receivers = 0;
  for (const WorkerClass& c : classes) {
    up += c.count * c.uplink_mbps;
    *receivers += c.count;
  }
  return *receivers > 0 ? up / *receivers : 0;
}

// Lock-step generation of one batch: every slot starts when its worker holds the snapshot,
// and each free slot takes the next group (the order the simulator's dispatch follows).
double LockStepGenerateSeconds(const CapacityInputs& in, const std::vector<WorkerClass>& classes, int64_t receivers,
                               double relay_up) {
  using Slot = std::pair<double, int64_t>;  // (free at, slot index): ties go to the lower index
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> free;
  std::vector<double> gen;
  for (const WorkerClass& c : classes) {
    if (!c.decode.feasible) continue;
    const double bcast = ClassSnapshotSeconds(in, c, receivers, relay_up);
    for (int64_t i = 0; i < c.count * c.decode.slots; ++i) {
      free.push({bcast, static_cast<int64_t>(gen.size())});
      gen.push_back(c.decode.group_seconds);
    }
  }
  if (free.empty()) return INFINITY;
  double makespan = 0;
  for (int64_t g = 0; g < in.groups_per_step; ++g) {
    Slot s = free.top();
    free.pop();
    const double done = s.first + gen[s.second];
    makespan = std::max(makespan, done);
    free.push({done, s.second});
  }
  return makespan;
}

}  // namespace

double Availability(const WorkerClass& c, double snapshot_seconds, double rejoin_seconds) {
  const double f = c.failures_per_hour / 3600;
  const double lost_work = std::max(0.0, 1 - f * c.decode.group_seconds / 2);
  return lost_work / (1 + f * (rejoin_seconds + snapshot_seconds));
}

double ClassSnapshotSeconds(const CapacityInputs& in, const WorkerClass& c, int64_t receivers, double relay_up) {
  return SnapshotSeconds(in.link, in.snapshot_bytes, c.downlink_mbps, receivers, relay_up);
}

int64_t ClassMinArrivalStaleness(double step_seconds, double bcast_seconds, double group_seconds) {
  return static_cast<int64_t>(std::floor((bcast_seconds + group_seconds) / step_seconds + 1e-9));
}

int64_t MaxFreshPublishPeriod(int64_t max_staleness, double step_seconds, double bcast_seconds,
                              double max_group_seconds) {
  const int64_t kappa = max_staleness + 1 - CeilSteps(bcast_seconds / step_seconds) -
                        CeilSteps(max_group_seconds / step_seconds) - kQueueAllowanceSteps;
  return std::max<int64_t>(0, std::min(kappa, max_staleness + 1));
}

CapacityPrediction PredictCapacity(const CapacityInputs& in, const std::vector<WorkerClass>& classes) {
  CapacityPrediction p;
  int64_t receivers = 0;
  const double relay_up = MeanRelayUplink(classes, &receivers);
  double supply = 0;
  for (const WorkerClass& c : classes) {
    p.workers_cost_per_hour += c.count * c.price_per_hour;
    if (!c.decode.feasible || c.count == 0) continue;
    const double bcast = ClassSnapshotSeconds(in, c, receivers, relay_up);
    p.bcast_seconds = std::max(p.bcast_seconds, bcast);
    p.max_group_seconds = std::max(p.max_group_seconds, c.decode.group_seconds);
    p.slots += c.count * c.decode.slots;
    supply += c.count * Availability(c, bcast, in.rejoin_seconds) * c.decode.slots / c.decode.group_seconds;
  }
  p.demand_groups_per_s = in.groups_per_step / in.train_seconds;
  if (in.max_staleness == 0) {
    p.supply_groups_per_s = supply;
    p.step_seconds =
        in.train_seconds + std::max(in.overhead_seconds, LockStepGenerateSeconds(in, classes, receivers, relay_up));
    p.fresh = true;
  } else {
    const double window = static_cast<double>(in.max_staleness * in.groups_per_step);
    p.window_limited = window < p.slots;
    p.supply_groups_per_s = supply * (p.window_limited ? window / p.slots : 1.0);
    p.step_seconds = std::max(in.train_seconds + in.overhead_seconds, in.groups_per_step / p.supply_groups_per_s);
    p.lag_versions = (in.publish_period - 1) + CeilSteps(p.bcast_seconds / p.step_seconds);
    p.staleness_bound = p.lag_versions + CeilSteps(p.max_group_seconds / p.step_seconds) + kQueueAllowanceSteps;
    p.fresh = p.staleness_bound <= in.max_staleness;
  }
  p.utilization = std::isfinite(p.step_seconds) ? in.train_seconds / p.step_seconds : 0;
  p.cost_per_hour = p.workers_cost_per_hour + in.learner_price_per_hour;
  p.cost_per_step = p.step_seconds * p.cost_per_hour / 3600;
  return p;
}

BaselinePrediction PredictBaseline(double train_seconds, double generate_seconds, double price_per_hour) {
  BaselinePrediction b;
  b.train_seconds = train_seconds;
  b.generate_seconds = generate_seconds;
  b.step_seconds = train_seconds + generate_seconds;
  b.price_per_hour = price_per_hour;
  b.cost_per_step = b.step_seconds * price_per_hour / 3600;
  return b;
}

double BaselineGenerateSeconds(const GpuSpec& gpu, int64_t count, const ModelProfile& model,
                               const RolloutShape& shape, int64_t groups_per_step) {
  const DecodeEstimate d = EstimateDecode(gpu, model, shape);
  if (!d.feasible) return INFINITY;
  const int64_t rollouts = groups_per_step * shape.group_size;
  const int64_t per_gpu = (rollouts + count - 1) / count;
  const int64_t full_waves = per_gpu / d.batch;
  const int64_t last = per_gpu - full_waves * d.batch;
  double seconds = full_waves * shape.completion_tokens * d.iter_seconds;
  if (last > 0) seconds += shape.completion_tokens * DecodeIterSeconds(gpu, model, shape, last);
  return seconds;
}

}  // namespace echelon::plan
