// TrajectoryIntake refuses malformed or hostile submissions with a counted reason, and recomputes the
// rewards it can verify instead of trusting the actor.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "echelon/learn/trajectory_intake.h"
#include "echelon/data/adapter.h"
#include "echelon/model/tokenizer.h"

namespace echelon::learn {
namespace {

struct HubFixture {
  HubFixture()
      : dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock),
        task(data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value()),
        tok(model::CharTokenizer::ForAlphabet(task->Alphabet())),
        vocab(model::Vocabulary::Characters(task->Alphabet())),
        hub(&dispatcher, task.get(), &vocab, vocab.id_end(), /*group_size=*/2) {
    hub.Publish({0, std::make_shared<const std::string>()});  // the learner publishes v0 first
  }

  // A well-formed group for the next hand-out: both samples answer correctly.
  rollout::GroupRollout Valid() {
    rollout::Assignment a = hub.Acquire("a#1").value();
    rollout::GroupRollout g;
    g.group_id = a.work.group_id;
    g.lease_id = a.work.lease_id;
    g.actor = "a#1";
    for (int i = 0; i < 2; ++i) {
      data::Turn t;
      t.prompt_ids = tok.Encode(a.prompt.text).value();
      t.prompt_ids.insert(t.prompt_ids.begin(), model::CharTokenizer::kBos);
      t.tokens = tok.Encode(a.prompt.reference).value();
      t.tokens.push_back(model::CharTokenizer::kEos);
      t.logprobs.assign(t.tokens.size(), -0.1f);
      t.text = a.prompt.reference;
      data::Episode e;
      e.turns.push_back(t);
      e.reward = 1.0;
      e.success = true;
      g.episodes.push_back(e);
    }
    return g;
  }

  SimulatedClock clock;
  sched::Dispatcher dispatcher;
  std::unique_ptr<data::TaskAdapter> task;
  model::CharTokenizer tok;
  model::Vocabulary vocab;
  TrajectoryIntake hub;
};

TEST(TrajectoryIntakeTest, RefusesHostileSubmissionsWithCountedReasons) {
  HubFixture f;
  struct Case {
    const char* reason;
    std::function<void(rollout::GroupRollout&)> corrupt;
  };
  const std::vector<Case> cases = {
      {"token_out_of_vocab", [](rollout::GroupRollout& g) { g.episodes[0].turns[0].tokens[0] = 9999; }},
      {"token_out_of_vocab", [](rollout::GroupRollout& g) { g.episodes[1].turns[0].prompt_ids[0] = -1; }},
      {"length_mismatch", [](rollout::GroupRollout& g) { g.episodes[0].turns[0].logprobs.pop_back(); }},
      {"bad_logprob",
       [](rollout::GroupRollout& g) { g.episodes[0].turns[0].logprobs[0] = std::numeric_limits<float>::quiet_NaN(); }},
      {"bad_logprob", [](rollout::GroupRollout& g) { g.episodes[0].turns[0].logprobs[0] = 3.0f; }},
      {"wrong_group_size", [](rollout::GroupRollout& g) { g.episodes.pop_back(); }},
      {"bad_version", [](rollout::GroupRollout& g) { g.behavior_version = 7; }},
      {"not_lease_holder", [](rollout::GroupRollout& g) { g.lease_id += 1000; }},
      {"unknown_group", [](rollout::GroupRollout& g) { g.group_id = 424242; }},
  };
  std::map<std::string, int64_t> expected;
  for (const Case& c : cases) {
    rollout::GroupRollout g = f.Valid();
    c.corrupt(g);
    rollout::SubmitOutcome out = f.hub.Submit(g);
    EXPECT_FALSE(out.accepted) << c.reason;
    EXPECT_EQ(out.reason, c.reason);
    ++expected[c.reason];
    // Dispatcher capacity would otherwise run out; expire the refused hand-out's lease.
    f.clock.Advance(11);
    f.dispatcher.ExpireLeases();
  }
  EXPECT_EQ(f.hub.refusals(), expected);
  EXPECT_TRUE(f.hub.Drain(0.0).empty());
}

TEST(TrajectoryIntakeTest, AcceptsValidGroupsAndRecomputesRewardsFromTokens) {
  HubFixture f;
  rollout::GroupRollout honest = f.Valid();
  ASSERT_TRUE(f.hub.Submit(honest).accepted);
  rollout::GroupRollout liar = f.Valid();
  // Wrong answer tokens, but the actor claims reward 1 and a matching text.
  liar.episodes[0].turns[0].tokens = {f.tok.Encode("7").value()[0], model::CharTokenizer::kEos};
  liar.episodes[0].turns[0].logprobs = {-0.1f, -0.1f};
  ASSERT_TRUE(f.hub.Submit(liar).accepted);
  std::vector<rollout::GroupRollout> got = f.hub.Drain(0.0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].episodes[0].reward, 1.0);
  EXPECT_EQ(got[0].prompt.text, f.task->TrainPrompt(got[0].group_id).text);
  EXPECT_EQ(got[1].episodes[0].reward, 0.0);
  EXPECT_FALSE(got[1].episodes[0].success);
  EXPECT_EQ(got[1].episodes[1].reward, 1.0);
  EXPECT_EQ(f.hub.refusals().at("reward_corrected"), 1);
  EXPECT_EQ(f.hub.actor_groups().at("a"), 2);
}

}  // namespace
}  // namespace echelon::learn
