// Planner: turns a PlanConfig into a Plan: resolves each worker class's throughput (measured
// or derived from its GPU), the learner's step time, runs cost-aware activation against the
// provisioning rule, recommends S and kappa, and predicts utilisation and cost against the
// centralised baseline. `echelon plan` prints it; `echelon simulate` runs it.
//
//   ECHELON_ASSIGN_OR_RETURN(Plan plan, MakePlan(config));
//   std::cout << PlanTable(plan);  std::cout << PlanJson(plan).dump();
//
// Choice of S and kappa (when the config leaves them to the planner, rl.max_staleness = -1,
// rl.publish_period = 0): the smallest S in [1, staleness_cap] whose window does not
// throttle the chosen workers (S*B >= their slots) and for which some kappa keeps the
// freshness bound; kappa is then the largest such (fewest broadcasts). Small S is preferred
// because reward matches synchronous training only up to S ~ 3-6 (ECHO-2's report).
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
  bool staleness_recommended = false;
  bool period_recommended = false;
  std::vector<std::string> notes;    // warnings a user should read (infeasible class, ...)

  double saving() const { return 1 - prediction.cost_per_step / baseline.cost_per_step; }
};

Result<Plan> MakePlan(const PlanConfig& config);
// LoadPlanConfig then MakePlan: what `echelon plan` and `echelon simulate` both start with.
Result<Plan> MakePlanFromFile(const std::string& path);

// Activation offers per class given how many instances are available now (for re-activation
// in the simulator); rates are effective groups/s per instance.
std::vector<WorkerOffer> ActivationOffers(const Plan& plan, const std::vector<int64_t>& available);

std::string PlanTable(const Plan& plan);
nlohmann::json PlanJson(const Plan& plan);

}  // namespace echelon::plan
