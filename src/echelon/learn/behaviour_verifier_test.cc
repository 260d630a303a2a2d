// BehaviourVerifier recomputes behaviour log-probs under the claimed version: honest groups pass
// (the generator's log-probs equal the recomputation), a lie about the version, made-up
// log-probs and a sample from other weights are refused.
#include "echelon/learn/behaviour_verifier.h"

#include <gtest/gtest.h>

#include "echelon/learn/run_options.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/testing.h"
#include "echelon/model/generate.h"

namespace echelon::learn {
namespace {

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
  BehaviourVerifier v(TinyConfig(), {/*fraction=*/1.0, /*tolerance=*/1e-3, /*window=*/2, /*temperature=*/0.8});
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

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// Partial rollouts: a turn whose first tokens v0 drew and whose rest v1 drew (each log-prob its
// own version's over the whole prefix) passes with each token's version, and is refused when
// the versions are dropped (all v0's) or put the other way round.
TEST(BehaviourVerifierTest, EachTokenIsCheckedUnderItsOwnVersion) {
  Versions m;
  BehaviourVerifier v(TinyConfig(), {/*fraction=*/1.0, /*tolerance=*/1e-3, /*window=*/2, /*temperature=*/0.8});
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

}  // namespace
}  // namespace echelon::learn
