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

// The math task, plus a replay of multi-turn episodes: reward 0.25 per action that is the
// prompt's answer; it records the actions it was given.
class ReplayingMath : public data::TaskAdapter {
 public:
  ReplayingMath() : math_(data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value()) {}
  std::string name() const override { return "replaying-math"; }
  std::string Alphabet() const override { return math_->Alphabet(); }
  data::Prompt TrainPrompt(uint64_t g) const override { return math_->TrainPrompt(g); }
  const std::vector<data::Prompt>& HeldOut() const override { return math_->HeldOut(); }
  Result<std::vector<data::Episode>> RunGroup(const data::Prompt& p, int n, data::Policy& policy,
                                              uint64_t seed) const override {
    return math_->RunGroup(p, n, policy, seed);
  }
  Result<data::Scored> Reward(const data::Prompt& p, const std::string& c) const override { return math_->Reward(p, c); }
  Result<std::optional<data::Scored>> RewardEpisode(const data::Prompt& p,
                                                    const std::vector<std::string>& actions) const override {
    replayed.push_back(actions);
    data::Scored s;
    for (const std::string& a : actions) s.reward += a == p.reference ? 0.25 : 0.0;
    return std::optional<data::Scored>(s);
  }
  size_t MaxTurns() const override { return 3; }
  std::string Demonstration(const data::Prompt& p) const override { return math_->Demonstration(p); }
  Status ExportHeldOut(const std::string& path) const override { return math_->ExportHeldOut(path); }
  mutable std::vector<std::vector<std::string>> replayed;

 private:
  std::unique_ptr<data::TaskAdapter> math_;
};

struct HubFixture {
  HubFixture()
      : dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock),
        task(std::make_unique<ReplayingMath>()),
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
  std::unique_ptr<ReplayingMath> task;
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
      // An episode of no turn, or of more turns than the task plays (ReplayingMath: 3).
      {"bad_turn_count", [](rollout::GroupRollout& g) { g.episodes[1].turns.clear(); }},
      {"bad_turn_count", [](rollout::GroupRollout& g) {
         g.episodes[0].turns.push_back(g.episodes[0].turns[0]);
         g.episodes[0].turns.push_back(g.episodes[0].turns[0]);
         g.episodes[0].turns.push_back(g.episodes[0].turns[0]);
       }},
      {"empty_completion", [](rollout::GroupRollout& g) {
         g.episodes[0].turns[0].tokens.clear();
         g.episodes[0].turns[0].logprobs.clear();
       }},
      {"bad_logprob",
       [](rollout::GroupRollout& g) { g.episodes[0].turns[0].logprobs[0] = std::numeric_limits<float>::quiet_NaN(); }},
      {"bad_logprob", [](rollout::GroupRollout& g) { g.episodes[0].turns[0].logprobs[0] = 3.0f; }},
      // Below what any sampled token can have.
      {"bad_logprob", [](rollout::GroupRollout& g) { g.episodes[1].turns[0].logprobs[1] = -1e30f; }},
      {"bad_logprob", [](rollout::GroupRollout& g) { g.episodes[1].turns[0].logprobs[0] = -111.0f; }},
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

TEST(TrajectoryIntakeTest, MultiTurnEpisodesTakeTheAdaptersReplayedReward) {
  HubFixture f;
  rollout::GroupRollout g = f.Valid();
  // Episode 0: three turns (right, wrong, right) claiming reward 5; episode 1: two wrong turns,
  // claiming 1. The replay gives 0.5 and 0.
  data::Turn wrong = g.episodes[0].turns[0];
  wrong.tokens = {f.tok.Encode("7").value()[0], model::CharTokenizer::kEos};
  wrong.logprobs = {-0.1f, -0.1f};
  g.episodes[0].turns = {g.episodes[0].turns[0], wrong, g.episodes[0].turns[0]};
  g.episodes[0].reward = 5.0;
  g.episodes[1].turns = {wrong, wrong};
  ASSERT_TRUE(f.hub.Submit(g).accepted);
  std::vector<rollout::GroupRollout> got = f.hub.Drain(0.0);
  ASSERT_EQ(got.size(), 1u);
  const std::string answer = got[0].prompt.reference;
  ASSERT_EQ(f.task->replayed.size(), 2u);
  EXPECT_EQ(f.task->replayed[0], (std::vector<std::string>{answer, "7", answer}));
  EXPECT_EQ(f.task->replayed[1], (std::vector<std::string>{"7", "7"}));
  EXPECT_EQ(got[0].episodes[0].reward, 0.5);
  EXPECT_EQ(got[0].episodes[1].reward, 0.0);
  EXPECT_EQ(f.hub.refusals().at("reward_corrected"), 2);
}

}  // namespace
}  // namespace echelon::learn
