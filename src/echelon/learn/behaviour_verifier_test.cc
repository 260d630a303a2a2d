// BehaviourVerifier recomputes behaviour log-probs under the claimed version: honest groups pass
// (the generator's log-probs equal the recomputation), a lie about the version, made-up
// log-probs and a sample from other weights are refused.
#include "echelon/learn/behaviour_verifier.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "echelon/contract/group_seed.h"
#include "echelon/learn/run_options.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/testing.h"
#include "echelon/model/generate.h"

namespace echelon::learn {
namespace {

VerifyOptions Options(double temperature) {
  VerifyOptions o;
  o.fraction = 1.0;
  o.tolerance = 1e-3;
  o.window = 2;
  o.sampling.temperature = temperature;
  return o;
}

contract::GroupRollout Sampled(model::Qwen3Model& m, int64_t claimed_version, uint64_t group_id) {
  std::vector<LearnerGroup> groups = SampleGroups(m, /*temperature=*/0.8, /*group_size=*/3);
  contract::GroupRollout g;
  g.group_id = group_id;
  g.lease_id = group_id + 1;
  g.actor = "a#1";
  g.behavior_version = claimed_version;
  g.episodes = groups[group_id % groups.size()].episodes;
  return g;
}

struct Versions {
  Versions() : v0(TinyConfig()), v1(TinyConfig()) {
    v0->InitWeights(1);
    v1->InitWeights(2);
  }
  model::Qwen3Model v0, v1;
};

TEST(BehaviourVerifierTest, HonestGroupsPassAndLiesAboutTheVersionOrTheLogprobsAreRefused) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), Options(0.8));
  v.Remember(MakeSnapshot(m.v0, 0).value());
  v.Remember(MakeSnapshot(m.v1, 1).value());
  EXPECT_EQ(v.Check(Sampled(m.v0, 0, 0), false).value(), "");
  EXPECT_EQ(v.Check(Sampled(m.v1, 1, 1), false).value(), "");
  EXPECT_LT(v.stats().max_gap, 1e-5);
  // Sampled under v0, claimed as v1 (a version it never fetched).
  EXPECT_EQ(v.Check(Sampled(m.v0, 1, 2), false).value(), "logprob_mismatch");
  // The right version, made-up log-probs.
  contract::GroupRollout madeup = Sampled(m.v1, 1, 0);
  for (data::Episode& e : madeup.episodes)
    for (float& lp : e.turns[0].logprobs) lp = -0.01f;
  EXPECT_EQ(v.Check(madeup, false).value(), "logprob_mismatch");
  EXPECT_EQ(v.stats().checked, 4);
  EXPECT_EQ(v.stats().mismatched, 2);
}

// One token's log-prob claimed far from the truth among many right ones passed: the group's mean
// gap stayed under the tolerance (20 nats low in a group of 1,000 tokens is 0.02 on average)
// while the lie drove that token's importance weight. Each token's gap is checked too.
TEST(BehaviourVerifierTest, ASparseLieUnderTheMeanToleranceIsCaughtByItsToken) {
  Versions m;
  VerifyOptions o = Options(0.8);
  o.tolerance = 1.0;  // so loose that the lie's mean passes
  o.token_tolerance = 1.0;
  BehaviourVerifier v(TinyConfig(), o);
  v.Remember(MakeSnapshot(m.v0, 0).value());
  contract::GroupRollout sparse = Sampled(m.v0, 0, 0);
  int64_t tokens = 0;
  for (const data::Episode& e : sparse.episodes) tokens += static_cast<int64_t>(e.turns[0].logprobs.size());
  ASSERT_GT(tokens, 3);
  sparse.episodes[0].turns[0].logprobs[0] -= 3.0f;  // mean gap 3 / tokens, under 1
  EXPECT_EQ(v.Check(sparse, false).value(), "logprob_mismatch");
  EXPECT_EQ(v.Check(Sampled(m.v0, 0, 1), false).value(), "");
  EXPECT_LT(v.stats().max_token_gap, 1e-4);
}

TEST(BehaviourVerifierTest, OnlyDrawnGroupsAndSuspectsAreCheckedAndOldVersionsAreForgotten) {
  Versions m;
  BehaviourVerifier none(TinyConfig(), {/*fraction=*/0.0, 1e-3, 2, 0.8});
  none.Remember(MakeSnapshot(m.v0, 0).value());
  contract::GroupRollout lie = Sampled(m.v1, 0, 0);
  EXPECT_EQ(none.Check(lie, /*suspect=*/false).value(), "");  // not drawn
  EXPECT_EQ(none.Check(lie, /*suspect=*/true).value(), "logprob_mismatch");

  BehaviourVerifier some(TinyConfig(), {/*fraction=*/0.25, 1e-3, /*window=*/0, 0.8});
  some.Remember(MakeSnapshot(m.v0, 0).value());
  some.Remember(MakeSnapshot(m.v1, 1).value());  // v0 is forgotten
  contract::GroupRollout old = Sampled(m.v0, 0, 0);
  EXPECT_EQ(some.Check(old, true).value(), "");
  EXPECT_EQ(some.stats().unverifiable, 1);
  contract::GroupRollout g = Sampled(m.v0, 1, 0);  // a lie: the drawn ones are refused
  int drawn = 0;
  for (uint64_t id = 0; id < 200; ++id) {
    g.group_id = id;
    if (some.Check(g, false).value() == "logprob_mismatch") ++drawn;
  }
  EXPECT_GT(drawn, 25);  // 50 expected, sd 6
  EXPECT_LT(drawn, 75);
}

// Under rl.staleness: auto, S rose to 64 while the verifier kept the snapshots of the starting
// S + 2 versions, so older claims went unchecked. It now keeps every snapshot within the run's
// largest S (LargestStaleness) of the newest, however many were published.
TEST(BehaviourVerifierTest, KeepsEveryVersionWithinTheLargestStaleness) {
  RunOptions auto_s;
  auto_s.staleness = 4;
  auto_s.staleness_control = sched::StalenessControlOptions{};
  auto_s.staleness_control->max = 64;
  EXPECT_EQ(LargestStaleness(auto_s), 64);
  RunOptions fixed;
  fixed.staleness = 3;
  EXPECT_EQ(LargestStaleness(fixed), 3);

  Versions m;
  BehaviourVerifier v(TinyConfig(), {/*fraction=*/0.0, 1e-3, /*window=*/8, 0.8});
  for (int64_t version = 0; version <= 10; ++version) v.Remember(MakeSnapshot(m.v0, version).value());
  EXPECT_EQ(v.Check(Sampled(m.v0, 2, 0), /*suspect=*/true).value(), "");  // 8 behind: kept, checked
  EXPECT_EQ(v.Check(Sampled(m.v1, 2, 0), /*suspect=*/true).value(), "logprob_mismatch");
  EXPECT_EQ(v.stats().checked, 2);
  EXPECT_EQ(v.Check(Sampled(m.v1, 1, 0), /*suspect=*/true).value(), "");  // 9 behind: gone
  EXPECT_EQ(v.stats().unverifiable, 1);
}

// Under rl.staleness: auto the verifier held up to 65 whole snapshots in the learner's memory.
// With a spill directory only the newest (the publisher's own) and what fits memory_bytes stay
// in RAM; the rest are files, mapped when a check needs them, and deleted as they leave the
// window; checks give the same answers either way.
TEST(BehaviourVerifierTest, OlderSnapshotsLiveOnDiskAndAreCheckedTheSame) {
  Versions m;
  const std::string dir = ::testing::TempDir() + "/verifier-spill";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  VerifyOptions o = Options(0.8);
  o.window = 3;
  o.spill_dir = dir;
  const int64_t snapshot_bytes = static_cast<int64_t>(MakeSnapshot(m.v0, 0).value().weights->size());
  o.memory_bytes = snapshot_bytes;  // room for one besides the newest
  {
    BehaviourVerifier v(TinyConfig(), o);
    for (int64_t version = 0; version <= 4; ++version)
      v.Remember(MakeSnapshot(version % 2 == 0 ? m.v0 : m.v1, version).value());
    // Kept: v1..v4. In RAM: v4 (newest) and v3; on disk: v1 and v2; v0 gone with the window.
    EXPECT_EQ(v.stats().resident_bytes, 2 * snapshot_bytes);
    EXPECT_EQ(v.stats().spilled_bytes, 2 * snapshot_bytes);
    EXPECT_FALSE(std::filesystem::exists(dir + "/v0.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/v1.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/v2.safetensors"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/v3.safetensors"));
    EXPECT_EQ(std::filesystem::status(dir + "/v1.safetensors").permissions() & std::filesystem::perms::all,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    EXPECT_EQ(v.Check(Sampled(m.v1, 1, 0), false).value(), "");  // from the file
    EXPECT_EQ(v.Check(Sampled(m.v0, 2, 1), false).value(), "");  // from the other file
    EXPECT_EQ(v.Check(Sampled(m.v0, 1, 2), false).value(), "logprob_mismatch");  // v0's sample claimed as v1
    EXPECT_EQ(v.Check(Sampled(m.v1, 3, 0), false).value(), "");  // from RAM
    v.Remember(MakeSnapshot(m.v1, 5).value());
    EXPECT_FALSE(std::filesystem::exists(dir + "/v1.safetensors")) << "left the window";
    EXPECT_TRUE(std::filesystem::exists(dir + "/v3.safetensors")) << "no longer fits beside v4 and v5";
    EXPECT_EQ(v.Check(Sampled(m.v1, 3, 1), false).value(), "");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the verifier removes its files";
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// Partial rollouts: a turn whose first tokens v0 drew and whose rest v1 drew (each log-prob its
// own version's over the whole prefix) passes with each token's version, and is refused when
// the versions are dropped (all v0's) or put the other way round.
TEST(BehaviourVerifierTest, EachTokenIsCheckedUnderItsOwnVersion) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), Options(0.8));
  v.Remember(MakeSnapshot(m.v0, 0).value());
  v.Remember(MakeSnapshot(m.v1, 1).value());
  contract::GroupRollout g = Sampled(m.v0, 0, 0);
  for (data::Episode& e : g.episodes)
    for (data::Turn& t : e.turns) {
      const std::vector<float> under0 = model::ScoreCompletion(m.v0, t.prompt_ids, t.tokens, 0.8);
      const std::vector<float> under1 = model::ScoreCompletion(m.v1, t.prompt_ids, t.tokens, 0.8);
      const size_t switch_at = t.tokens.size() / 2;
      t.versions.clear();
      for (size_t i = 0; i < t.tokens.size(); ++i) {
        t.versions.push_back(i < switch_at ? 0 : 1);
        t.logprobs[i] = i < switch_at ? under0[i] : under1[i];
      }
    }
  EXPECT_EQ(v.Check(g, false).value(), "");
  EXPECT_LT(v.stats().max_gap, 1e-5);
  contract::GroupRollout dropped = g;
  for (data::Episode& e : dropped.episodes)
    for (data::Turn& t : e.turns) t.versions.clear();
  EXPECT_EQ(v.Check(dropped, false).value(), "logprob_mismatch");
  contract::GroupRollout swapped = g;
  for (data::Episode& e : swapped.episodes)
    for (data::Turn& t : e.turns)
      for (int64_t& version : t.versions) version = 1 - version;
  EXPECT_EQ(v.Check(swapped, false).value(), "logprob_mismatch");
}

// --- Seeded draws ----------------------------------------------------------------------------

// Router replay: an engine whose router chose otherwise (exaggerated here: another router, one
// expert per token so the router's weights do not enter the output) claims the log-probs of its
// own routes. With the routes the group carries, the verifier recomputes exactly those; without
// them, or with a trust of 0 (no route the snapshot would not choose itself), it cannot.
TEST(BehaviourVerifierTest, AGroupsRoutesAreReplayedWhereTheSnapshotTrustsThem) {
  model::ModelConfig cfg = TinyMoeConfig();
  cfg.num_experts_per_tok = 1;
  model::Qwen3Model weights(cfg), engine(cfg);
  weights->InitWeights(3);
  engine->InitWeights(4);
  {
    at::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> state = weights->StateDict();
    state.at("model.layers.1.mlp.gate.weight") = engine->StateDict().at("model.layers.1.mlp.gate.weight") * 20.0;
    ASSERT_TRUE(engine->LoadStateDict(state, "engine").ok());
  }
  contract::GroupRollout g;
  g.group_id = 0;
  g.actor = "a#1";
  const std::vector<int64_t> prompt = {1, 5, 7, 3};
  model::SamplingParams sp;
  sp.temperature = 0.8;
  sp.max_new_tokens = 6;
  sp.route_margin = 1e9;
  std::vector<model::Completion> out;
  {
    at::NoGradGuard no_grad;
    out = model::Generate(engine, {prompt, prompt, prompt}, sp);
  }
  for (model::Completion& c : out) {
    data::Episode e;
    e.turns.push_back({prompt, c.tokens, c.logprobs, ""});
    e.turns.back().routes = c.routes;
    g.episodes.push_back(e);
  }
  for (const double trust : {1.0, 0.0}) {
    VerifyOptions o = Options(0.8);
    o.route_trust = trust;
    BehaviourVerifier v(cfg, o);
    v.Remember(MakeSnapshot(weights, 0).value());
    EXPECT_EQ(v.Check(g, false).value(), trust > 0 ? "" : "logprob_mismatch") << "trust " << trust;
    if (trust > 0) EXPECT_LT(v.stats().max_gap, 1e-5);
    contract::GroupRollout bare = g;
    for (data::Episode& e : bare.episodes) e.turns[0].routes = Routes();
    EXPECT_EQ(v.Check(bare, false).value(), "logprob_mismatch") << "the snapshot's own routes differ";
  }
}

const RunSecret kRunSecret = RunSecret::FromSeed(11);

VerifyOptions DrawOptions() {
  VerifyOptions o = Options(1.0);
  o.sampling.top_k = 12;  // a filter, so that the verifier applies the sampler's filters too
  o.secret = kRunSecret;
  o.draws = true;
  return o;
}

// `rows` completions of `prompt` as an actor samples a group (contract::GroupSeed of the run's
// secret and the group), under `params` (DrawOptions' sampling and 6 new tokens).
std::vector<model::Completion> Draw(model::Qwen3Model& m, const std::vector<int64_t>& prompt, uint64_t group_id,
                                    int rows) {
  model::SamplingParams sp = DrawOptions().sampling;
  sp.max_new_tokens = 6;
  sp.seed = contract::GroupSeed(kRunSecret, group_id);
  at::NoGradGuard no_grad;
  return model::Generate(m, std::vector<std::vector<int64_t>>(static_cast<size_t>(rows), prompt), sp);
}

contract::GroupRollout Group(const std::vector<int64_t>& prompt, uint64_t group_id,
                             const std::vector<model::Completion>& completions) {
  contract::GroupRollout g;
  g.group_id = group_id;
  g.lease_id = group_id + 1;
  g.actor = "a#1";
  for (const model::Completion& c : completions) {
    data::Episode e;
    e.turns.push_back({prompt, c.tokens, c.logprobs, ""});
    g.episodes.push_back(e);
  }
  return g;
}

// 1,000 honest groups of echelon's engine: every token is its seeded draw, recomputed by the
// verifier from teacher-forced logits (the engine decodes with a KV cache in batches).
TEST(BehaviourVerifierTest, HonestSeededSamplesAreTheirDrawsTokenForToken) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), DrawOptions());
  v.Remember(MakeSnapshot(m.v0, 0).value());
  int64_t tokens = 0;
  for (uint64_t id = 0; id < 1000; ++id) {
    const std::vector<int64_t> prompt = {1, static_cast<int64_t>(2 + id % 13), static_cast<int64_t>(3 + id % 7)};
    const std::vector<model::Completion> c = Draw(m.v0, prompt, id, 2);
    for (const model::Completion& x : c) tokens += static_cast<int64_t>(x.tokens.size());
    ASSERT_EQ(v.Check(Group(prompt, id, c), false).value(), "") << "group " << id;
  }
  EXPECT_EQ(v.stats().draws_checked, tokens);
  EXPECT_EQ(v.stats().draw_mismatched, 0);
  EXPECT_EQ(v.stats().near_ties, 0) << "the same engine and dtype: no token needs the tolerance";
}

// A worker that draws 4G samples and submits the G it likes (true log-probs, so the log-prob
// check passes) is refused: sample j must be the draw of sample index j.
TEST(BehaviourVerifierTest, CherryPickedSamplesAreNotTheirDraws) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), DrawOptions());
  v.Remember(MakeSnapshot(m.v0, 0).value());
  const std::vector<int64_t> prompt = {1, 5, 7};
  const std::vector<model::Completion> many = Draw(m.v0, prompt, 3, 16);
  // Pick 4 samples other than the first four whose tokens differ from the first four's.
  std::vector<model::Completion> chosen;
  for (size_t i = 4; i < many.size() && chosen.size() < 4; ++i)
    if (many[i].tokens != many[chosen.size()].tokens) chosen.push_back(many[i]);
  ASSERT_EQ(chosen.size(), 4u);
  EXPECT_EQ(v.Check(Group(prompt, 3, chosen), false).value(), "sample_not_drawn");
  EXPECT_EQ(v.stats().draw_mismatched, 1);
  // The first four, as drawn, pass.
  EXPECT_EQ(v.Check(Group(prompt, 3, std::vector<model::Completion>(many.begin(), many.begin() + 4)), false).value(), "");
}

// Text of the worker's own, teacher-forced (its true log-probs under the policy) is refused.
TEST(BehaviourVerifierTest, TeacherForcedTextIsNotADraw) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), DrawOptions());
  v.Remember(MakeSnapshot(m.v0, 0).value());
  const std::vector<int64_t> prompt = {1, 9};
  std::vector<model::Completion> c = Draw(m.v0, prompt, 5, 2);
  // Sample 1 replaced by a completion chosen by hand, with the log-probs the policy gives it.
  model::Completion forced;
  forced.tokens = {4, 4, 4, 4};
  if (forced.tokens == c[1].tokens) forced.tokens = {6, 6, 6, 6};
  {
    at::NoGradGuard no_grad;
    forced.logprobs = model::ScoreCompletion(m.v0, prompt, forced.tokens, 1.0);
  }
  c[1] = forced;
  EXPECT_EQ(v.Check(Group(prompt, 5, c), false).value(), "sample_not_drawn");
}

// An evaluation set sampled greedily (its own temperature 0, passed to Check): honest greedy
// completions pass, their log-probs at temperature 1 as the engine reports them; a completion
// of the worker's choosing that is not the greedy one, with its true log-probs, is refused
// (the tokens of a greedy group are their argmax), and the honest group checked at the run's
// sampling is not its seeded draws.
TEST(BehaviourVerifierTest, AGreedyGroupsTokensAreItsArgmaxAtItsOwnTemperature) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), DrawOptions());
  v.Remember(MakeSnapshot(m.v0, 0).value());
  model::SamplingParams greedy = DrawOptions().sampling;
  greedy.temperature = 0;
  greedy.max_new_tokens = 6;
  const std::vector<int64_t> prompt = {1, 5, 7};
  std::vector<model::Completion> c;
  {
    at::NoGradGuard no_grad;
    c = model::Generate(m.v0, {prompt, prompt}, greedy);
  }
  EXPECT_EQ(v.Check(Group(prompt, 9, c), false, &greedy).value(), "");
  // At the run's sampling (temperature 1, as greedy log-probs are) the tokens are not the seeded draws.
  EXPECT_EQ(v.Check(Group(prompt, 9, c), false).value(), "sample_not_drawn");
  model::Completion other;
  other.tokens = c[1].tokens;
  other.tokens[0] = other.tokens[0] == 4 ? 6 : 4;
  {
    at::NoGradGuard no_grad;
    other.logprobs = model::ScoreCompletion(m.v0, prompt, other.tokens, 1.0);
  }
  c[1] = other;
  EXPECT_EQ(v.Check(Group(prompt, 9, c), false, &greedy).value(), "sample_not_drawn");
}

// Without `draws` (a multi-turn task, or rollout.verify_draws off) the same group passes on its
// log-probs, as before.
TEST(BehaviourVerifierTest, DrawsAreCheckedOnlyWhenAsked) {
  Versions m;
  VerifyOptions o = DrawOptions();
  o.draws = false;
  BehaviourVerifier v(TinyConfig(), o);
  v.Remember(MakeSnapshot(m.v0, 0).value());
  const std::vector<int64_t> prompt = {1, 5, 7};
  const std::vector<model::Completion> many = Draw(m.v0, prompt, 3, 8);
  EXPECT_EQ(v.Check(Group(prompt, 3, std::vector<model::Completion>(many.begin() + 4, many.end())), false).value(), "");
  EXPECT_EQ(v.stats().draws_checked, 0);
}

}  // namespace
}  // namespace echelon::learn
