#include "echelon/obs/report_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace echelon::obs {
namespace {

namespace fs = std::filesystem;

Result<RunData> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParseMetrics(in, "run/metrics.jsonl");
}

const char* kGood =
    R"({"event":"warmstart","heldout_accuracy":0.144,"wall_s":17.5})"
    "\n"
    R"({"step":0,"version":1,"wall_s":18.0,"reward_mean":0.1,"staleness_mean":0.5,"staleness_max":1,)"
    R"("groups_dropped_stale":0,"actor_groups":{"actor-0":3,"actor-1":1},"staleness_hist":{"0":2,"1":2}})"
    "\n\n"
    R"({"step":1,"version":2,"wall_s":18.5,"reward_mean":null,"heldout_accuracy":0.3,"broadcast_s":0.25})"
    "\n"
    R"({"event":"final","heldout_accuracy":0.5,"version":2,"wall_s":20.0,"learner_busy_frac":0.9})"
    "\n";

TEST(ParseMetricsTest, ReadsStepsAndEvents) {
  Result<RunData> r = Parse(kGood);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->steps.size(), 2u);
  EXPECT_TRUE(r->warmstart.present);
  EXPECT_EQ(r->warmstart.heldout_accuracy, 0.144);
  EXPECT_EQ(r->warmstart.wall_s, 17.5);
  EXPECT_EQ(r->end.kind, "final");
  EXPECT_EQ(r->end.heldout_accuracy, 0.5);
  EXPECT_EQ(r->end.learner_busy_frac, 0.9);
  const StepRecord& s0 = r->steps[0];
  EXPECT_EQ(s0.step, 0);
  EXPECT_EQ(s0.version, 1);
  EXPECT_EQ(s0.reward_mean, 0.1);
  EXPECT_EQ(s0.staleness_max, 1);
  EXPECT_EQ(s0.groups_dropped_stale, 0);
  EXPECT_EQ(s0.actor_groups, (std::map<std::string, int64_t>{{"actor-0", 3}, {"actor-1", 1}}));
  EXPECT_EQ(s0.staleness_hist, (std::map<int64_t, int64_t>{{0, 2}, {1, 2}}));
  EXPECT_TRUE(std::isnan(s0.heldout_accuracy));
  EXPECT_TRUE(std::isnan(s0.broadcast_s));
  const StepRecord& s1 = r->steps[1];
  EXPECT_TRUE(std::isnan(s1.reward_mean));  // null reads as missing
  EXPECT_EQ(s1.heldout_accuracy, 0.3);
  EXPECT_EQ(s1.broadcast_s, 0.25);
  EXPECT_TRUE(s1.actor_groups.empty());
  EXPECT_TRUE(std::isnan(s1.learner_busy_frac));
}

TEST(ParseMetricsTest, ReadsEachEvaluationSetsRound) {
  Result<RunData> r = Parse(
      "{\"step\":0,\"wall_s\":1}\n"
      "{\"event\":\"eval\",\"set\":\"aime\",\"version\":3,\"eval/aime\":{\"k\":8,\"mean_at_k\":0.25,\"pass_at_k\":0.5}}\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->evals.size(), 1u);
  EXPECT_EQ(r->evals[0].set, "aime");
  EXPECT_EQ(r->evals[0].version, 3);
  EXPECT_EQ(r->evals[0].k, 8);
  EXPECT_EQ(r->evals[0].mean_at_k, 0.25);
  EXPECT_EQ(r->evals[0].pass_at_k, 0.5);
  Result<RunData> bad = Parse("{\"step\":0,\"wall_s\":1}\n{\"event\":\"eval\",\"set\":\"aime\",\"version\":3}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("run/metrics.jsonl:2: an eval line without its figures"), std::string::npos)
      << bad.status().message();
}

TEST(ParseMetricsTest, MalformedLineNamesFileAndLine) {
  Result<RunData> r = Parse("{\"step\":0,\"wall_s\":1}\n\n{\"step\":1,\"wall_s\":2\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("run/metrics.jsonl:3: not a JSON object", 0), 0u) << r.status().message();
}

TEST(ParseMetricsTest, NonObjectLineIsRefused) {
  Result<RunData> r = Parse("[1,2]\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "run/metrics.jsonl:1: expected a JSON object, got [1,2]");
}

TEST(ParseMetricsTest, WrongFieldTypeNamesTheField) {
  Result<RunData> r = Parse("{\"step\":0,\"wall_s\":1,\"reward_mean\":\"high\"}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "run/metrics.jsonl:1: field 'reward_mean' is \"high\"; expected a number");
}

TEST(ParseMetricsTest, StepLineNeedsStepAndWall) {
  Result<RunData> r = Parse("{\"wall_s\":1}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "run/metrics.jsonl:1: a training line needs an integer 'step' (or an \"event\" field)");
  r = Parse("{\"step\":0}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "run/metrics.jsonl:1: a training line needs a number 'wall_s'");
}

TEST(ParseMetricsTest, BadCountsAreRefused) {
  Result<RunData> r = Parse("{\"step\":0,\"wall_s\":1,\"actor_groups\":{\"a\":-1}}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "run/metrics.jsonl:1: actor_groups[\"a\"] is -1; expected a non-negative integer");
  r = Parse("{\"step\":0,\"wall_s\":1,\"staleness_hist\":{\"x\":1}}\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "run/metrics.jsonl:1: staleness_hist key \"x\" is not a non-negative integer");
}

TEST(ParseMetricsTest, UnknownEventsAndFieldsAreIgnored) {
  Result<RunData> r = Parse("{\"event\":\"resume\",\"x\":1}\n{\"step\":0,\"wall_s\":1,\"new_metric\":[1]}\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->steps.size(), 1u);
  EXPECT_FALSE(r->warmstart.present);
  EXPECT_FALSE(r->end.present);
}

TEST(ParseConfigYamlTest, FlattensNestedMapsInOrder) {
  auto r = ParseConfigYaml("seed: 1\nrl:\n  staleness: 2\n  correction: \"none\"\nrollout:\n  actors: 3\n", "c.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value(), (std::vector<std::pair<std::string, std::string>>{
                           {"seed", "1"}, {"rl.staleness", "2"}, {"rl.correction", "none"}, {"rollout.actors", "3"}}));
}

TEST(ParseConfigYamlTest, SyntaxErrorNamesFileAndLine) {
  auto r = ParseConfigYaml("seed: 1\nrl:\n  staleness: [2\n", "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("c.yaml:", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find("invalid YAML"), std::string::npos);
}

class LoadRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("report_data_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  fs::path root_;
};

TEST_F(LoadRunTest, MissingDirectoryIsNamed) {
  Result<RunData> r = LoadRun((root_ / "nowhere").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            (root_ / "nowhere").string() + ": no such run directory (expected a directory written by `echelon train`)");
}

TEST_F(LoadRunTest, MissingMetricsIsNamed) {
  fs::create_directories(root_ / "empty");
  Result<RunData> r = LoadRun((root_ / "empty").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind((root_ / "empty" / "metrics.jsonl").string() + ": cannot open", 0), 0u);
}

TEST_F(LoadRunTest, RunWithoutStepsIsRefused) {
  Write(root_ / "r" / "metrics.jsonl", "{\"event\":\"warmstart\",\"wall_s\":1}\n");
  Result<RunData> r = LoadRun((root_ / "r").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), (root_ / "r" / "metrics.jsonl").string() + ": no training step lines; nothing to report");
}

TEST_F(LoadRunTest, ReadsMetricsAndConfig) {
  Write(root_ / "S2" / "metrics.jsonl", kGood);
  Write(root_ / "S2" / "config.yaml", "rl:\n  staleness: 2\n");
  Result<RunData> r = LoadRun((root_ / "S2").string() + "/");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->label, "S2");
  EXPECT_EQ(r->steps.size(), 2u);
  EXPECT_EQ(r->config, (std::vector<std::pair<std::string, std::string>>{{"rl.staleness", "2"}}));
  EXPECT_TRUE(r->config_note.empty());
}

TEST_F(LoadRunTest, MissingConfigIsANoteNotAnError) {
  Write(root_ / "r" / "metrics.jsonl", kGood);
  Result<RunData> r = LoadRun((root_ / "r").string());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->config.empty());
  EXPECT_EQ(r->config_note, "no config.yaml in " + (root_ / "r").string());
}

TEST_F(LoadRunTest, BadConfigNamesFileAndLine) {
  Write(root_ / "r" / "metrics.jsonl", kGood);
  Write(root_ / "r" / "config.yaml", "rl:\n  staleness: 2\n bad: [\n");
  Result<RunData> r = LoadRun((root_ / "r").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind((root_ / "r" / "config.yaml").string() + ":", 0), 0u) << r.status().message();
}

TEST(AssignLabelsTest, ClashingNamesGetParentDirectories) {
  std::vector<RunData> runs(4);
  runs[0].dir = "/x/a/run";
  runs[1].dir = "/x/b/run";
  runs[2].dir = "/x/S0";
  runs[3].dir = "/x/S16/";
  AssignLabels(&runs);
  EXPECT_EQ(runs[0].label, "a/run");
  EXPECT_EQ(runs[1].label, "b/run");
  EXPECT_EQ(runs[2].label, "S0");
  EXPECT_EQ(runs[3].label, "S16");
}

TEST(AssignLabelsTest, SameDirectoryTwiceStopsAtTheFullPath) {
  std::vector<RunData> runs(2);
  runs[0].dir = runs[1].dir = "/x/r";
  AssignLabels(&runs);
  EXPECT_EQ(runs[0].label, "x/r");
  EXPECT_EQ(runs[1].label, "x/r");
}

}  // namespace
}  // namespace echelon::obs
