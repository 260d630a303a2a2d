#include "echelon/plan/activation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace echelon::plan {
namespace {

// Relative slack for comparing throughputs and costs computed in floating point.
constexpr double kEps = 1e-9;

// A demand counts as covered when what is left of it is at most Slack(demand): the one
// tolerance of the search, the greedy and the feasibility label (a cover that is exact in
// decimal may leave a residual of a few ulps in binary).
double Slack(double demand) { return kEps * std::max(1.0, demand); }

// Units of `rate` that bring `residual` within `slack`.
int64_t UnitsToCover(double residual, double slack, double rate) {
  return std::max<int64_t>(0, static_cast<int64_t>(std::ceil((residual - slack) / rate)));
}

struct Search {
  const std::vector<WorkerOffer>* offers;
  double slack = 0;  // Slack(demand)
  std::vector<int> order;  // usable offers by price per throughput, cheapest first
  int64_t budget;
  int64_t nodes = 0;
  bool exhausted = false;
  std::vector<int64_t> counts, best;
  double best_cost = INFINITY, best_supply = 0;

  const WorkerOffer& at(size_t k) const { return (*offers)[order[k]]; }

  // Fractional greedy from position k: the LP optimum for covering `residual`.
  double LpBound(size_t k, double residual) const {
    double cost = 0;
    for (; k < order.size() && residual > slack; ++k) {
      const WorkerOffer& o = at(k);
      const double n = std::min<double>(o.available, residual / o.rate);
      cost += n * o.price_per_hour;
      residual -= n * o.rate;
    }
    return residual > slack ? INFINITY : cost;
  }

  void Dfs(size_t k, double residual, double cost, double supply) {
    if (++nodes > budget) {
      exhausted = true;
      return;
    }
    if (residual <= slack) {
      if (cost < best_cost - kEps * std::max(1.0, cost) ||
          (std::abs(cost - best_cost) <= kEps * std::max(1.0, cost) && supply > best_supply)) {
        best_cost = cost;
        best_supply = supply;
        best = counts;
      }
      return;
    }
    if (k == order.size()) return;
    if (cost + LpBound(k, residual) >= best_cost - kEps * std::max(1.0, best_cost)) return;
    const WorkerOffer& o = at(k);
    const int64_t most = std::min<int64_t>(o.available, UnitsToCover(residual, slack, o.rate));
    for (int64_t n = most; n >= 0 && !exhausted; --n) {
      counts[order[k]] = n;
      Dfs(k + 1, residual - n * o.rate, cost + n * o.price_per_hour, supply + n * o.rate);
    }
    counts[order[k]] = 0;
  }
};

Activation Finish(const std::vector<WorkerOffer>& offers, std::vector<int64_t> counts, double demand) {
  Activation a;
  a.counts = std::move(counts);
  for (size_t j = 0; j < offers.size(); ++j) {
    a.cost_per_hour += a.counts[j] * offers[j].price_per_hour;
    a.supply += a.counts[j] * offers[j].rate;
  }
  a.feasible = a.supply >= demand - Slack(demand);
  return a;
}

std::vector<int64_t> Greedy(const Search& s, double demand) {
  std::vector<int64_t> counts(s.offers->size(), 0);
  double residual = demand;
  for (size_t k = 0; k < s.order.size() && residual > s.slack; ++k) {
    const WorkerOffer& o = s.at(k);
    const int64_t n = std::min<int64_t>(o.available, UnitsToCover(residual, s.slack, o.rate));
    counts[s.order[k]] = n;
    residual -= n * o.rate;
  }
  // Drop units that are not needed, most expensive first.
  std::vector<int> by_price = s.order;
  std::sort(by_price.begin(), by_price.end(),
            [&](int a, int b) { return (*s.offers)[a].price_per_hour > (*s.offers)[b].price_per_hour; });
  double supply = demand - residual;
  for (int j : by_price) {
    const WorkerOffer& o = (*s.offers)[j];
    while (counts[j] > 0 && supply - o.rate >= demand - s.slack) {
      --counts[j];
      supply -= o.rate;
    }
  }
  return counts;
}

}  // namespace

Activation Activate(const std::vector<WorkerOffer>& offers, double demand, int64_t node_budget) {
  Search s;
  s.offers = &offers;
  s.budget = node_budget;
  s.slack = Slack(demand);
  for (size_t j = 0; j < offers.size(); ++j)
    if (offers[j].rate > 0 && offers[j].available > 0) s.order.push_back(static_cast<int>(j));
  std::stable_sort(s.order.begin(), s.order.end(), [&](int a, int b) {
    return offers[a].price_per_hour / offers[a].rate < offers[b].price_per_hour / offers[b].rate;
  });
  const double lp = s.LpBound(0, demand);
  if (demand <= 0) {
    Activation a = Finish(offers, std::vector<int64_t>(offers.size(), 0), demand);
    a.method = "exact";
    return a;
  }
  if (!std::isfinite(lp)) {  // even everything is not enough: run everything usable
    std::vector<int64_t> all(offers.size(), 0);
    for (int j : s.order) all[j] = offers[j].available;
    Activation a = Finish(offers, all, demand);
    a.method = "all";
    a.lp_cost = a.cost_per_hour;
    return a;
  }
  s.counts.assign(offers.size(), 0);
  s.Dfs(0, demand, 0, 0);
  Activation a;
  if (!s.exhausted && !s.best.empty()) {
    a = Finish(offers, s.best, demand);
    a.method = "exact";
  } else {
    a = Finish(offers, Greedy(s, demand), demand);
    a.method = "greedy";
  }
  a.lp_cost = lp;
  a.nodes = s.nodes;
  return a;
}

}  // namespace echelon::plan
