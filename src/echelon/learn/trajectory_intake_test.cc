// TrajectoryIntake refuses malformed or hostile submissions with a counted reason, and recomputes the
// rewards it can verify instead of trusting the actor.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "echelon/learn/trajectory_intake.h"
#include "echelon/data/adapter.h"
#include "echelon/model/tokenizer.h"

namespace echelon::learn {
namespace {

// The math task. With max_turns > 1 it replays episodes of several turns: every turn sees the
// group's prompt, each right answer earns 0.25, and the episode ends after two right answers;
// it records the actions it was given.
class ReplayingMath : public data::TaskAdapter {
 public:
  explicit ReplayingMath(size_t max_turns)
      : math_(data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value()), max_turns_(max_turns) {}
  std::string name() const override { return "replaying-math"; }
  std::string Alphabet() const override { return math_->Alphabet(); }
  data::Prompt TrainPrompt(uint64_t g) const override { return math_->TrainPrompt(g); }
  const std::vector<data::Prompt>& HeldOut() const override { return math_->HeldOut(); }
  Result<std::vector<data::Episode>> RunGroup(const data::Prompt& p, int n, data::Policy& policy,
                                              uint64_t seed) const override {
    return math_->RunGroup(p, n, policy, seed);
  }
  // A reward that fails on one text, as a user's function may on text a worker chose.
  Result<data::Scored> Reward(const data::Prompt& p, const std::string& c) const override {
    if (c == kBreaksTheReward) return Internal("reward function raised on \"" + c + "\"");
    if (c == kSpendsTheBudget) return ResourceExhausted("the group's reward budget is spent on \"" + c + "\"");
    return math_->Reward(p, c);
  }
  static constexpr const char* kBreaksTheReward = "666";
  static constexpr const char* kSpendsTheBudget = "777";  // as a text the function takes minutes over
  Result<std::optional<data::Replay>> ReplayEpisode(const data::Prompt& p,
                                                    const std::vector<std::string>& actions) const override {
    replayed.push_back(actions);
    data::Replay r;
    int right = 0;
    for (size_t i = 0; i < actions.size() && right < 2; ++i) {
      r.prompts.push_back(data::PolicyPrompt::Of(p));
      if (actions[i] == p.reference) ++right;
    }
    r.scored.reward = 0.25 * right;
    return std::optional<data::Replay>(r);
  }
  size_t MaxTurns() const override { return max_turns_; }
  std::string Demonstration(const data::Prompt& p) const override { return math_->Demonstration(p); }
  Status ExportHeldOut(const std::string& path) const override { return math_->ExportHeldOut(path); }
  mutable std::vector<std::vector<std::string>> replayed;

 private:
  std::unique_ptr<data::TaskAdapter> math_;
  const size_t max_turns_;
};

constexpr int64_t kMaxNewTokens = 16;

struct HubFixture {
  explicit HubFixture(size_t max_turns = 1)
      : dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock),
        task(std::make_unique<ReplayingMath>(max_turns)),
        tok(model::CharTokenizer::ForAlphabet(task->Alphabet())),
        vocab(model::Vocabulary::Characters(task->Alphabet())),
        hub(&dispatcher, task.get(), &vocab, {vocab.id_end(), /*group_size=*/2, kMaxNewTokens}) {
    hub.Publish({0, std::make_shared<const std::string>()});  // the learner publishes v0 first
  }

  // A well-formed group for the next hand-out: both samples answer correctly (the answer is
  // the task's: a single-turn hand-out comes without it).
  contract::GroupRollout Valid(const std::string& actor = "a#1") {
    contract::Assignment a = hub.Acquire(actor).value();
    a.prompt.reference = task->TrainPrompt(a.work.group_id).reference;
    contract::GroupRollout g;
    g.group_id = a.work.group_id;
    g.lease_id = a.work.lease_id;
    g.actor = actor;
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

  // A well-formed group whose second sample is the text the task's reward raises on.
  contract::GroupRollout Breaking(const std::string& actor = "a#1", const char* text = ReplayingMath::kBreaksTheReward) {
    contract::GroupRollout g = Valid(actor);
    data::Turn& t = g.episodes[1].turns[0];
    t.tokens = tok.Encode(text).value();
    t.tokens.push_back(model::CharTokenizer::kEos);
    t.logprobs.assign(t.tokens.size(), -0.1f);
    return g;
  }

  // Submits `g`, then lets its hand-out end (a refused group's lease expires; the window stays open).
  contract::SubmitOutcome SubmitThenExpire(const contract::GroupRollout& g) {
    contract::SubmitOutcome out = hub.Submit(g);
    clock.Advance(11);
    dispatcher.ExpireLeases();
    return out;
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
    std::function<void(contract::GroupRollout&)> corrupt;
  };
  const std::vector<Case> cases = {
      {"token_out_of_vocab", [](contract::GroupRollout& g) { g.episodes[0].turns[0].tokens[0] = 9999; }},
      {"token_out_of_vocab", [](contract::GroupRollout& g) { g.episodes[1].turns[0].prompt_ids[0] = -1; }},
      {"length_mismatch", [](contract::GroupRollout& g) { g.episodes[0].turns[0].logprobs.pop_back(); }},
      // An episode of no turn, or of more turns than the task plays (one).
      {"bad_turn_count", [](contract::GroupRollout& g) { g.episodes[1].turns.clear(); }},
      {"bad_turn_count", [](contract::GroupRollout& g) { g.episodes[0].turns.push_back(g.episodes[0].turns[0]); }},
      {"empty_completion", [](contract::GroupRollout& g) {
         g.episodes[0].turns[0].tokens.clear();
         g.episodes[0].turns[0].logprobs.clear();
       }},
      {"bad_logprob",
       [](contract::GroupRollout& g) { g.episodes[0].turns[0].logprobs[0] = std::numeric_limits<float>::quiet_NaN(); }},
      {"bad_logprob", [](contract::GroupRollout& g) { g.episodes[0].turns[0].logprobs[0] = 3.0f; }},
      // Below what any sampled token can have.
      {"bad_logprob", [](contract::GroupRollout& g) { g.episodes[1].turns[0].logprobs[1] = -1e30f; }},
      {"bad_logprob", [](contract::GroupRollout& g) { g.episodes[1].turns[0].logprobs[0] = -111.0f; }},
      {"wrong_group_size", [](contract::GroupRollout& g) { g.episodes.pop_back(); }},
      {"bad_version", [](contract::GroupRollout& g) { g.behavior_version = 7; }},
      // Partial rollouts' per-token versions: one per token, none newer than the newest published.
      {"length_mismatch", [](contract::GroupRollout& g) { g.episodes[0].turns[0].versions = {0}; }},
      {"bad_token_version", [](contract::GroupRollout& g) {
         data::Turn& t = g.episodes[0].turns[0];
         t.versions.assign(t.tokens.size(), 5);
       }},
      {"not_lease_holder", [](contract::GroupRollout& g) { g.lease_id += 1000; }},
      {"foreign_lease", [](contract::GroupRollout& g) { g.actor = "b#2"; }},
      // A completion longer than rollout.max_new_tokens (a 50k-token completion, in short).
      {"too_long", [](contract::GroupRollout& g) {
         data::Turn& t = g.episodes[1].turns[0];
         t.tokens.assign(kMaxNewTokens + 1, t.tokens[0]);
         t.logprobs.assign(kMaxNewTokens + 1, -0.1f);
       }},
      // Prompt ids that are not the group's prompt: another prompt, or one token more.
      {"prompt_mismatch", [&f](contract::GroupRollout& g) {
         g.episodes[1].turns[0].prompt_ids = f.vocab.EncodePrompt(f.task->TrainPrompt(g.group_id + 7).text).value();
       }},
      {"prompt_mismatch", [](contract::GroupRollout& g) { g.episodes[0].turns[0].prompt_ids.push_back(4); }},
      {"unknown_group", [](contract::GroupRollout& g) { g.group_id = 424242; }},
  };
  const std::set<std::string> honest = {"not_lease_holder", "unknown_group"};
  std::map<std::string, int64_t> expected;
  for (const Case& c : cases) {
    contract::GroupRollout g = f.Valid();
    c.corrupt(g);
    contract::SubmitOutcome out = f.hub.Submit(g);
    EXPECT_FALSE(out.accepted) << c.reason;
    EXPECT_EQ(out.reason, c.reason);
    EXPECT_EQ(out.forged, honest.count(c.reason) == 0) << c.reason;
    ++expected[c.reason];
    // Dispatcher capacity would otherwise run out; expire the refused hand-out's lease.
    f.clock.Advance(11);
    f.dispatcher.ExpireLeases();
  }
  EXPECT_EQ(f.hub.refusals(), expected);
  EXPECT_TRUE(f.hub.Drain(0.0).empty());
}

TEST(TrajectoryIntakeTest, AGroupRefusedAfterItsLeaseCheckGoesToTheNextActor) {
  HubFixture f;
  contract::GroupRollout g = f.Valid();
  g.episodes[0].turns[0].prompt_ids.push_back(4);
  ASSERT_EQ(f.hub.Submit(g).reason, "prompt_mismatch");
  std::optional<contract::Assignment> next = f.hub.Acquire("c#3");
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->work.group_id, g.group_id);
  EXPECT_TRUE(next->work.reissue);
  EXPECT_EQ(f.dispatcher.counts().reissued, 1u);
}

TEST(TrajectoryIntakeTest, AReplayedOldSubmissionIsRefusedAsAlreadySettled) {
  HubFixture f;
  contract::GroupRollout g = f.Valid();
  ASSERT_TRUE(f.hub.Submit(g).accepted);
  contract::SubmitOutcome again = f.hub.Submit(g);
  EXPECT_EQ(again.reason, "already_settled");
  EXPECT_FALSE(again.forged);
  EXPECT_EQ(f.hub.Drain(0.0).size(), 1u);
}

TEST(TrajectoryIntakeTest, AcceptsValidGroupsAndRecomputesRewardsFromTokens) {
  HubFixture f;
  contract::GroupRollout honest = f.Valid();
  ASSERT_TRUE(f.hub.Submit(honest).accepted);
  contract::GroupRollout liar = f.Valid();
  // Wrong answer tokens, but the actor claims reward 1 and a matching text.
  liar.episodes[0].turns[0].tokens = {f.tok.Encode("7").value()[0], model::CharTokenizer::kEos};
  liar.episodes[0].turns[0].logprobs = {-0.1f, -0.1f};
  ASSERT_TRUE(f.hub.Submit(liar).accepted);
  std::vector<contract::GroupRollout> got = f.hub.Drain(0.0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].episodes[0].reward, 1.0);
  EXPECT_EQ(got[0].prompt.text, f.task->TrainPrompt(got[0].group_id).text);
  EXPECT_EQ(got[1].episodes[0].reward, 0.0);
  EXPECT_FALSE(got[1].episodes[0].success);
  EXPECT_EQ(got[1].episodes[1].reward, 1.0);
  // A single-turn worker is not asked to score: its claim is not counted as a correction.
  EXPECT_EQ(f.hub.refusals().count("reward_corrected"), 0u);
  EXPECT_EQ(f.hub.actor_groups().at("a"), 2);
}

// Single-turn work went out with its answer (AcquireReply.prompt_reference): a worker could
// hand in the answer it was told. The learner scores such groups, so the answer stays here.
TEST(TrajectoryIntakeTest, SingleTurnWorkIsHandedOutWithoutItsAnswer) {
  HubFixture f;
  contract::Assignment a = f.hub.Acquire("a#1").value();
  const data::Prompt full = f.task->TrainPrompt(a.work.group_id);
  ASSERT_FALSE(full.reference.empty());
  EXPECT_EQ(a.prompt.text, full.text);
  EXPECT_EQ(a.prompt.reference, "");
  EXPECT_TRUE(a.scored_by_learner);
  // The group the worker hands in (rewards 0: it did not score) is scored by the learner.
  contract::GroupRollout g = f.Valid();
  for (data::Episode& e : g.episodes) e.reward = 0;
  ASSERT_TRUE(f.hub.Submit(g).accepted);
  std::vector<contract::GroupRollout> got = f.hub.Drain(0.0);
  ASSERT_EQ(got.size(), 1u);
  for (const data::Episode& e : got[0].episodes) EXPECT_EQ(e.reward, 1.0);
  EXPECT_EQ(got[0].prompt.reference, f.task->TrainPrompt(got[0].group_id).reference);
}

// A multi-turn worker plays against its environment, which needs the whole prompt.
TEST(TrajectoryIntakeTest, MultiTurnWorkKeepsItsPrompt) {
  HubFixture f(/*max_turns=*/3);
  contract::Assignment a = f.hub.Acquire("a#1").value();
  EXPECT_EQ(a.prompt.reference, f.task->TrainPrompt(a.work.group_id).reference);
  EXPECT_FALSE(a.scored_by_learner);
}

// The worker's text of a turn was kept as sent (unbounded: 32 MiB per group held in the
// queue); the learner keeps its own decoding of the tokens.
TEST(TrajectoryIntakeTest, TheLearnerKeepsItsOwnDecodingNotTheWorkersText) {
  HubFixture f;
  contract::GroupRollout g = f.Valid();
  g.episodes[0].turns[0].text.assign(1 << 20, 'x');
  ASSERT_TRUE(f.hub.Submit(g).accepted);
  std::vector<contract::GroupRollout> got = f.hub.Drain(0.0);
  ASSERT_EQ(got.size(), 1u);
  for (const data::Episode& e : got[0].episodes) EXPECT_EQ(e.turns[0].text, got[0].prompt.reference);
}

TEST(TrajectoryIntakeTest, MultiTurnEpisodesTakeTheAdaptersReplayedReward) {
  HubFixture f(/*max_turns=*/3);
  contract::GroupRollout g = f.Valid();
  // Episode 0: three turns (right, wrong, right) claiming reward 5; episode 1: two wrong turns,
  // claiming 1. The replay gives 0.5 and 0.
  data::Turn wrong = g.episodes[0].turns[0];
  wrong.tokens = {f.tok.Encode("7").value()[0], model::CharTokenizer::kEos};
  wrong.logprobs = {-0.1f, -0.1f};
  g.episodes[0].turns = {g.episodes[0].turns[0], wrong, g.episodes[0].turns[0]};
  g.episodes[0].reward = 5.0;
  g.episodes[1].turns = {wrong, wrong};
  ASSERT_TRUE(f.hub.Submit(g).accepted);
  std::vector<contract::GroupRollout> got = f.hub.Drain(0.0);
  ASSERT_EQ(got.size(), 1u);
  const std::string answer = got[0].prompt.reference;
  ASSERT_EQ(f.task->replayed.size(), 2u);
  EXPECT_EQ(f.task->replayed[0], (std::vector<std::string>{answer, "7", answer}));
  EXPECT_EQ(f.task->replayed[1], (std::vector<std::string>{"7", "7"}));
  EXPECT_EQ(got[0].episodes[0].reward, 0.5);
  EXPECT_EQ(got[0].episodes[1].reward, 0.0);
  EXPECT_EQ(f.hub.refusals().at("reward_corrected"), 2);
}

TEST(TrajectoryIntakeTest, MultiTurnActionsAfterTheEpisodeEndedAreForged) {
  HubFixture f(/*max_turns=*/3);
  contract::GroupRollout g = f.Valid();
  // Two right answers end the episode: a third action was never asked for.
  g.episodes[0].turns = {g.episodes[0].turns[0], g.episodes[0].turns[0], g.episodes[0].turns[0]};
  contract::SubmitOutcome out = f.hub.Submit(g);
  EXPECT_EQ(out.reason, "actions_after_done");
  EXPECT_TRUE(out.forged);
}

TEST(TrajectoryIntakeTest, MultiTurnPromptIdsMustBeTheReplayedObservations) {
  HubFixture f(/*max_turns=*/3);
  contract::GroupRollout g = f.Valid();
  data::Turn swapped = g.episodes[1].turns[0];
  swapped.prompt_ids = f.vocab.EncodePrompt("1+1=").value();
  g.episodes[1].turns = {g.episodes[1].turns[0], swapped};
  g.episodes[1].turns[0].tokens = {f.tok.Encode("7").value()[0], model::CharTokenizer::kEos};
  g.episodes[1].turns[0].logprobs = {-0.1f, -0.1f};
  EXPECT_EQ(f.hub.Submit(g).reason, "prompt_mismatch");
}

// A claimed version that was never published (the learner publishes every rl.publish_period
// updates) used to pass as "unverifiable"; one from before a restart cannot be verified either
// (its snapshot is gone), but an honest actor may still hold it.
TEST(TrajectoryIntakeTest, UnpublishedVersionsAreForgedAndVersionsBeforeARestartAreRefused) {
  HubFixture f;
  f.hub.Publish({2, std::make_shared<const std::string>()});  // v1 was never published
  contract::GroupRollout g = f.Valid();
  g.behavior_version = 1;
  contract::SubmitOutcome out = f.hub.Submit(g);
  EXPECT_EQ(out.reason, "unpublished_version");
  EXPECT_TRUE(out.forged);
  f.clock.Advance(11);
  f.dispatcher.ExpireLeases();
  for (int64_t v : {0, 2}) {
    contract::GroupRollout ok = f.Valid();
    ok.behavior_version = v;
    EXPECT_TRUE(f.hub.Submit(ok).accepted) << v;
  }

  // A resumed learner publishes v5 first: v3 predates it (honest, not a strike), v4 never was.
  HubFixture resumed;
  TrajectoryIntake fresh(&resumed.dispatcher, resumed.task.get(), &resumed.vocab,
                         {resumed.vocab.id_end(), /*group_size=*/2, kMaxNewTokens});
  fresh.Publish({5, std::make_shared<const std::string>()});
  contract::GroupRollout old = resumed.Valid();
  old.behavior_version = 3;
  out = fresh.Submit(old);
  EXPECT_EQ(out.reason, "predates_restart");
  EXPECT_FALSE(out.forged);
}

// A completion that makes the user's reward raise ended the whole run: any worker could stop
// it. Now that group is refused (reward_error, not a strike: an honest worker's ordinary text
// may hit a bug in the reward) and the run goes on; a reward that fails on
// kRewardFailuresToStop groups in a row is broken, and the run stops with its error.
TEST(TrajectoryIntakeTest, ARewardThatFailsOnAWorkersTextRefusesTheGroupAndTheRunGoesOn) {
  HubFixture f;
  const auto breaking = [&f] { return f.Breaking(); };
  const auto submit = [&f](const contract::GroupRollout& g) { return f.SubmitThenExpire(g); };
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i + 1 < kRewardFailuresToStop; ++i) {
      contract::SubmitOutcome out = submit(breaking());
      EXPECT_EQ(out.reason, "reward_error");
      EXPECT_FALSE(out.forged);
    }
    EXPECT_TRUE(f.hub.failure().ok()) << f.hub.failure().message();
    EXPECT_TRUE(submit(f.Valid()).accepted);  // the reward works: the count starts again
  }
  EXPECT_EQ(f.hub.refusals().at("reward_error"), 3 * (kRewardFailuresToStop - 1));
  for (int64_t i = 0; i < kRewardFailuresToStop; ++i) submit(breaking());
  EXPECT_FALSE(f.hub.failure().ok());
  EXPECT_NE(f.hub.failure().message().find("reward function raised"), std::string::npos) << f.hub.failure().message();
}

// One worker's burst of 16 texts that break the reward, sent in milliseconds, stopped the run
// with no strike. Failures from one worker among several no longer stop it, and strike that
// worker every kRewardFailuresPerStrike; failures across workers still do (a broken reward).
TEST(TrajectoryIntakeTest, OneWorkersRewardFailuresStrikeItAndCannotStopTheRun) {
  HubFixture f;
  const auto breaking = [&f](const std::string& actor) { return f.Breaking(actor); };
  const auto submit = [&f](const contract::GroupRollout& g) { return f.SubmitThenExpire(g); };
  ASSERT_TRUE(submit(f.Valid("honest#1")).accepted);
  int64_t strikes = 0;
  for (int64_t i = 1; i <= 3 * kRewardFailuresToStop; ++i) {
    const contract::SubmitOutcome out = submit(breaking("mallory#1"));
    EXPECT_EQ(out.reason, "reward_error");
    EXPECT_EQ(out.forged, i % kRewardFailuresPerStrike == 0) << i;
    strikes += out.forged;
  }
  EXPECT_TRUE(f.hub.failure().ok()) << f.hub.failure().message();
  EXPECT_EQ(strikes, 3 * kRewardFailuresToStop / kRewardFailuresPerStrike);
  EXPECT_EQ(f.hub.actor_forged().at("mallory"), strikes);
  // The honest worker's text breaks it too: the reward is broken, and the run stops.
  const contract::SubmitOutcome honest = submit(breaking("honest#1"));
  EXPECT_FALSE(honest.forged);
  EXPECT_FALSE(f.hub.failure().ok());
  EXPECT_EQ(f.hub.actor_forged().count("honest"), 0u);
}

// A text that makes the reward slow held the reward for the group's whole budget and cost its
// worker nothing. A group past the budget is now refused as reward_slow (re-issued, no strike
// on its own: an honest text can be slow), and one worker's slow groups alone strike it every
// kSlowRewardsPerStrike; they cannot stop the run.
TEST(TrajectoryIntakeTest, OneWorkersSlowRewardGroupsStrikeItAndCannotStopTheRun) {
  HubFixture f;
  const auto slow = [&f](const std::string& actor) { return f.Breaking(actor, ReplayingMath::kSpendsTheBudget); };
  const auto submit = [&f](const contract::GroupRollout& g) { return f.SubmitThenExpire(g); };
  ASSERT_TRUE(submit(f.Valid("honest#1")).accepted);
  int64_t strikes = 0;
  for (int64_t i = 1; i <= kRewardFailuresToStop + 2; ++i) {
    const contract::SubmitOutcome out = submit(slow("mallory#1"));
    EXPECT_EQ(out.reason, "reward_slow");
    EXPECT_EQ(out.forged, i % kSlowRewardsPerStrike == 0) << i;
    strikes += out.forged;
  }
  EXPECT_TRUE(f.hub.failure().ok()) << f.hub.failure().message();
  EXPECT_EQ(strikes, (kRewardFailuresToStop + 2) / kSlowRewardsPerStrike);
  EXPECT_EQ(f.hub.refusals().at("reward_slow"), kRewardFailuresToStop + 2);
  // An accepted group of mallory's starts its count again.
  ASSERT_TRUE(submit(f.Valid("mallory#1")).accepted);
  EXPECT_FALSE(submit(slow("mallory#1")).forged);
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// Partial rollouts: tokens of newer published versions than the group's pass; a token older
// than the group's claimed (oldest) version, versions going back along a turn, or an
// unpublished one are refused as forged.
TEST(TrajectoryIntakeTest, PerTokenVersionsAreNeverOlderThanTheGroupsNorGoBack) {
  HubFixture f;
  f.hub.Publish({1, std::make_shared<const std::string>()});
  f.hub.Publish({3, std::make_shared<const std::string>()});  // v2 never published
  const auto with = [&](int64_t behavior, const std::function<int64_t(size_t, size_t)>& version) {
    contract::GroupRollout g = f.Valid();
    g.behavior_version = behavior;
    for (data::Episode& e : g.episodes)
      for (data::Turn& t : e.turns)
        for (size_t i = 0; i < t.tokens.size(); ++i) t.versions.push_back(version(i, t.tokens.size()));
    contract::SubmitOutcome out = f.hub.Submit(g);
    f.clock.Advance(11);
    f.dispatcher.ExpireLeases();
    return out;
  };
  const contract::SubmitOutcome moved = with(1, [](size_t i, size_t n) { return i < n / 2 ? 1 : 3; });
  EXPECT_TRUE(moved.accepted) << moved.reason;
  for (const auto& [behavior, version, reason] :
       std::vector<std::tuple<int64_t, std::function<int64_t(size_t, size_t)>, std::string>>{
           {1, [](size_t, size_t) { return int64_t{0}; }, "bad_token_version"},                  // older than claimed
           {0, [](size_t i, size_t n) { return i < n / 2 ? 3 : 1; }, "bad_token_version"},      // goes back
           {0, [](size_t i, size_t n) { return i < n / 2 ? 0 : 2; }, "unpublished_version"}}) {
    const contract::SubmitOutcome out = with(behavior, version);
    EXPECT_EQ(out.reason, reason);
    EXPECT_TRUE(out.forged) << reason;
  }
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// Router replay: only routes an engine could have recorded are trained with.
TEST(RouteRefusalTest, OnlyRoutesAtFedPositionsOfSparseLayersWithDistinctExpertsPass) {
  model::ModelConfig cfg;
  cfg.model_type = "qwen3_moe";
  cfg.num_hidden_layers = 3;
  cfg.num_experts = 4;
  cfg.num_experts_per_tok = 2;
  cfg.mlp_only_layers = {0};  // layers 1 and 2 are sparse
  data::Turn t;
  t.prompt_ids = {1, 2, 3};
  t.tokens = {4, 5};  // fed positions 0..3
  const auto with = [&](std::vector<int32_t> p, std::vector<int16_t> l, std::vector<int16_t> e) {
    data::Turn u = t;
    u.routes.positions = std::move(p);
    u.routes.layers = std::move(l);
    u.routes.experts = std::move(e);
    return u;
  };
  EXPECT_EQ(RouteRefusal(t, nullptr), "") << "no routes: nothing to check";
  EXPECT_EQ(RouteRefusal(with({0, 0, 3}, {1, 2, 1}, {0, 1, 3, 2, 1, 0}), &cfg), "");
  EXPECT_EQ(RouteRefusal(with({0}, {1}, {0, 1}), nullptr), "unexpected_routes") << "replay off";
  EXPECT_EQ(RouteRefusal(with({4}, {1}, {0, 1}), &cfg), "bad_routes") << "the last token is never fed";
  EXPECT_EQ(RouteRefusal(with({-1}, {1}, {0, 1}), &cfg), "bad_routes");
  EXPECT_EQ(RouteRefusal(with({0}, {0}, {0, 1}), &cfg), "bad_routes") << "a dense layer";
  EXPECT_EQ(RouteRefusal(with({0}, {3}, {0, 1}), &cfg), "bad_routes") << "no such layer";
  EXPECT_EQ(RouteRefusal(with({0}, {1}, {2, 2}), &cfg), "bad_routes") << "an expert twice";
  EXPECT_EQ(RouteRefusal(with({0}, {1}, {0, 4}), &cfg), "bad_routes") << "no such expert";
  EXPECT_EQ(RouteRefusal(with({0}, {1}, {0, 1, 2}), &cfg), "bad_routes") << "not k experts an entry";
  EXPECT_EQ(RouteRefusal(with({1, 1}, {2, 1}, {0, 1, 0, 1}), &cfg), "bad_routes") << "out of order";
  EXPECT_EQ(RouteRefusal(with({1, 1}, {1, 1}, {0, 1, 0, 1}), &cfg), "bad_routes") << "an entry twice";
  EXPECT_EQ(RouteRefusal(with({1, 2}, {1}, {0, 1, 0, 1}), &cfg), "bad_routes") << "fewer layers than positions";
}

}  // namespace
}  // namespace echelon::learn
