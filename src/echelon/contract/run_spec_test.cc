#include "echelon/contract/run_spec.h"

#include <gtest/gtest.h>

namespace echelon::contract {
namespace {

RunSpec Spec() {
  RunSpec spec;
  spec.task_name = "math";
  spec.task_options = {{"eval_size", "7"}};
  spec.model.vocab_size = 17;
  spec.model.hidden_size = 32;
  spec.model.intermediate_size = 64;
  spec.model.num_hidden_layers = 1;
  spec.model.num_attention_heads = 2;
  spec.model.num_key_value_heads = 1;
  spec.model.head_dim = 16;
  spec.vocab = model::Vocabulary::Characters("0123456789+=");
  spec.sampling.temperature = 0.7;
  spec.sampling.top_p = 0.9;
  spec.sampling.top_k = 5;
  spec.sampling.min_p = 0.05;
  spec.sampling.max_new_tokens = 11;
  spec.sampling.slots = 24;
  return spec;
}

// Every sampling setting the learner configures reaches the actor's engine.
TEST(RunSpecTest, SamplingSurvivesTheRoundTrip) {
  Result<ActorSetup> setup = ParseRunSpec(RunSpecToJson(Spec()).dump());
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  const model::SamplingParams& s = setup.value().sampling;
  EXPECT_EQ(s.temperature, 0.7);
  EXPECT_EQ(s.top_p, 0.9);
  EXPECT_EQ(s.top_k, 5);
  EXPECT_EQ(s.min_p, 0.05);
  EXPECT_EQ(s.max_new_tokens, 11);
  EXPECT_EQ(s.slots, 24);
}

// What a worker must not know leaves neither in the spec nor to the actor's adapter: the data
// files and services, the seed of the data order and the run's secret.
TEST(RunSpecTest, LearnerOnlyTaskOptionsStayOnTheLearner) {
  RunSpec spec = Spec();
  spec.task_options = {{"eval_size", "7"},  {"seed", "99"},          {"secret", std::string(64, 'a')},
                       {"eval_file", "x"}, {"reward_url", "http://r"}, {"server", "http://env"}};
  const nlohmann::json j = RunSpecToJson(spec);
  EXPECT_EQ(j.at("task").at("options"), (nlohmann::json{{"eval_size", "7"}})) << j.dump();
  EXPECT_EQ(j.dump().find("99"), std::string::npos) << j.dump();
  EXPECT_FALSE(j.contains("seed"));
  // An older learner's spec still carried them: the actor builds its adapter without.
  nlohmann::json old = j;
  old["task"]["options"]["eval_file"] = "/nonexistent/held-out.jsonl";
  old["task"]["options"]["seed"] = "99";
  old["seed"] = 99;
  Result<ActorSetup> setup = ParseRunSpec(old.dump());
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  EXPECT_TRUE(LearnerOnlyTaskOption("data_file"));
  EXPECT_FALSE(LearnerOnlyTaskOption("_file"));
  EXPECT_FALSE(LearnerOnlyTaskOption("opponent"));
}

TEST(RunSpecTest, AMissingFieldIsNamed) {
  nlohmann::json j = RunSpecToJson(Spec());
  j["sampling"].erase("slots");
  Result<ActorSetup> setup = ParseRunSpec(j.dump());
  ASSERT_FALSE(setup.ok());
  EXPECT_NE(setup.status().message().find("slots"), std::string::npos) << setup.status().message();
}

}  // namespace
}  // namespace echelon::contract
