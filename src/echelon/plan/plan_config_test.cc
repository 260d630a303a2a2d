#include "echelon/plan/plan_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "echelon/plan/planner.h"

namespace echelon::plan {
namespace {

// ECHELON_TEST_DATA is <repo>/tests/data.
std::string RepoPath(const std::string& rel) { return std::string(ECHELON_TEST_DATA) + "/../../" + rel; }

TEST(PlanPrices, ShippedCatalogueHasTheGpusTheIssueNames) {
  Result<PriceCatalog> cat = LoadPriceCatalog(RepoPath("data/prices.yaml"));
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  for (const char* name : {"a100", "h100", "h200", "rtx4090", "rtx5090"}) {
    const GpuSpec* g = cat->Find(name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_GT(g->price_per_hour, 0);
    EXPECT_FALSE(g->price_source.empty());
  }
}

TEST(PlanConfigLoad, ShippedConfigsLoadAndPlan) {
  for (const char* name : {"configs/plan-qwen3-8b.yaml", "configs/plan-qwen3-4b.yaml", "configs/simulate-qwen3-8b.yaml",
                           "configs/simulate-large.yaml", "configs/plan-qwen3-30b-a3b.yaml",
                           "configs/plan-qwen3-30b-a3b-5090.yaml", "configs/simulate-mixed-fleet.yaml"}) {
    Result<PlanConfig> c = LoadPlanConfig(RepoPath(name));
    ASSERT_TRUE(c.ok()) << c.status().message();
    Result<Plan> p = MakePlan(c.value());
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_GT(p->prediction.utilization, 0) << name;
    EXPECT_GT(p->baseline.cost_per_step, 0) << name;
  }
}

TEST(PlanConfigLoad, FourBillionConfigLeavesOutTheClassWhoseGroupsWouldArriveStale) {
  // Community RTX 4090s take ~2 minutes to pull an 8 GB snapshot through their 500 Mbit/s
  // downlinks and 73 s per group: at a 28.7 s step their groups would all arrive 7 versions
  // old, more than S = 6. RTX 5090s (1 Gbit/s, 53 s per group) arrive 4 versions old.
  Result<PlanConfig> c = LoadPlanConfig(RepoPath("configs/plan-qwen3-4b.yaml"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<Plan> p = MakePlan(c.value());
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->classes[1].name, "rtx4090-community");
  EXPECT_EQ(p->classes[1].count, 0);
  EXPECT_FALSE(p->class_fresh[1]);
  EXPECT_GT(p->class_arrival_staleness[1], 6);
  EXPECT_GT(p->classes[0].count, 0);
  EXPECT_GT(p->classes[2].count, 0);
}

TEST(PlanConfigLoad, ThirtyBillionMoeRunsOnH200sOrOnPipelinesOfThree5090s) {
  Result<PlanConfig> c = LoadPlanConfig(RepoPath("configs/plan-qwen3-30b-a3b.yaml"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->model.active_params, 3.3e9);
  EXPECT_EQ(c->model.experts, 128);
  Result<Plan> h200 = MakePlan(c.value());
  ASSERT_TRUE(h200.ok());
  EXPECT_GT(h200->classes[0].count, 0);
  // The 5090 file: one card or two cannot hold the 61 GB model, a pipeline of three can, at
  // three cards' price and failure rate and three links' bandwidth.
  c = LoadPlanConfig(RepoPath("configs/plan-qwen3-30b-a3b-5090.yaml"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->workers[0].pipeline, 3);
  Result<Plan> p = MakePlan(c.value());
  ASSERT_TRUE(p.ok());
  const WorkerClass& k = p->classes[0];
  EXPECT_TRUE(k.decode.feasible);
  EXPECT_GT(k.count, 0);
  EXPECT_DOUBLE_EQ(k.price_per_hour, 3 * c->prices.Find("rtx5090")->price_per_hour);
  EXPECT_DOUBLE_EQ(k.failures_per_hour, 3 * c->workers[0].failures_per_hour);
  EXPECT_DOUBLE_EQ(k.downlink_mbps, 3 * c->workers[0].downlink_mbps);
  c->workers[0].pipeline = 2;
  p = MakePlan(c.value());
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->classes[0].decode.feasible);
  ASSERT_FALSE(p->notes.empty());
  EXPECT_NE(p->notes[0].find("does not fit in 2 x rtx5090"), std::string::npos) << p->notes[0];
}

class PlanConfigErrors : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    // One directory per test process: ctest runs these tests in parallel.
    dir_ = ::testing::TempDir() + "/plan_config_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    std::filesystem::copy_file(RepoPath("data/prices.yaml"), dir_ + "/prices.yaml",
                               std::filesystem::copy_options::overwrite_existing);
    const std::string path = dir_ + "/plan.yaml";
    std::ofstream(path) << text;
    return path;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Base() {
    return "prices: prices.yaml\n"
           "model: {params_billion: 1, kv_bytes_per_token: 1000}\n"
           "rollout: {groups_per_step: 4, group_size: 4, completion_tokens: 100}\n";
  }

 private:
  std::string dir_;
};

TEST_F(PlanConfigErrors, UnknownKeyNamesFileLineAndKey) {
  const std::string path = Write(Base() + "workers:\n  - gpu: rtx5090\n    available: 3\n    avialable: 4\n");
  Result<PlanConfig> c = LoadPlanConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(path + ":7: unknown key 'workers[0].avialable'"), std::string::npos)
      << c.status().message();
}

TEST_F(PlanConfigErrors, RemovedFanoutKeySaysTheRelayIsASwarm) {
  const std::string path = Write(Base() + "broadcast:\n  mode: relay\n  fanout: 2\n" +
                                 "workers:\n  - gpu: rtx5090\n    available: 3\n");
  Result<PlanConfig> c = LoadPlanConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(path + ":6: broadcast.fanout is no longer a setting: the relay is a swarm"),
            std::string::npos)
      << c.status().message();
}

TEST_F(PlanConfigErrors, UnknownGpuListsTheCatalogue) {
  Result<PlanConfig> c = LoadPlanConfig(Write(Base() + "workers:\n  - gpu: rtx9090\n    available: 3\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(":5: unknown GPU 'rtx9090'; the price catalogue has: h200"), std::string::npos)
      << c.status().message();
}

TEST_F(PlanConfigErrors, OutOfRangeAndMissingValues) {
  Result<PlanConfig> c = LoadPlanConfig(Write(Base() + "rl: {target_utilization: 1.5}\nworkers:\n  - gpu: a100\n    available: 1\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rl.target_utilization = '1.5' is invalid"), std::string::npos) << c.status().message();
  c = LoadPlanConfig(Write(Base() + "workers:\n  - gpu: a100\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("missing required key 'workers[0].available'"), std::string::npos)
      << c.status().message();
  c = LoadPlanConfig(Write(Base() + "rl: {max_staleness: 2, publish_period: 4}\nworkers:\n  - gpu: a100\n    available: 1\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("exceeds rl.max_staleness + 1"), std::string::npos) << c.status().message();
}

TEST_F(PlanConfigErrors, AMixtureOfExpertsNeedsItsThreeKeysTogether) {
  const std::string workers = "workers:\n  - gpu: a100\n    available: 1\n";
  for (const char* moe : {"model: {params_billion: 1, kv_bytes_per_token: 1000, experts: 8}\n",
                          "model: {params_billion: 1, kv_bytes_per_token: 1000, active_params_billion: 2, experts: 8, "
                          "experts_per_token: 2}\n",
                          "model: {params_billion: 1, kv_bytes_per_token: 1000, active_params_billion: 0.5, experts: 8, "
                          "experts_per_token: 8}\n"}) {
    Result<PlanConfig> c = LoadPlanConfig(Write(std::string("prices: prices.yaml\n") + moe +
                                                "rollout: {groups_per_step: 4, group_size: 4, completion_tokens: 100}\n" +
                                                workers));
    ASSERT_FALSE(c.ok()) << moe;
    EXPECT_NE(c.status().message().find("needs active_params_billion"), std::string::npos) << c.status().message();
  }
}

TEST_F(PlanConfigErrors, PriceChangesRunActorsAndOverheadAreRead) {
  Result<PlanConfig> c = LoadPlanConfig(Write(
      Base() + "learner: {overhead_seconds: 1.5}\n"
               "workers:\n  - gpu: a100\n    available: 2\n    run_actors: [actor-0, actor-1]\n"
               "  - gpu: rtx5090\n    available: 3\n"
               "simulate:\n  price_changes:\n    - {at_step: 90, gpu: rtx5090, price_per_hour: 2.0}\n"
               "    - {at_step: 40, gpu: a100, price_per_hour: 0.5}\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->learner_overhead_seconds, 1.5);
  EXPECT_EQ(c->workers[0].run_actors, (std::vector<std::string>{"actor-0", "actor-1"}));
  ASSERT_EQ(c->sim.price_changes.size(), 2u);
  EXPECT_EQ(c->sim.price_changes[0].at_step, 40);  // sorted by step
  EXPECT_EQ(c->sim.price_changes[1].gpu, "rtx5090");
  EXPECT_DOUBLE_EQ(c->sim.price_changes[1].price_per_hour, 2.0);
}

TEST_F(PlanConfigErrors, BadPriceChangesNameFileLineAndKey) {
  const std::string workers = "workers:\n  - gpu: a100\n    available: 2\n";
  const std::string path = Write(Base() + workers + "simulate:\n  price_changes:\n    - {at_step: 5, gpu: h100, price_per_hour: 2}\n");
  Result<PlanConfig> c = LoadPlanConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(path + ":9: simulate.price_changes[0].gpu = 'h100' is not the GPU of any worker "
                                      "class (they use: a100)"),
            std::string::npos)
      << c.status().message();
  c = LoadPlanConfig(Write(Base() + workers + "simulate:\n  price_changes:\n    - {gpu: a100, price_per_hour: 2}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("missing required key 'simulate.price_changes[0].at_step'"), std::string::npos)
      << c.status().message();
  c = LoadPlanConfig(Write(Base() + workers + "simulate:\n  price_changes:\n    - {at_step: 0, gpu: a100, price_per_hour: 2}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("simulate.price_changes[0].at_step = '0' is invalid"), std::string::npos)
      << c.status().message();
  c = LoadPlanConfig(Write(Base() + workers + "simulate:\n  price_changes: {at_step: 3}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("simulate.price_changes must be a list"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace echelon::plan
