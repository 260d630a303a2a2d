// Planner: turns a PlanConfig into a Plan: resolves each worker class's throughput (measured
// or derived from its GPU), the learner's step time, runs cost-aware activation against the
// provisioning rule, recommends S and kappa, and predicts utilisation and cost against the
// centralised baseline. `echelon plan` prints it; `echelon simulate` runs it.
//
//   ECHELON_ASSIGN_OR_RETURN(Plan plan, MakePlan(config));
//   std::cout << PlanTable(plan);  std::cout << PlanJson(plan).dump();
//
// Freshness in activation: a class whose every group would be more than S versions old when
// it arrives (ClassMinArrivalStaleness, judged at the target step time
// max(T_train + T_over, T_train / u*)) contributes nothing usable; its offer rate is 0, so
// activation neither counts nor picks it (here and in the simulator's re-activation). The
// plan as a whole is called fresh only if staleness_bound (the most a group can be behind)
// is <= S.
//
// Choice of S and kappa (when the config leaves them to the planner, rl.max_staleness = -1,
// rl.publish_period = 0): for each S in [1, staleness_cap], activation over the classes fresh
// at S (kappa = 1 while it is to be chosen), then kappa = the largest fresh one (fewest
// broadcasts). Among the S whose window does not throttle the chosen workers (S*B >= their
// slots) and whose plan is fresh, the one that meets the target at the lowest $/step wins;
// ties go to the smaller S, because reward matches synchronous training only up to S ~ 3-6
// (ECHO-2's report). None valid: S = staleness_cap.
//
// Thread contract: pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/plan/activation.h"
#include "echelon/plan/capacity_model.h"
#include "echelon/plan/plan_config.h"

namespace echelon::plan {

struct Plan {
  PlanConfig config;
  std::vector<WorkerClass> classes;  // catalogue order; count = activated
  CapacityInputs inputs;             // with the chosen S and kappa
  double demand_groups_per_s = 0;    // u* * B / T_train: the provisioning rule's target
  Activation activation;
  CapacityPrediction prediction;
  BaselinePrediction baseline;
  std::vector<bool> class_fresh;                  // per class: counted by activation at S, kappa
  std::vector<int64_t> class_arrival_staleness;   // per class: ClassMinArrivalStaleness (-1: cannot run)
  bool staleness_recommended = false;
  bool period_recommended = false;
  std::vector<std::string> notes;    // warnings a user should read (infeasible class, ...)

  double saving() const { return 1 - prediction.cost_per_step / baseline.cost_per_step; }
};

Result<Plan> MakePlan(const PlanConfig& config);
// LoadPlanConfig then MakePlan: what `echelon plan` and `echelon simulate` both start with.
Result<Plan> MakePlanFromFile(const std::string& path);

// Activation offers per class given how many instances are available now; rates are
// effective groups/s per instance, 0 for a class `excluded` names (freshness: ActivateFresh).
std::vector<WorkerOffer> ActivationOffers(const Plan& plan, const std::vector<int64_t>& available,
                                          const std::vector<bool>& excluded = {});
// Freshness-respecting activation: classes whose generation alone spans more than S steps
// are excluded; then Activate, and, because the broadcast time depends on who is activated
// (relays forward at their own uplinks), any activated class whose groups would all arrive
// more than S versions old with the chosen workers' broadcast is excluded and activation
// re-run, until every activated class is usable. What `MakePlan` and the simulator's
// re-activation use.
struct FreshActivation {
  Activation activation;
  std::vector<WorkerOffer> offers;  // the last round's
  std::vector<bool> fresh;          // per class: not excluded and usable with the chosen broadcast (S = 0: can run)
  std::vector<int64_t> arrival;     // per class: least arrival staleness (the chosen workers' broadcast when activated)
};
// Leaving classes out is greedy: a class found stale among the workers chosen with it is not
// tried again beside better relays, so the result can cost more than the cheapest usable
// set. `incumbent` (counts per class, e.g. the workers running now) is kept instead when it
// still meets the demand with usable classes only and costs less (method "kept").
FreshActivation ActivateFresh(const Plan& plan, const std::vector<int64_t>& available,
                              const std::vector<int64_t>* incumbent = nullptr);
// Per class: ClassMinArrivalStaleness at FreshnessStepSeconds when the snapshot goes to
// `receivers[j]` workers of each class j (-1: the class cannot run).
std::vector<int64_t> ClassMinArrivalStalenesses(const Plan& plan, const std::vector<int64_t>& receivers);
// The step time at which activation judges freshness: max(T_train + T_over, T_train / u*).
double FreshnessStepSeconds(const Plan& plan);

std::string PlanTable(const Plan& plan);
nlohmann::json PlanJson(const Plan& plan);

}  // namespace echelon::plan
