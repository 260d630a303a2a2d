#include "echelon/common/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include <unistd.h>

namespace echelon {
namespace {

ConfigSchema Schema() {
  ConfigSchema s;
  s.Int("rl.steps", 10, 1, 100, "steps");
  s.Float("rl.lr", 0.001, 0.0, 1.0, "lr");
  s.Bool("model.tie", true, "tie");
  s.String("rl.correction", "none", "corr", {"none", "tis"});
  s.OpenSection("task.", "adapter options");
  return s;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "/config_test_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigTest, DefaultsFileAndOverridesApplyInOrder) {
  ConfigSchema s = Schema();
  std::string path = WriteTemp("ok.yaml", "rl:\n  steps: 20\n  lr: 0.01\ntask:\n  seed: 7\n");
  Result<Config> c = Config::Load(s, path, {"rl.steps=30", "model.tie=false"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->Int("rl.steps"), 30);
  EXPECT_DOUBLE_EQ(c->Float("rl.lr"), 0.01);
  EXPECT_FALSE(c->Bool("model.tie"));
  EXPECT_EQ(c->String("rl.correction"), "none");
  EXPECT_EQ(c->Section("task.").at("seed"), "7");
}

TEST(ConfigTest, UnknownKeyNamesFileLineAndKey) {
  ConfigSchema s = Schema();
  std::string path = WriteTemp("unknown.yaml", "rl:\n  steps: 20\n  stepz: 3\n");
  Result<Config> c = Config::Load(s, path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(path + ":3"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("rl.stepz"), std::string::npos);
}

TEST(ConfigTest, WrongTypeAndRangeAreRefusedWithExpectation) {
  ConfigSchema s = Schema();
  std::string path = WriteTemp("type.yaml", "rl:\n  steps: many\n");
  Result<Config> c = Config::Load(s, path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("expected an integer"), std::string::npos) << c.status().message();
  Result<Config> r = Config::Load(s, "", {"rl.steps=500"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[1, 100]"), std::string::npos) << r.status().message();
  Result<Config> ch = Config::Load(s, "", {"rl.correction=vtrace"});
  ASSERT_FALSE(ch.ok());
  EXPECT_NE(ch.status().message().find("one of: none, tis"), std::string::npos);
  Result<Config> f = Config::Load(s, "", {"rl.lr=nan"});
  EXPECT_FALSE(f.ok());
}

TEST(ConfigTest, SyntaxErrorAndMissingFile) {
  ConfigSchema s = Schema();
  std::string path = WriteTemp("syntax.yaml", "rl:\n  steps: [1, 2\n");
  Result<Config> c = Config::Load(s, path, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(path), std::string::npos);
  EXPECT_FALSE(Config::Load(s, "/nonexistent/x.yaml", {}).ok());
  EXPECT_FALSE(Config::Load(s, "", {"novalue"}).ok());
}

TEST(ConfigTest, ResolvedYamlLoadsBackToTheSameValues) {
  ConfigSchema s = Schema();
  Result<Config> c = Config::Load(s, "", {"rl.steps=42", "task.max_operand=9", "rl.correction=tis"});
  ASSERT_TRUE(c.ok());
  std::string path = WriteTemp("resolved.yaml", c->ToYaml());
  Result<Config> back = Config::Load(s, path, {});
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << c->ToYaml();
  EXPECT_EQ(back->Int("rl.steps"), 42);
  EXPECT_EQ(back->String("rl.correction"), "tis");
  EXPECT_EQ(back->Section("task.").at("max_operand"), "9");
  EXPECT_EQ(back->ToYaml(), c->ToYaml());
}

// Numbers were written with 17 digits ("default 0.20000000000000001" in every help table and
// resolved config): now the shortest form that reads back exactly.
TEST(ConfigTest, NumbersAreWrittenInTheShortestFormThatReadsBackExactly) {
  ConfigSchema s;
  s.Float("rl.clip_low", 0.2, 0.0, 1.0, "clip");
  s.Float("rl.third", 0.0, 0.0, 1.0, "a third");
  Result<Config> c = Config::Load(s, "", {"rl.third=0.333333333333333314829616256247"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string yaml = c->ToYaml();
  EXPECT_NE(yaml.find("clip_low: 0.2\n"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("0.20000000000000001"), std::string::npos) << yaml;
  std::string path = WriteTemp("third.yaml", yaml);
  Result<Config> back = Config::Load(s, path, {});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Float("rl.third"), 1.0 / 3.0) << "exactly, not to 15 digits";
  EXPECT_EQ(back->Float("rl.clip_low"), 0.2);
}

}  // namespace
}  // namespace echelon
