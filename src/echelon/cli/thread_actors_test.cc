// System tests of the learning plane with actors as threads: real learner, real actors, tiny model.
// Here rather than in learn/ because the run needs both planes (ThreadActors, EvaluateModel).
#include "echelon/cli/thread_actors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "echelon/cli/train_config.h"
#include "echelon/common/fs.h"
#include "echelon/learn/learner_run.h"
#include "echelon/learn/run_start.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::cli {
namespace {

learn::RunOptions TinyOptions(int64_t staleness, int64_t actors, uint64_t seed) {
  Result<Config> cfg = Config::Load(TrainSchema(), "",
                                    {"model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
                                     "model.num_key_value_heads=1", "model.head_dim=16", "model.intermediate_size=64",
                                     "warmstart.steps=3", "warmstart.batch_size=16", "rl.steps=8",
                                     "rl.groups_per_step=3", "rl.group_size=4", "task.eval_size=20",
                                     "eval.every=4", "rollout.actors=" + std::to_string(actors),
                                     "rl.staleness=" + std::to_string(staleness), "seed=" + std::to_string(seed)});
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  Result<learn::RunOptions> o = RunOptionsFromConfig(cfg.value());
  EXPECT_TRUE(o.ok()) << o.status().message();
  return o.value();
}

std::string FreshDir(const std::string& name) {
  std::string dir = testing::TempDir() + "/echelon_runtime_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// A run with its actors as threads of this process.
Result<learn::RunSummary> RunWithThreads(const learn::RunOptions& o, const std::string& dir, const std::string& yaml) {
  ThreadActors actors(o.actors, o.actor_slowdowns);
  std::stringstream progress;
  return learn::RunLearner(o, {dir, yaml}, actors, rollout::EvaluateModel, nullptr, progress);
}

std::vector<nlohmann::json> ReadMetrics(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(LearnerRunTest, StalenessBoundAndCountsHoldUnderRandomActorSpeeds) {
  std::mt19937 rng(11);
  for (int64_t s : {0, 1, 3}) {
    learn::RunOptions o = TinyOptions(s, 3, 5);
    std::uniform_real_distribution<double> speed(1.0, 6.0);
    for (double& d : o.actor_slowdowns) d = speed(rng);
    const std::string dir = FreshDir("stale" + std::to_string(s));
    Result<learn::RunSummary> r = RunWithThreads(o, dir, "seed: 5\n");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->steps_done, o.steps);
    std::vector<nlohmann::json> lines = ReadMetrics(dir);
    int64_t steps = 0;
    int64_t max_seen = 0;
    for (const auto& l : lines) {
      if (!l.contains("step")) continue;
      EXPECT_EQ(l["version"].get<int64_t>(), l["step"].get<int64_t>() + 1);
      EXPECT_LE(l["staleness_max"].get<int64_t>(), s) << l.dump();
      max_seen = std::max(max_seen, l["staleness_max"].get<int64_t>());
      EXPECT_EQ(l["groups_issued"].get<int64_t>(),
                l["groups_consumed"].get<int64_t>() + l["groups_dropped_stale"].get<int64_t>() +
                    l["groups_reissued"].get<int64_t>() + l["groups_in_flight"].get<int64_t>())
          << l.dump();
      EXPECT_EQ(l["groups_consumed"].get<int64_t>(), (steps + 1) * o.groups_per_step);
      ++steps;
    }
    EXPECT_EQ(steps, o.steps);
    // Actors run S+1 batches ahead of a learner this slow, so staleness does occur.
    if (s > 0) {
      EXPECT_GE(max_seen, 1);
    }
    const nlohmann::json& fin = lines.back();
    ASSERT_EQ(fin["event"], "final");
    const int64_t handed = fin["groups_issued"];
    EXPECT_EQ(handed, fin["groups_consumed"].get<int64_t>() + fin["groups_dropped_stale"].get<int64_t>() +
                          fin["groups_reissued"].get<int64_t>() + fin["groups_in_flight"].get<int64_t>());
    // Admission: never more than S+1 batches beyond what was consumed.
    EXPECT_LE(handed - fin["groups_reissued"].get<int64_t>() - fin["groups_dropped_stale"].get<int64_t>(),
              (s + 1 + o.steps) * o.groups_per_step);
    EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/warmstart/model.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/final/model.safetensors"));
    std::filesystem::remove_all(dir);
  }
}

TEST(LearnerRunTest, SynchronousRunWithOneActorIsReproducible) {
  auto run = [](const std::string& name) {
    learn::RunOptions o = TinyOptions(0, 1, 9);
    o.secret_from_seed = true;  // `secret: seed`: the sampling seeds repeat with the seed
    const std::string dir = FreshDir(name);
    Result<learn::RunSummary> r = RunWithThreads(o, dir, "seed: 9\n");
    EXPECT_TRUE(r.ok()) << r.status().message();
    std::vector<nlohmann::json> lines = ReadMetrics(dir);
    for (auto& l : lines) {
      for (const char* timing : {"wall_s", "step_s", "wait_s", "train_s", "tokens_per_s", "learner_busy_frac", "learner_rss_mb",
                                 "learner_peak_rss_mb", "actor_group_seconds"})
        l.erase(timing);
      // Hand-outs counted when the line is written: the actor's next acquire races the record
      // (the line is written after the version moves on), so these vary between runs. What
      // was consumed, and every number of the update, must not.
      for (const char* live : {"groups_issued", "groups_in_flight", "actor_groups"}) l.erase(live);
      // Which groups the behaviour verifier draws is random per learner process, by design.
      for (const char* drawn :
           {"verified_groups", "verify_gap_max", "verify_token_gap_max", "verify_unverifiable", "verify_draws_checked",
            "verify_near_ties"})
        l.erase(drawn);
    }
    std::filesystem::remove_all(dir);
    return lines;
  };
  std::vector<nlohmann::json> a = run("det_a");
  std::vector<nlohmann::json> b = run("det_b");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "line " << i;
  for (const auto& l : a) {
    if (l.contains("step")) {
      EXPECT_EQ(l["staleness_max"].get<int64_t>(), 0);
    }
  }
}

// The default secret is drawn from the OS for each run, kept in RUN_DIR/secret for its owner
// alone and read back by a resume; `secret: seed` derives it and keeps nothing.
TEST(LearnerRunTest, ARandomSecretIsKeptOwnerOnlyAndReadBackOnResume) {
  learn::RunOptions o = TinyOptions(1, 1, 3);
  o.steps = 2;
  const std::string dir = FreshDir("secret");
  Result<learn::RunSummary> r = RunWithThreads(o, dir, "seed: 3\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string file = dir + "/secret";
  ASSERT_TRUE(std::filesystem::exists(file));
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::string text = ReadFile(file).value();
  ASSERT_EQ(text.size(), 65u);
  text.pop_back();
  std::stringstream progress;
  const RunSecret kept = learn::RunSecretFor(o, dir, /*resume=*/true, progress).value();
  EXPECT_EQ(kept.Hex(), text);
  EXPECT_NE(kept, RunSecret::FromSeed(3)) << "drawn, not derived from the seed";
  EXPECT_NE(learn::RunSecretFor(o, dir, /*resume=*/false, progress).value(), kept) << "a fresh run draws anew";
  // A resume whose file is gone draws a new one, and says so.
  std::filesystem::remove(file);
  EXPECT_NE(learn::RunSecretFor(o, dir, /*resume=*/true, progress).value(), kept);
  EXPECT_NE(progress.str().find("secret is missing"), std::string::npos) << progress.str();
  // secret: seed.
  o.secret_from_seed = true;
  EXPECT_EQ(learn::RunSecretFor(o, dir, /*resume=*/true, progress).value(), RunSecret::FromSeed(3));
  ASSERT_TRUE(learn::KeepRunSecret(o, dir, RunSecret::FromSeed(3)).ok());
  EXPECT_FALSE(std::filesystem::exists(file));
  std::filesystem::remove_all(dir);
}

TEST(LearnerRunTest, RefusesNonEmptyRunDirectory) {
  const std::string dir = FreshDir("nonempty");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/keep.txt") << "user data";
  Result<learn::RunSummary> r = RunWithThreads(TinyOptions(1, 1, 1), dir, "");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not empty"), std::string::npos);
  std::ifstream in(dir + "/keep.txt");
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "user data");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace echelon::cli
