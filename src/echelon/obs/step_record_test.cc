#include "echelon/obs/step_record.h"

#include <gtest/gtest.h>

#include <cmath>

namespace echelon::obs {
namespace {

TEST(StepRecord, EveryFieldSurvivesTheRoundTrip) {
  StepRecord r;
  r.step = 6;
  r.version = 7;
  r.wall_s = 12.5;
  r.step_s = 0.5;
  r.wait_s = 0.25;
  r.train_s = 0.2;
  r.reward_mean = 0.4;
  r.accuracy = 0.375;
  r.heldout_accuracy = 0.3;
  r.staleness_mean = 1.5;
  r.staleness_max = 2;
  r.staleness_bound = 2;
  r.staleness_hist = {{1, 2}, {2, 2}};
  r.consumed_groups = {10, 11, 12, 13};
  r.groups_issued = 40;
  r.groups_consumed = 28;
  r.groups_dropped_stale = 1;
  r.groups_reissued = 3;
  r.groups_in_flight = 8;
  r.groups_filtered = 5;
  r.filtered_groups = 2;
  r.refused = {{"bad_logprob", 2}};
  r.actors = 2;
  r.actor_groups = {{"actor-0", 20}, {"actor-1", 9}};
  r.learner_busy_frac = 0.8;
  r.tokens_per_s = 1500;
  r.loss = -0.01;
  r.grad_norm = 0.7;
  r.clip_frac = 0.05;
  r.kl = 0.001;
  r.behav_weight_mean = 1.0;
  r.max_token_weight = 1.28;
  r.group_share_max = 0.31;
  r.actor_stats = {{"w-0", {{"groups", 3}, {"reward_mean", 0.5}}}};
  r.verify_unverifiable = 2;
  r.verify_draws_checked = 40;
  r.verify_near_ties = 1;
  r.verify_token_gap_max = 0.25;
  r.logprob_gap = 1e-7;
  r.actor_logprob_gap = {{"actor-0", 1e-7}};
  r.reward_metrics = {{"length", 12.5}};
  r.zero_spread_groups = 1;
  r.tokens = 96;
  r.moved_tokens = 4;
  r.entropy = 0.75;
  r.lease_renewals = 3;
  r.clip_frac_low = 0.01;
  r.clip_frac_high = 0.03;
  r.clip_frac_dual = 0.01;
  r.response_length_mean = 5.5;
  r.response_length_max = 9;
  r.truncated_frac = 0.125;
  r.is_ess_frac_by_staleness = {{"0", 1.0}, {"2-3", 0.8}};
  r.is_logratio_m2_by_staleness = {{"0", 0.0}, {"2-3", 0.05}};
  r.masked_frac_by_staleness = {{"0", 0.0}, {"2-3", 0.1}};
  r.learner_pad_frac = 0.125;
  r.router_load = {{"0", 0.75}, {"1", 0.25}};
  r.router_imbalance = 1.5;
  r.router_aux_loss = 2.1;
  r.routes_replayed = 120;
  r.route_agreement = 0.75;
  r.routes_refused = 3;
  r.broadcast_version = 6;
  r.broadcast_s = 0.3;
  r.broadcast_bytes = 1234;
  r.broadcast_snapshot_bytes = 98765;
  r.learner_rss_mb = 300.5;
  r.learner_ranks = 2;
  r.active_workers = 5;
  r.billed_by_class = {{"a100", 2}};
  r.cost = 1.25;
  r.groups_predicted_late = 7;
  r.groups_resumed = 3;
  r.actor_group_seconds = {{"actor-0", 1.5}};
  r.tokens_by_fate = {{"consumed", 900}, {"stale", 40}};
  r.price_changes = nlohmann::json::array({{{"gpu", "A100"}}});
  const nlohmann::json j = r.ToJson();
  Result<StepRecord> back = StepRecord::FromJson(j, "x");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), j);
  EXPECT_EQ(j.size(), 76u);  // every field written: a new field must be added to both sides
  EXPECT_EQ(j["staleness_hist"], (nlohmann::json{{"1", 2}, {"2", 2}}));
}

TEST(StepRecord, StalenessBinsArePowersOfTwo) {
  EXPECT_EQ(StalenessBin(0), "0");
  EXPECT_EQ(StalenessBin(1), "1");
  EXPECT_EQ(StalenessBin(2), "2-3");
  EXPECT_EQ(StalenessBin(3), "2-3");
  EXPECT_EQ(StalenessBin(4), "4-7");
  EXPECT_EQ(StalenessBin(63), "32-63");
  EXPECT_EQ(StalenessBin(64), "64-127");
}

TEST(StepRecord, RouterLoadSharesAndTheWorstLayersImbalance) {
  StepRecord r;
  SetRouterLoad({}, &r);
  EXPECT_TRUE(r.router_load.empty());
  EXPECT_TRUE(std::isnan(r.router_imbalance));
  SetRouterLoad({{0, 0, 0, 0}}, &r);  // nothing routed: stays missing
  EXPECT_TRUE(r.router_load.empty());
  // Layer 0 balanced (2 each), layer 1 all on expert 3 (8 of 8: 4x the mean of 2).
  SetRouterLoad({{2, 2, 2, 2}, {0, 0, 0, 8}}, &r);
  EXPECT_EQ(r.router_load, (std::map<std::string, double>{{"0", 0.125}, {"1", 0.125}, {"2", 0.125}, {"3", 0.625}}));
  EXPECT_DOUBLE_EQ(r.router_imbalance, 4.0);
}

TEST(StepRecord, MissingFieldsStayMissingAndAreNotWritten) {
  Result<StepRecord> r = StepRecord::FromJson({{"step", 3}, {"wall_s", 1.0}, {"reward_mean", nullptr}}, "x");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(std::isnan(r->reward_mean));
  EXPECT_FALSE(r->version.has_value());
  EXPECT_TRUE(r->actor_groups.empty());
  EXPECT_EQ(r->ToJson(), (nlohmann::json{{"step", 3}, {"wall_s", 1.0}}));
}

TEST(StepRecord, OldBroadcastKeyStillReads) {
  Result<StepRecord> r = StepRecord::FromJson({{"step", 0}, {"wall_s", 1.0}, {"snapshot_broadcast_s", 0.5}}, "x");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->broadcast_s, 0.5);
}

TEST(StepRecord, BadFieldsAreNamedWithTheirPlace) {
  struct Case {
    nlohmann::json line;
    const char* message;
  };
  const Case cases[] = {
      {{{"wall_s", 1.0}}, "m:3: a training line needs an integer 'step' (or an \"event\" field)"},
      {{{"step", 1}}, "m:3: a training line needs a number 'wall_s'"},
      {{{"step", 1}, {"wall_s", 1.0}, {"loss", "x"}}, "m:3: field 'loss' is \"x\"; expected a number"},
      {{{"step", 1}, {"wall_s", 1.0}, {"groups_consumed", -1}},
       "m:3: field 'groups_consumed' is -1; expected a non-negative integer"},
      {{{"step", 1}, {"wall_s", 1.0}, {"actor_groups", {{"a", 1.5}}}},
       "m:3: actor_groups[\"a\"] is 1.5; expected a non-negative integer"},
      {{{"step", 1}, {"wall_s", 1.0}, {"staleness_hist", {{"-1", 2}}}},
       "m:3: staleness_hist key \"-1\" is not a non-negative integer"},
      {{{"step", 1}, {"wall_s", 1.0}, {"consumed_groups", {1, "two"}}},
       "m:3: field 'consumed_groups' is [1,\"two\"]; expected an array of group ids"},
  };
  for (const Case& c : cases) {
    Result<StepRecord> r = StepRecord::FromJson(c.line, "m:3");
    ASSERT_FALSE(r.ok()) << c.line.dump();
    EXPECT_EQ(r.status().message(), c.message);
  }
}

}  // namespace
}  // namespace echelon::obs
