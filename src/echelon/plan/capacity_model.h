// Capacity model: the closed-form steady state of an asynchronous run (docs/CAPACITY.md
// derives every formula here; the simulator checks them).
//
// Per learner update the learner needs B groups of G rollouts of L tokens. Worker class j
// runs n_j instances, each with s_j groups at once, T_gen_j seconds per group, so it
// supplies r_j = a_j * s_j / T_gen_j groups/s, a_j its availability under failures.
//   supply          X = sum_j n_j r_j                       (groups/s)
//   window          at most S*B groups run while the learner trains (AReaL's gate), so
//                   X_eff = X * min(1, S*B / sum_j n_j s_j)
//   step time       S >= 1:  T_step = max(T_train + T_over, B / X_eff)
//                   S  = 0:  T_step = T_train + max(T_over, broadcast + generation of one
//                            batch), i.e. lock-step, the batch list-scheduled over the slots
//                   T_over: learner time per update outside training (snapshot
//                   serialisation, metrics, evaluation); workers keep generating meanwhile
//   utilisation     U = T_train / T_step
//   provisioning    U >= u*  <=>  X_eff >= u* B / T_train
//   freshness       lag = (kappa - 1) + ceil(T_bcast / T_step)   versions behind at start
//                   staleness_bound = lag + ceil(max_j T_gen_j / T_step) + q <= S
//                   per class, the least staleness on arrival: floor((T_bcast_j + T_gen_j) /
//                   T_step) (ClassMinArrivalStaleness); over S every group of the class is
//                   too stale to use when it arrives
//                   q = kQueueAllowanceSteps: near full utilisation finished groups queue
//                   for the learner (bursty arrivals), adding whole steps of waiting
//   cost            cost_per_step = T_step * (P_learner + sum_j n_j p_j) / 3600
//
//   CapacityInputs in = ...;  std::vector<WorkerClass> classes = ...;
//   CapacityPrediction p = PredictCapacity(in, classes);   // p.utilization, p.cost_per_step
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/plan/link_model.h"
#include "echelon/plan/throughput_model.h"

namespace echelon::plan {

// Steps a finished group may wait in the learner's buffer. Empirical, from the simulator: at
// utilisation 0.6-0.95 with generation-time cv 0-0.2 the buffer held up to ~2 batches;
// without it the bound was optimistic and ~10% of groups arrived too stale.
inline constexpr int64_t kQueueAllowanceSteps = 2;

struct WorkerClass {
  std::string name;
  std::string gpu;
  int64_t available = 0;
  int64_t count = 0;            // active instances
  double price_per_hour = 0;    // per instance
  DecodeEstimate decode;        // slots, group_seconds, tokens_per_s
  double downlink_mbps = 1000;
  double uplink_mbps = 500;
  double failures_per_hour = 0;
  double preemption_notice_seconds = 0;  // simulator only (WorkerOfferConfig)
};

struct CapacityInputs {
  RolloutShape shape;
  int64_t groups_per_step = 1;     // B
  double train_seconds = 1;        // T_train
  double overhead_seconds = 0;     // T_over: learner time per update outside training
  double learner_price_per_hour = 0;
  int64_t max_staleness = 1;       // S
  int64_t publish_period = 1;      // kappa
  double snapshot_bytes = 0;       // M
  LinkSpec link;
  double rejoin_seconds = 0;       // restart + startup of a failed worker, before its download
};

struct CapacityPrediction {
  double step_seconds = 0;
  double utilization = 0;
  double supply_groups_per_s = 0;   // X_eff
  double demand_groups_per_s = 0;   // B / T_train: what keeps the learner fully busy
  int64_t slots = 0;                // sum n_j s_j
  bool window_limited = false;      // S*B < slots
  double bcast_seconds = 0;         // slowest active receiver
  double max_group_seconds = 0;
  int64_t lag_versions = 0;
  int64_t staleness_bound = 0;
  bool fresh = true;                // staleness_bound <= S (S = 0: lock-step, always)
  double workers_cost_per_hour = 0;
  double cost_per_hour = 0;
  double cost_per_step = 0;
};

// Share of time a worker of this class produces useful groups under failures at rate f:
// each failure costs half a group on average plus the rejoin and a full snapshot download.
double Availability(const WorkerClass& c, double snapshot_seconds, double rejoin_seconds);
// Snapshot seconds for this class when `receivers` workers with mean uplink `relay_up` listen.
double ClassSnapshotSeconds(const CapacityInputs& in, const WorkerClass& c, int64_t receivers, double relay_up);
CapacityPrediction PredictCapacity(const CapacityInputs& in, const std::vector<WorkerClass>& classes);

// The fewest versions a class's groups can be behind the learner when they arrive: a group
// started the moment a snapshot lands arrives floor((T_bcast + T_gen) / T_step) versions
// after that snapshot was published (kappa only adds to this). Over S, every group of the
// class is too stale to use: the class contributes nothing. (staleness_bound is the other
// end: the most a group can be behind, buffer wait included.)
int64_t ClassMinArrivalStaleness(double step_seconds, double bcast_seconds, double group_seconds);

// Largest kappa that keeps staleness_bound <= S at this step time (0 when none does).
int64_t MaxFreshPublishPeriod(int64_t max_staleness, double step_seconds, double bcast_seconds,
                              double max_group_seconds);

// Centralised lock-step baseline: rollouts then training on the same GPUs.
struct BaselinePrediction {
  double train_seconds = 0;
  double generate_seconds = 0;
  double step_seconds = 0;
  double price_per_hour = 0;
  double cost_per_step = 0;
};
BaselinePrediction PredictBaseline(double train_seconds, double generate_seconds, double price_per_hour);
// Lock-step generation of B*G rollouts on `count` GPUs, each a replica decoding as many
// sequences as fit, in waves; the last wave is partial.
double BaselineGenerateSeconds(const GpuSpec& gpu, int64_t count, const ModelProfile& model,
                               const RolloutShape& shape, int64_t groups_per_step);

}  // namespace echelon::plan
