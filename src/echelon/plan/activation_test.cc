#include "echelon/plan/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace echelon::plan {
namespace {

// Independent reference: every combination of counts.
struct Brute {
  bool feasible = false;
  double cost = INFINITY;
};
Brute BruteForce(const std::vector<WorkerOffer>& offers, double demand) {
  Brute best;
  std::vector<int64_t> n(offers.size(), 0);
  while (true) {
    double supply = 0, cost = 0;
    for (size_t j = 0; j < offers.size(); ++j) {
      supply += n[j] * offers[j].rate;
      cost += n[j] * offers[j].price_per_hour;
    }
    if (supply >= demand * (1 - 1e-9) && cost < best.cost) best = {true, cost};
    size_t j = 0;
    while (j < n.size() && n[j] == offers[j].available) n[j++] = 0;
    if (j == n.size()) break;
    ++n[j];
  }
  return best;
}

std::vector<WorkerOffer> RandomOffers(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> types(1, 4), count(0, 5);
  std::uniform_real_distribution<double> rate(0.1, 10), price(0.1, 5);
  std::vector<WorkerOffer> offers(types(rng));
  for (size_t j = 0; j < offers.size(); ++j) {
    offers[j] = {"c" + std::to_string(j), count(rng), price(rng), rate(rng)};
  }
  return offers;
}

double Supply(const std::vector<WorkerOffer>& offers, const std::vector<int64_t>& n) {
  double s = 0;
  for (size_t j = 0; j < offers.size(); ++j) s += n[j] * offers[j].rate;
  return s;
}

TEST(ActivationExact, EqualsBruteForceOnRandomSmallCatalogues) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> frac(0.0, 1.1);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<WorkerOffer> offers = RandomOffers(rng);
    double total = 0;
    for (const WorkerOffer& o : offers) total += o.available * o.rate;
    const double demand = frac(rng) * total;
    const Brute brute = BruteForce(offers, demand);
    const Activation a = Activate(offers, demand);
    ASSERT_EQ(a.feasible, brute.feasible) << "trial " << trial;
    if (!brute.feasible) {
      EXPECT_EQ(a.method, "all");
      continue;
    }
    EXPECT_EQ(a.method, "exact");
    EXPECT_NEAR(a.cost_per_hour, brute.cost, 1e-9 * std::max(1.0, brute.cost)) << "trial " << trial;
    EXPECT_GE(Supply(offers, a.counts), demand * (1 - 1e-9));
    for (size_t j = 0; j < offers.size(); ++j) {
      EXPECT_GE(a.counts[j], 0);
      EXPECT_LE(a.counts[j], offers[j].available);
    }
    EXPECT_LE(a.lp_cost, a.cost_per_hour + 1e-9);
  }
}

// Round prices and rates with a demand that some set supplies exactly (in decimal, not in
// binary floating point): the search once required the residual to reach <= 0 while it sized
// each count with a tolerance, so it could stop a hair short of the exact cover and return a
// dearer set, still labelled exact.
TEST(ActivationExact, ExactTiesEqualBruteForce) {
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<int> types(2, 4), count(1, 4), tenths(1, 30), cents(10, 300);
  int ties = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<WorkerOffer> offers(types(rng));
    for (size_t j = 0; j < offers.size(); ++j)
      offers[j] = {"c" + std::to_string(j), count(rng), cents(rng) / 100.0, tenths(rng) / 10.0};
    // The demand is the supply of a random set, summed in the reverse order of the search's.
    double demand = 0;
    for (size_t j = offers.size(); j-- > 0;) {
      const int64_t n = std::uniform_int_distribution<int64_t>(0, offers[j].available)(rng);
      for (int64_t i = 0; i < n; ++i) demand += offers[j].rate;
    }
    if (demand <= 0) continue;
    const Brute brute = BruteForce(offers, demand);
    const Activation a = Activate(offers, demand);
    ASSERT_TRUE(brute.feasible);
    ASSERT_TRUE(a.feasible) << "trial " << trial;
    EXPECT_EQ(a.method, "exact");
    ties += std::abs(Supply(offers, a.counts) - demand) <= 1e-9 * demand;
    EXPECT_NEAR(a.cost_per_hour, brute.cost, 1e-9 * std::max(1.0, brute.cost)) << "trial " << trial;
  }
  EXPECT_GT(ties, 1000) << "the cases must include exact covers";
}

TEST(ActivationGreedy, WithinOneWorkerPriceOfTheOptimum) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> frac(0.05, 1.0);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<WorkerOffer> offers = RandomOffers(rng);
    double total = 0, max_price = 0;
    for (const WorkerOffer& o : offers) {
      total += o.available * o.rate;
      max_price = std::max(max_price, o.price_per_hour);
    }
    if (total <= 0) continue;
    const double demand = frac(rng) * total;
    const Brute brute = BruteForce(offers, demand);
    const Activation a = Activate(offers, demand, /*node_budget=*/1);  // forces the heuristic
    ASSERT_TRUE(a.feasible);
    EXPECT_EQ(a.method, "greedy");
    EXPECT_GE(Supply(offers, a.counts), demand * (1 - 1e-9));
    EXPECT_LE(a.cost_per_hour, brute.cost + max_price + 1e-9) << "trial " << trial;
    EXPECT_LE(a.cost_per_hour, a.lp_cost + max_price + 1e-9);
  }
}

TEST(ActivationExact, LargeCatalogueStaysExactAndPrefersCheapThroughput) {
  // Thousands of instances of a few classes: the LP bound prunes the search to little.
  std::vector<WorkerOffer> offers = {
      {"rtx5090", 2000, 0.89, 1.0}, {"rtx4090", 3000, 0.34, 0.3}, {"a100", 500, 1.74, 2.0}, {"h100", 200, 2.69, 2.9}};
  const Activation a = Activate(offers, 1234.5);
  EXPECT_EQ(a.method, "exact");
  EXPECT_TRUE(a.feasible);
  EXPECT_LT(a.nodes, kExactNodeBudget);
  EXPECT_GE(a.cost_per_hour, a.lp_cost - 1e-9);
  EXPECT_LE(a.cost_per_hour, a.lp_cost + 2.69);
}

TEST(ActivationExact, UnreachableDemandActivatesEverythingAndSaysSo) {
  std::vector<WorkerOffer> offers = {{"a", 2, 1.0, 1.0}, {"b", 1, 5.0, 0.0}};
  const Activation a = Activate(offers, 10);
  EXPECT_FALSE(a.feasible);
  EXPECT_EQ(a.method, "all");
  EXPECT_EQ(a.counts, (std::vector<int64_t>{2, 0}));  // a class with no throughput is never bought
}

}  // namespace
}  // namespace echelon::plan
