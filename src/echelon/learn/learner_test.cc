#include "echelon/learn/learner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "echelon/learn/testing.h"
#include "echelon/model/generate.h"

namespace echelon::learn {
namespace {

TEST(LearnerTest, ActorLogprobsEqualLearnerRecomputationOnPolicy) {
  for (double temperature : {1.0, 0.7}) {
    model::Qwen3Model m(TinyConfig());
    m->InitWeights(3);
    LearnerOptions o;
    o.temperature = temperature;
    Learner learner(m, o);
    std::vector<LearnerGroup> groups = SampleGroups(learner.model(), temperature, 6);
    Result<StepStats> s = learner.Step(groups);
    ASSERT_TRUE(s.ok()) << s.status().message();
    // The ratio is 1 at S = 0: nothing is clipped and the gap is float rounding only.
    EXPECT_LT(s->logprob_gap, 1e-5) << "temperature " << temperature;
    ASSERT_EQ(s->group_logprob_gap.size(), groups.size());
    for (double g : s->group_logprob_gap) EXPECT_LT(g, 1e-5);
    EXPECT_EQ(s->clip_frac, 0.0);
    EXPECT_EQ(learner.version(), 1);
    EXPECT_GT(s->tokens, 0);
  }
}

TEST(LearnerTest, PerGroupLogprobGapSinglesOutAMismatchedWorker) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(4);
  Learner learner(m, LearnerOptions{});
  std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 4);
  // Group 1 reports log-probs 0.5 nats off on every token (a worker with other weights).
  for (data::Episode& e : groups[1].episodes)
    for (float& lp : e.turns[0].logprobs) lp -= 0.5f;
  Result<StepStats> s = learner.Step(groups);
  ASSERT_TRUE(s.ok());
  EXPECT_LT(s->group_logprob_gap[0], 1e-5);
  EXPECT_NEAR(s->group_logprob_gap[1], 0.5, 1e-4);
  EXPECT_LT(s->group_logprob_gap[2], 1e-5);
}

// Per-group importance health, as staleness bins are built from it: group 1's behaviour
// log-probs alternate +-0.3 nats around the learner's, so log w = -+0.3: E[(log w)^2] = 0.09
// and the ESS fraction cosh(0.3)^2 / cosh(0.6) (0.9217); the on-policy groups stay at 0 and 1.
// With icepop at beta e^0.2 every token of group 1 is dropped, none of the others.
TEST(LearnerTest, PerGroupImportanceHealthByHand) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(4);
  std::vector<LearnerGroup> groups = SampleGroups(m, 1.0, 4);
  for (data::Episode& e : groups[1].episodes)
    for (size_t k = 0; k < e.turns[0].logprobs.size(); ++k) e.turns[0].logprobs[k] += k % 2 == 0 ? 0.3f : -0.3f;
  for (Correction c : {Correction::kNone, Correction::kIcePop}) {
    LearnerOptions o;
    o.loss.correction = c;
    o.loss.icepop_beta = std::exp(0.2);
    Learner learner(Copy(m), o);
    Result<StepStats> s = learner.Step(groups);
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->group_importance.size(), 3u);
    double plus = 0, minus = 0;  // group 1's tokens at +0.3 and -0.3
    for (const data::Episode& e : groups[1].episodes)
      for (size_t k = 0; k < e.turns[0].logprobs.size(); ++k) (k % 2 == 0 ? plus : minus) += 1;
    const ImportanceHealth h = s->group_importance[1].Health();
    const double w_mean = (plus * std::exp(-0.3) + minus * std::exp(0.3)) / (plus + minus);
    const double w_m2 = (plus * std::exp(-0.6) + minus * std::exp(0.6)) / (plus + minus);
    EXPECT_NEAR(h.logratio_m2, 0.09, 1e-4);
    EXPECT_NEAR(h.ess_frac(), w_mean * w_mean / w_m2, 1e-4);
    EXPECT_NEAR(h.masked_frac, c == Correction::kIcePop ? 1.0 : 0.0, 1e-9);
    for (size_t g : {size_t{0}, size_t{2}}) {
      EXPECT_LT(s->group_importance[g].Health().logratio_m2, 1e-9);
      EXPECT_NEAR(s->group_importance[g].Health().ess_frac(), 1.0, 1e-6);
      EXPECT_EQ(s->group_importance[g].dropped, 0.0);
    }
  }
}

TEST(LearnerTest, UpdatesRaiseTheLikelihoodOfRewardedSamples) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(5);
  LearnerOptions o;
  o.lr = 1e-2;
  Learner learner(m, o);
  std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 8);
  auto first_token_logp = [&](double reward) {
    double sum = 0;
    int n = 0;
    for (const LearnerGroup& g : groups)
      for (const data::Episode& e : g.episodes) {
        if (e.reward != reward) continue;
        sum += model::ScoreCompletion(learner.model(), e.turns[0].prompt_ids, {e.turns[0].tokens[0]}, 1.0)[0];
        ++n;
      }
    return sum / n;
  };
  const double good_before = first_token_logp(1.0), bad_before = first_token_logp(0.0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(learner.Step(groups).ok());
  EXPECT_GT(first_token_logp(1.0), good_before + 0.05);
  EXPECT_LT(first_token_logp(0.0), bad_before - 0.05);
  EXPECT_EQ(learner.version(), 5);
}

// A Qwen3-MoE learns like the dense model, and its update reports the router's load: every
// position the gradient forward computed, top-k times, in the one sparse layer.
TEST(LearnerTest, MoeUpdatesLearnAndReportTheRouterLoad) {
  model::Qwen3Model m(TinyMoeConfig());
  m->InitWeights(5);
  LearnerOptions o;
  o.lr = 1e-2;
  Learner learner(m, o);
  std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 8);
  const auto router_before = learner.model()->StateDict().at("model.layers.1.mlp.gate.weight").clone();
  Result<StepStats> stats = learner.Step(groups);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  ASSERT_EQ(stats->router_load.size(), 1u);
  ASSERT_EQ(stats->router_load[0].size(), 4u);
  int64_t routed = 0;
  for (int64_t n : stats->router_load[0]) routed += n;
  EXPECT_EQ(routed, 2 * stats->computed_positions);
  EXPECT_FALSE(at::equal(router_before, learner.model()->StateDict().at("model.layers.1.mlp.gate.weight")))
      << "the router is trained";
  // Held-out evaluation between updates (forwards of the same model) is not counted.
  {
    at::NoGradGuard no_grad;
    (void)model::Generate(learner.model(), {{1, 2, 3}}, model::SamplingParams{});
  }
  stats = learner.Step(groups);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  int64_t again = 0;
  for (int64_t n : stats->router_load[0]) again += n;
  EXPECT_EQ(again, 2 * stats->computed_positions);
}

// Router replay: an actor whose router chooses otherwise than the learner's (another engine's
// arithmetic, exaggerated here) sends every route. With one expert per token the router's
// weights do not enter the output, so training with the actor's routes gives back the actor's
// log-probs exactly, where the learner's own routes do not; a trust of 0 refuses every route the
// learner would not have chosen itself.
TEST(LearnerTest, RouterReplayGivesBackTheActorsLogprobs) {
  model::ModelConfig cfg = TinyMoeConfig();
  cfg.num_experts_per_tok = 1;
  model::Qwen3Model actor(cfg);
  actor->InitWeights(6);
  int64_t entries = 0;
  const std::vector<LearnerGroup> groups = RoutedGroups(actor, &entries);
  struct Case {
    bool replay;
    double trust;
    bool pack;
  };
  for (const Case c : {Case{false, 1.0, true}, Case{true, 1.0, true}, Case{true, 1.0, false}, Case{true, 0.0, true}}) {
    model::Qwen3Model learner_model = Copy(actor);
    RerouteLayerOne(learner_model, 7);
    LearnerOptions o;
    o.router_replay = c.replay;
    o.router_replay_trust = c.trust;
    o.pack_sequences = c.pack;
    Learner learner(learner_model, o);
    Result<StepStats> s = learner.Step(groups);
    ASSERT_TRUE(s.ok()) << s.status().message();
    const std::string name = "replay " + std::to_string(c.replay) + " trust " + std::to_string(c.trust) + " pack " +
                              std::to_string(c.pack);
    if (!c.replay) {
      EXPECT_TRUE(s->group_routes.empty());
      EXPECT_GT(s->logprob_gap, 1e-3) << "the learner's own routes differ: " << name;
      continue;
    }
    ASSERT_EQ(s->group_routes.size(), groups.size());
    StepStats::RouteCounts sum;
    for (const StepStats::RouteCounts& g : s->group_routes) {
      sum.same += g.same;
      sum.applied += g.applied;
      sum.refused += g.refused;
    }
    EXPECT_EQ(sum.total(), entries) << "every route counted once: " << name;
    if (c.trust > 0) {
      EXPECT_LT(s->logprob_gap, 1e-5) << name;
      EXPECT_GT(sum.applied, entries / 4) << name;
      EXPECT_EQ(sum.refused, 0) << name;
    } else {
      EXPECT_GT(s->logprob_gap, 1e-3) << name;
      EXPECT_EQ(sum.applied, 0) << name;
      EXPECT_GT(sum.refused, entries / 4) << name;
    }
  }
}

// Router replay under activation checkpointing: the backward pass recomputes each layer, and the
// recomputation forces the same routes, so the update equals the one that kept its activations
// (a recomputation routing by itself would send the gradient to other experts).
TEST(LearnerTest, RouterReplayRecomputedLayersForceTheSameRoutes) {
  model::ModelConfig cfg = TinyMoeConfig();
  cfg.num_experts_per_tok = 1;
  model::Qwen3Model actor(cfg);
  actor->InitWeights(6);
  const std::vector<LearnerGroup> groups = RoutedGroups(actor);
  model::Qwen3Model init = Copy(actor);
  RerouteLayerOne(init, 7);
  std::vector<model::Qwen3Model> after;
  for (const bool checkpointing : {false, true}) {
    LearnerOptions o;
    o.lr = 1e-2;
    o.router_replay = true;
    o.router_replay_trust = 1.0;
    o.activation_checkpointing = checkpointing;
    Learner learner(Copy(init), o);
    ASSERT_TRUE(learner.Step(groups).ok());
    after.push_back(Copy(learner.model()));
  }
  EXPECT_GT(MaxWeightDiff(after[0], init), 1e-4) << "the update moved the weights";
  EXPECT_LT(MaxWeightDiff(after[0], after[1]), 1e-6);
}

// With no reward spread the policy loss has no gradient: only the load-balancing loss
// (rl.router_aux_coef) moves the weights, and it reaches the router, not the experts.
TEST(LearnerTest, RouterAuxLossAloneTrainsTheRouter) {
  for (double coef : {0.0, 0.5}) {
    model::Qwen3Model m(TinyMoeConfig());
    m->InitWeights(5);
    LearnerOptions o;
    o.lr = 1e-2;
    o.router_aux_coef = coef;
    Learner learner(m, o);
    std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 4);
    for (LearnerGroup& g : groups)
      for (data::Episode& e : g.episodes) e.reward = 1;
    const auto before = Copy(learner.model());
    Result<StepStats> stats = learner.Step(groups);
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    const auto now = learner.model()->StateDict(), then = before->StateDict();
    const bool router_moved = !at::equal(now.at("model.layers.1.mlp.gate.weight"), then.at("model.layers.1.mlp.gate.weight"));
    const bool expert_moved =
        !at::equal(now.at("model.layers.1.mlp.experts.0.up_proj.weight"), then.at("model.layers.1.mlp.experts.0.up_proj.weight"));
    EXPECT_EQ(router_moved, coef > 0) << coef;
    EXPECT_FALSE(expert_moved) << coef;
    if (coef > 0) {
      EXPECT_GE(stats->router_aux_loss, 2.0 - 1e-6);  // k = 2 under uniform routing, more when skewed
      EXPECT_LE(stats->router_aux_loss, 4.0);
    } else {
      EXPECT_EQ(stats->router_aux_loss, 0);
    }
  }
}

TEST(LearnerTest, GroupsWithoutRewardSpreadAreCountedAndGiveNoGradient) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(7);
  Learner learner(m, LearnerOptions{});
  std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 4);
  for (LearnerGroup& g : groups)
    for (data::Episode& e : g.episodes) e.reward = 1.0;
  const auto before = learner.model()->StateDict().begin()->second.clone();
  Result<StepStats> s = learner.Step(groups);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->zero_spread_groups, 3);
  EXPECT_EQ(s->grad_norm, 0.0);
  EXPECT_TRUE(at::equal(before, learner.model()->StateDict().begin()->second));
}

// Whatever makes the loss non-finite (here a NaN reward, which the intake refuses before it
// gets this far), the optimizer step that would write NaN weights, published to every actor,
// is not taken.
TEST(LearnerTest, NonFiniteLossSkipsTheStepAndLeavesWeightsUnchanged) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(7);
  Learner learner(m, LearnerOptions{});
  std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 4);
  groups[0].episodes[0].reward = std::numeric_limits<double>::quiet_NaN();
  std::map<std::string, at::Tensor> before;
  for (const auto& [k, v] : learner.model()->StateDict()) before[k] = v.clone();
  Result<StepStats> s = learner.Step(groups);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->skipped_nonfinite, 1);
  EXPECT_EQ(s->nonfinite_groups, (std::vector<size_t>{0, 1, 2}));  // one minibatch holds them all
  for (const auto& [k, v] : learner.model()->StateDict()) {
    EXPECT_TRUE(at::equal(before.at(k), v)) << k;
    EXPECT_TRUE(at::isfinite(v).all().item<bool>()) << k;
  }
  // The next honest batch trains normally.
  s = learner.Step(SampleGroups(learner.model(), 1.0, 4));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->skipped_nonfinite, 0);
  EXPECT_GT(s->grad_norm, 0.0);
  // With a minibatch per group only the poisoned group's step is skipped, and it is named.
  LearnerOptions per_group;
  per_group.minibatches = 3;
  Learner split(m, per_group);
  std::vector<LearnerGroup> again = SampleGroups(split.model(), 1.0, 4);
  again[1].episodes[2].reward = std::numeric_limits<double>::quiet_NaN();
  s = split.Step(again);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->skipped_nonfinite, 1);
  EXPECT_EQ(s->nonfinite_groups, std::vector<size_t>{1});
}

TEST(LearnerTest, EmptyBatchIsRefused) {
  model::Qwen3Model m(TinyConfig());
  Learner learner(m, LearnerOptions{});
  EXPECT_FALSE(learner.Step({}).ok());
  EXPECT_EQ(learner.version(), 0);
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

TEST(LearnerRestore, ContinuingFromSavedStateEqualsNeverStopping) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(8);
  LearnerOptions o;
  o.weight_decay = 0.01;
  Learner a(m, o);
  EXPECT_TRUE(a.OptimizerState().empty()) << "no state before the first update";
  const std::vector<LearnerGroup> first = SampleGroups(a.model(), 1.0, 4);
  ASSERT_TRUE(a.Step(first).ok());
  ASSERT_TRUE(a.Step(first).ok());
  const std::map<std::string, at::Tensor> saved = a.OptimizerState();
  EXPECT_EQ(saved.size(), 3 * a.model()->parameters().size());
  EXPECT_EQ(saved.at("model.norm.weight.step").item<int64_t>(), 2);

  model::Qwen3Model copy(TinyConfig());
  ASSERT_TRUE(copy->LoadStateDict(a.model()->StateDict(), "copy").ok());
  Learner b(copy, o);
  ASSERT_TRUE(b.Restore(2, saved, {}).ok());
  EXPECT_EQ(b.version(), 2);
  const std::vector<LearnerGroup> next = SampleGroups(a.model(), 1.0, 4);
  ASSERT_TRUE(a.Step(next).ok());
  ASSERT_TRUE(b.Step(next).ok());
  for (const auto& [name, w] : a.model()->StateDict())
    EXPECT_TRUE(at::equal(w, b.model()->StateDict().at(name))) << name;

  // Without the optimizer state the same step differs (the test can fail).
  model::Qwen3Model fresh(TinyConfig());
  ASSERT_TRUE(fresh->LoadStateDict(copy->StateDict(), "fresh").ok());
  Learner c(fresh, o);
  ASSERT_TRUE(c.Restore(3, {}, {}).ok());
  ASSERT_TRUE(c.Step(next).ok());
  EXPECT_FALSE(at::equal(c.model()->StateDict().at("model.norm.weight"), b.model()->StateDict().at("model.norm.weight")));
}

TEST(LearnerRestore, BadOptimizerStateIsNamedAndChangesNothing) {
  model::Qwen3Model m(TinyConfig());
  m->InitWeights(9);
  Learner a(m, LearnerOptions{});
  ASSERT_TRUE(a.Step(SampleGroups(a.model(), 1.0, 4)).ok());
  const std::map<std::string, at::Tensor> good = a.OptimizerState();
  Learner b(m, LearnerOptions{});

  std::map<std::string, at::Tensor> s = good;
  s.erase("model.layers.1.mlp.up_proj.weight.exp_avg_sq");
  Status st = b.Restore(1, s, {});
  EXPECT_NE(st.message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << st.message();
  s = good;
  s["model.layers.0.self_attn.q_proj.weight.exp_avg"] = at::zeros({3, 3});
  st = b.Restore(1, s, {});
  EXPECT_NE(st.message().find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
  s = good;
  s["no.such.param.step"] = at::ones({1}, at::kLong);
  EXPECT_FALSE(b.Restore(1, s, {}).ok());
  s = good;
  for (const char* suffix : {".step", ".exp_avg", ".exp_avg_sq"}) s.erase(std::string("model.norm.weight") + suffix);
  st = b.Restore(1, s, {});
  EXPECT_NE(st.message().find("covers"), std::string::npos) << st.message();
  EXPECT_EQ(b.version(), 0);
  EXPECT_TRUE(b.OptimizerState().empty());
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

TEST(LearnerMinibatches, SeveralOptimizerStepsPerUpdateAndATrustRegionAroundTheStart) {
  for (Correction c : {Correction::kNone, Correction::kDecoupled}) {
    SCOPED_TRACE(static_cast<int>(c));
    auto run = [&](int64_t minibatches) {
      model::Qwen3Model m(TinyConfig());
      m->InitWeights(6);
      LearnerOptions o;
      o.lr = 5e-2;  // large, so that later minibatches move far from the starting policy
      o.minibatches = minibatches;
      o.loss.correction = c;
      Learner learner(m, o);
      const std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 8);
      Result<StepStats> s = learner.Step(groups);
      EXPECT_TRUE(s.ok());
      EXPECT_EQ(learner.version(), 1) << "one update whatever the minibatches";
      // AdamW counted one optimizer step per minibatch (at most one per group: 3 groups).
      EXPECT_EQ(learner.OptimizerState().at("model.norm.weight.step").item<int64_t>(), std::min<int64_t>(minibatches, 3));
      return std::make_pair(s.value(), learner.model()->StateDict().at("model.norm.weight").clone());
    };
    const auto [one, w1] = run(1);
    const auto [three, w3] = run(3);
    const auto [many, wmany] = run(50);
    if (c == Correction::kDecoupled) {
      EXPECT_EQ(one.clip_frac, 0.0) << "one step: the ratio to pi_prox is 1";
    }
    EXPECT_GT(three.clip_frac, 0.0) << "later minibatches are clipped against the starting policy";
    EXPECT_FALSE(at::equal(w1, w3));
    EXPECT_TRUE(at::equal(w3, wmany)) << "more minibatches than groups is one per group";
    // Averages over the minibatches: the actors' policy is the learner's, so the weights are 1.
    EXPECT_NEAR(three.behav_weight_mean, 1.0, 1e-3);
    EXPECT_NEAR(one.behav_weight_mean, 1.0, 1e-3);
    // The log-prob gap is measured at the start of the update either way.
    EXPECT_NEAR(one.logprob_gap, three.logprob_gap, 1e-6);
  }
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// rl.overlong: two samples of one prompt, both rewarded 1 (no spread), one cut at the limit of 4
// tokens, one ended by the stop id after 2. The soft punishment gives the cut one reward 0 (its
// 4 tokens are the limit: -penalty), so the group has a spread; with the filter, the cut one's
// tokens carry no loss. The learner tells truncation from the tokens.
TEST(LearnerTest, OverlongShapingAndFilter) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(9);
  LearnerGroup g;
  for (const std::vector<int64_t>& tokens : {std::vector<int64_t>{5, 6, 7, 8}, std::vector<int64_t>{5, 2}}) {
    data::Episode e;
    e.turns.push_back({{1, 4, 4}, tokens, std::vector<float>(tokens.size(), -2.7f), ""});
    e.reward = 1.0;
    g.episodes.push_back(e);
  }
  LearnerOptions o;
  o.max_new_tokens = 4;
  o.stop_ids = {2};
  Learner plain(Copy(init), o);
  const StepStats a = plain.Step({g}).value();
  EXPECT_EQ(a.truncated, 1);
  EXPECT_EQ(a.episodes, 2);
  EXPECT_EQ(a.tokens, 6);
  EXPECT_EQ(a.zero_spread_groups, 1);
  EXPECT_EQ(a.grad_norm, 0.0) << "no spread, no shaping: nothing to learn";
  o.overlong = {2, 1.0, false};
  Learner shaped(Copy(init), o);
  const StepStats b = shaped.Step({g}).value();
  EXPECT_EQ(b.zero_spread_groups, 1) << "counted on the task's rewards, not the shaped ones";
  EXPECT_GT(b.grad_norm, 0.0) << "the punishment made a spread";
  o.overlong.filter = true;
  Learner filtered(Copy(init), o);
  const StepStats c = filtered.Step({g}).value();
  EXPECT_EQ(c.tokens, 2) << "the cut sample's tokens carry no loss";
  EXPECT_GT(c.grad_norm, 0.0);
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// `steps` updates on `groups` from `init` with options `o`: the weights after them, and the
// statistics of the last.
model::Qwen3Model TrainedWith(const model::Qwen3Model& init, const std::vector<LearnerGroup>& groups,
                              const LearnerOptions& o, int steps, StepStats* last = nullptr) {
  Learner l(Copy(init), o);
  for (int i = 0; i < steps; ++i) {
    Result<StepStats> s = l.Step(groups);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (s.ok() && last != nullptr) *last = s.value();
  }
  return Copy(l.model());
}

// Each aggregation is the minibatch's, however it is cut: micro-batches of 20 tokens give the
// weights of one forward/backward, and the aggregations differ from each other.
TEST(LearnerTest, LossAggregationDoesNotDependOnMicroBatches) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(10);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  std::vector<model::Qwen3Model> ends;
  for (LossAggregation how : {LossAggregation::kSeqMeanTokenMean, LossAggregation::kSeqMeanTokenSumNorm}) {
    std::vector<model::Qwen3Model> cut;
    for (int64_t micro : {0, 20}) {
      LearnerOptions o;
      o.lr = 1e-3;
      o.loss_aggregation = how;
      o.max_new_tokens = 5;
      o.micro_batch_tokens = micro;
      cut.push_back(TrainedWith(init, groups, o, 3));
    }
    EXPECT_LT(MaxWeightDiff(cut[0], cut[1]), 1e-5) << static_cast<int>(how);
    ends.push_back(cut[0]);
  }
  EXPECT_GT(MaxWeightDiff(ends[0], ends[1]), 1e-5);
}

// m2po's clip bound is one statistic of the whole batch: the same weights whether the batch
// is cut into micro-batches or not, and the bound acts (a tau that never binds gives others).
TEST(LearnerTest, M2poBoundDoesNotDependOnMicroBatches) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(10);
  std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  for (LearnerGroup& g : groups)  // stale samples: behaviour log-probs 0.4 nats either way
    for (data::Episode& e : g.episodes)
      for (size_t k = 0; k < e.turns[0].logprobs.size(); ++k) e.turns[0].logprobs[k] += k % 2 == 0 ? 0.4f : -0.4f;
  std::vector<model::Qwen3Model> ends;
  for (double tau : {0.04, 100.0}) {
    std::vector<model::Qwen3Model> cut;
    for (int64_t micro : {0, 20}) {
      LearnerOptions o;
      o.lr = 1e-3;
      o.loss.correction = Correction::kM2po;
      o.loss.m2po_tau = tau;
      o.micro_batch_tokens = micro;
      StepStats s;
      cut.push_back(TrainedWith(init, groups, o, 1, &s));
      if (tau < 1) {
        EXPECT_GT(s.clip_frac, 0.0);
      }
    }
    EXPECT_LT(MaxWeightDiff(cut[0], cut[1]), 1e-5) << tau;
    ends.push_back(cut[0]);
  }
  EXPECT_GT(MaxWeightDiff(ends[0], ends[1]), 1e-5);
}

// Regression: a mixture of experts whose some experts no token had reached had no AdamW state
// for them, so its checkpoint covered fewer parameters than the model and the resume refused it
// ("optimizer state covers 404 of 422 parameters"). Such a parameter is written as never
// stepped (its step count 0 alone), restored as such, and the resumed learner steps as the
// unbroken one.
TEST(LearnerRestore, AnExpertNoTokenReachedResumesAsNeverStepped) {
  model::Qwen3Model m(TinyMoeConfig());
  m->InitWeights(3);
  Learner a(Copy(m), LearnerOptions{});
  const std::vector<LearnerGroup> groups = SampleGroups(a.model(), 1.0, 4);
  ASSERT_TRUE(a.Step(groups).ok());
  std::map<std::string, at::Tensor> state = a.OptimizerState();
  // An expert the step did not reach, as a router that never picks it would leave it.
  const std::string expert = "model.layers.1.mlp.experts.3.up_proj.weight";
  const bool reached = state.count(expert + ".exp_avg") > 0;
  if (reached) {
    state.erase(expert + ".exp_avg");
    state.erase(expert + ".exp_avg_sq");
    state[expert + ".step"] = at::zeros({1}, at::kLong);
  }
  size_t never = 0;
  for (const auto& [name, t] : a.OptimizerState())
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0 && t.item<int64_t>() == 0) ++never;
  if (!reached) EXPECT_GE(never, 1u) << "the unreached expert is listed as never stepped";
  Learner b(Copy(a.model()), LearnerOptions{});
  const Status st = b.Restore(a.version(), state, {});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(b.OptimizerState().count(expert + ".exp_avg"), 0u);
  ASSERT_TRUE(b.Step(groups).ok());
  // Written and read back: the same coverage.
  const std::map<std::string, at::Tensor> again = b.OptimizerState();
  for (const auto& [name, t] : state)
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0) EXPECT_TRUE(again.count(name)) << name;
}

}  // namespace
}  // namespace echelon::learn
