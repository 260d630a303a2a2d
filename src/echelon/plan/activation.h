// Cost-aware activation: given worker classes (instances available, price per hour,
// effective throughput per instance) and a demand (throughput that keeps the learner at its
// target utilisation), choose how many instances of each class to run so that
//     sum_j n_j * r_j >= D,   0 <= n_j <= c_j,   minimising  sum_j n_j * p_j.
// This is a bounded min-cost covering knapsack (NP-hard in general, small in practice).
//
// Method:
//  - exact: depth-first branch and bound over counts, classes in order of price per unit of
//    throughput, pruned by the LP relaxation (the fractional greedy, which is optimal for
//    the relaxed problem). Exact whenever it finishes within kExactNodeBudget nodes, which
//    covers every catalogue of a few classes with thousands of instances.
//  - greedy (when the budget runs out): take classes in that order, whole classes while the
//    demand remains, round the last one up, then drop units that are not needed (most
//    expensive first). Bound: cost <= LP <= OPT plus one unit of the rounded class, so
//    cost - OPT <= max_j p_j; `lp_cost` is reported so the gap is visible.
//
//   std::vector<WorkerOffer> offers = {{"rtx5090", 64, 0.89, 1500}, {"a100", 8, 1.74, 4500}};
//   Activation a = Activate(offers, /*demand=*/20000);
//   // a.counts[j], a.cost_per_hour, a.method ("exact" or "greedy"), a.lp_cost
//
// Thread contract: pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace echelon::plan {

// Search nodes the exact method may visit before falling back to the greedy heuristic:
// ~2e6 nodes take well under a second, so `echelon plan` stays interactive and the
// simulator can re-run activation at every failure.
inline constexpr int64_t kExactNodeBudget = 2000000;

struct WorkerOffer {
  std::string name;
  int64_t available = 0;      // c_j
  double price_per_hour = 0;  // p_j
  double rate = 0;            // r_j: effective throughput of one instance (demand's unit)
};

struct Activation {
  bool feasible = false;       // demand met (else every instance is activated)
  std::vector<int64_t> counts;  // n_j, in the order of the offers
  double cost_per_hour = 0;
  double supply = 0;           // sum n_j r_j
  double lp_cost = 0;          // LP lower bound on the optimum (fractional greedy)
  std::string method;          // "exact", "greedy" or "all" (demand not reachable)
  int64_t nodes = 0;           // branch-and-bound nodes visited
};

Activation Activate(const std::vector<WorkerOffer>& offers, double demand, int64_t node_budget = kExactNodeBudget);

}  // namespace echelon::plan
