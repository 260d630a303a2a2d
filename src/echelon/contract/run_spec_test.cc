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
  spec.seed = 99;
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
  EXPECT_EQ(setup.value().seed, 99u);
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
