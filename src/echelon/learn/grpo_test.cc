#include "echelon/learn/grpo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace echelon::learn {
namespace {

at::Tensor Logs(std::vector<double> p) {
  at::Tensor t = at::tensor(p, at::kDouble).log().to(at::kFloat).unsqueeze(0);
  return t;
}

PolicyLossInputs TwoTokens(double advantage) {
  PolicyLossInputs in;
  in.logp = Logs({0.6, 0.3}).requires_grad_(true);
  in.behav_logp = Logs({0.4, 0.3});
  in.advantages = at::tensor({static_cast<float>(advantage)});
  in.mask = at::ones({1, 2});
  return in;
}

TEST(GroupAdvantagesTest, NormalisesBySampleStd) {
  // mean 0.5, sample std sqrt(1/3): advantages +-0.5 / 0.57735 = +-0.866025
  std::vector<double> a = GroupAdvantages({1, 0, 0, 1}, true);
  EXPECT_NEAR(a[0], 0.8660254, 1e-5);
  EXPECT_NEAR(a[1], -0.8660254, 1e-5);
  std::vector<double> b = GroupAdvantages({1, 0, 0, 1}, false);
  EXPECT_DOUBLE_EQ(b[0], 0.5);
  EXPECT_DOUBLE_EQ(b[1], -0.5);
}

TEST(GroupAdvantagesTest, NoSpreadMeansZero) {
  for (double a : GroupAdvantages({1, 1, 1}, true)) EXPECT_EQ(a, 0.0);
  for (double a : GroupAdvantages({0.5}, true)) EXPECT_EQ(a, 0.0);
}

TEST(PolicyLossTest, PpoClipPositiveAdvantage) {
  // r = [0.6/0.4, 1] = [1.5, 1]; clip to [0.8, 1.28]; objective min(rA, clip(r)A) = [1.28, 1].
  PolicyLossInputs in = TwoTokens(1.0);
  PolicyLossOutput out = PolicyLoss(in, PolicyLossOptions{});
  EXPECT_NEAR(out.loss.item<double>(), -(1.28 + 1.0) / 2, 1e-6);
  EXPECT_NEAR(out.clip_frac, 0.5, 1e-9);
  out.loss.backward();
  // Clipped token has no gradient; the other has d/dlogp (-r A / 2) = -0.5.
  at::Tensor g = in.logp.grad();
  EXPECT_NEAR(g[0][0].item<double>(), 0.0, 1e-7);
  EXPECT_NEAR(g[0][1].item<double>(), -0.5, 1e-6);
}

TEST(PolicyLossTest, PpoClipNegativeAdvantageUsesUnclippedBranch) {
  // A = -1: min(-1.5, -1.28) = -1.5 (pessimistic), min(-1, -1) = -1; loss = (1.5 + 1) / 2.
  PolicyLossInputs in = TwoTokens(-1.0);
  PolicyLossOutput out = PolicyLoss(in, PolicyLossOptions{});
  EXPECT_NEAR(out.loss.item<double>(), 1.25, 1e-6);
  EXPECT_NEAR(out.clip_frac, 0.0, 1e-9);
  out.loss.backward();
  EXPECT_NEAR(in.logp.grad()[0][0].item<double>(), 0.75, 1e-6);
  EXPECT_NEAR(in.logp.grad()[0][1].item<double>(), 0.5, 1e-6);
}

TEST(PolicyLossTest, TruncatedImportanceSamplingCapsBehaviourWeight) {
  // prox = logp (one update per step), behav = log 0.2: w = 0.6 / 0.2 = 3, capped at 2.
  PolicyLossInputs in;
  in.logp = Logs({0.6}).requires_grad_(true);
  in.behav_logp = Logs({0.2});
  in.advantages = at::tensor({1.0f});
  in.mask = at::ones({1, 1});
  PolicyLossOptions opt;
  opt.correction = Correction::kTruncatedIS;
  opt.tis_cap = 2.0;
  PolicyLossOutput out = PolicyLoss(in, opt);
  EXPECT_NEAR(out.loss.item<double>(), -2.0, 1e-5);
  EXPECT_NEAR(out.behav_weight_mean, 2.0, 1e-5);
  out.loss.backward();
  EXPECT_NEAR(in.logp.grad()[0][0].item<double>(), -2.0, 1e-5);
}

TEST(PolicyLossTest, DecoupledPpoUsesFullBehaviourWeightAndProximalRatio) {
  PolicyLossInputs in;
  in.logp = Logs({0.6}).requires_grad_(true);
  in.behav_logp = Logs({0.2});
  in.prox_logp = Logs({0.5});  // r = 0.6 / 0.5 = 1.2 (inside the clip range), w = 0.5 / 0.2 = 2.5
  in.advantages = at::tensor({2.0f});
  in.mask = at::ones({1, 1});
  PolicyLossOptions opt;
  opt.correction = Correction::kDecoupled;
  PolicyLossOutput out = PolicyLoss(in, opt);
  EXPECT_NEAR(out.loss.item<double>(), -2.5 * 1.2 * 2.0, 1e-5);
  EXPECT_NEAR(out.behav_weight_mean, 2.5, 1e-5);
}

// IcePop: w = prox / behav per token; tokens 0 (w = 2.5) and 2 (w = 0.25) leave [1/2, 2] and
// are dropped, token 1 (w = 1.25) is kept with its weight. Loss and gradient by hand.
TEST(PolicyLossTest, IcePopDropsTokensWhoseBehaviourWeightLeavesTheBand) {
  PolicyLossInputs in;
  in.logp = Logs({0.6, 0.5, 0.2}).requires_grad_(true);
  in.behav_logp = Logs({0.2, 0.4, 0.8});
  in.prox_logp = Logs({0.5, 0.5, 0.2});  // r = 1.2, 1.0, 1.0 (all inside the clip range)
  in.advantages = at::tensor({2.0f});
  in.mask = at::ones({1, 3});
  PolicyLossOptions opt;
  opt.correction = Correction::kIcePop;
  opt.icepop_beta = 2.0;
  PolicyLossOutput out = PolicyLoss(in, opt);
  // Only token 1: -w r A = -1.25 * 1.0 * 2.0, over 3 tokens.
  EXPECT_NEAR(out.loss.item<double>(), -1.25 * 1.0 * 2.0 / 3, 1e-5);
  EXPECT_NEAR(out.behav_weight_mean, 1.25 / 3, 1e-5);
  out.loss.backward();
  // d/dlogp of -w exp(logp - prox) A / 3 at r = 1: -w A / 3 for token 1, 0 for the dropped ones.
  EXPECT_EQ(in.logp.grad()[0][0].item<float>(), 0.0f);
  EXPECT_NEAR(in.logp.grad()[0][1].item<float>(), -1.25 * 2.0 / 3, 1e-5);
  EXPECT_EQ(in.logp.grad()[0][2].item<float>(), 0.0f);

  // A wider band keeps all three: the loss is decoupled PPO's.
  opt.icepop_beta = 5.0;
  PolicyLossInputs again = in;
  again.logp = Logs({0.6, 0.5, 0.2}).requires_grad_(true);
  PolicyLossOptions decoupled = opt;
  decoupled.correction = Correction::kDecoupled;
  EXPECT_NEAR(PolicyLoss(again, opt).loss.item<double>(), PolicyLoss(again, decoupled).loss.item<double>(), 1e-6);
}

// Staleness health by hand: w = pi_prox / pi_behav = 2 and 1 on the two real tokens (the third
// is padding): mean 1.5, second moment 2.5, ESS fraction 2.25 / 2.5, E[(log w)^2] = ln(2)^2 / 2.
TEST(PolicyLossTest, ImportanceHealthOfTheBehaviourWeights) {
  PolicyLossInputs in;
  in.logp = Logs({0.5, 0.5, 0.9}).requires_grad_(true);
  in.behav_logp = Logs({0.25, 0.5, 0.1});
  in.prox_logp = Logs({0.5, 0.5, 0.9});
  in.advantages = at::tensor({1.0f});
  in.mask = at::tensor({1.0f, 1.0f, 0.0f}).unsqueeze(0);
  for (Correction c : {Correction::kNone, Correction::kIcePop}) {
    PolicyLossOptions opt;
    opt.correction = c;
    opt.icepop_beta = 1.5;  // drops the token with w = 2
    const ImportanceHealth h = PolicyLoss(in, opt).health;
    EXPECT_NEAR(h.weight_mean, 1.5, 1e-6);
    EXPECT_NEAR(h.weight_m2, 2.5, 1e-6);
    EXPECT_NEAR(h.ess_frac(), 0.9, 1e-6);
    EXPECT_NEAR(h.logratio_m2, std::log(2.0) * std::log(2.0) / 2, 1e-6);
    EXPECT_NEAR(h.masked_frac, c == Correction::kIcePop ? 0.5 : 0.0, 1e-9);
  }
}

// The same sums row by row: row 0 holds w = 2 and 1 (the third token padding), row 1 w = 0.5
// (dropped by IcePop at beta 1.5) and 1. Sums add; Health() is their token mean.
TEST(PolicyLossTest, RowImportanceSumsByHand) {
  const at::Tensor log_w = at::log(at::tensor({2.0, 1.0, 7.0, 0.5, 1.0, 1.0}).view({2, 3}));
  const at::Tensor mask = at::tensor({1.0f, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f}).view({2, 3});
  PolicyLossOptions opt;
  opt.correction = Correction::kIcePop;
  opt.icepop_beta = 1.5;
  const at::Tensor dropped = DroppedTokens(log_w, opt);
  const std::vector<ImportanceSums> rows = RowImportanceSums(log_w, mask, dropped);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NEAR(rows[0].tokens, 2, 1e-12);
  EXPECT_NEAR(rows[0].weight, 3, 1e-12);
  EXPECT_NEAR(rows[0].weight_sq, 5, 1e-12);
  EXPECT_NEAR(rows[0].logratio_sq, std::log(2.0) * std::log(2.0), 1e-12);
  EXPECT_NEAR(rows[0].dropped, 1, 1e-12);  // w = 2 leaves [2/3, 1.5]; the padding's 7 does not count
  EXPECT_NEAR(rows[1].weight, 1.5, 1e-12);
  EXPECT_NEAR(rows[1].dropped, 1, 1e-12);
  ImportanceSums all = rows[0];
  all.Add(rows[1]);
  const ImportanceHealth h = all.Health();
  EXPECT_NEAR(h.weight_mean, 4.5 / 4, 1e-12);
  EXPECT_NEAR(h.weight_m2, 6.25 / 4, 1e-12);
  EXPECT_NEAR(h.masked_frac, 0.5, 1e-12);
  EXPECT_FALSE(DroppedTokens(log_w, PolicyLossOptions{}).defined());  // kNone drops nothing
  EXPECT_EQ(ImportanceSums{}.Health().ess_frac(), 1.0);
}

// M2PO's clip bound by hand. Harmful log-ratios 0.5, -0.3, 0.1 (squares 0.25, 0.09, 0.01, mean
// 0.1167): tau 0.04 (target sum 0.12) caps them at t with 0.01 + 2 t = 0.12, t = 0.055; tau
// 0.1 (target 0.3): 0.01 + 0.09 + t = 0.3, t = 0.2; tau 0.12 is over the mean: no clip. The
// padding token (log r 3) and the unmarked one (0.4) never count.
TEST(PolicyLossTest, M2poClipBoundCapsTheHarmfulSecondMomentAtTau) {
  const at::Tensor log_r = at::tensor({0.5f, -0.3f, 0.1f, 0.4f, 3.0f}).unsqueeze(0);
  const at::Tensor harmful = at::tensor({1, 1, 1, 0, 0}).unsqueeze(0).to(at::kBool);
  EXPECT_NEAR(M2poClipBound(log_r, harmful, 0.04), std::sqrt(0.055), 1e-6);
  EXPECT_NEAR(M2poClipBound(log_r, harmful, 0.1), std::sqrt(0.2), 1e-6);
  EXPECT_TRUE(std::isinf(M2poClipBound(log_r, harmful, 0.12)));
  EXPECT_TRUE(std::isinf(M2poClipBound(log_r, at::zeros_like(harmful), 0.04))) << "no harmful token, no clip";
  // Harmful: A > 0 with log r > 0, A < 0 with log r < 0, on the mask.
  const at::Tensor adv = at::tensor({1.0f, 1.0f, -1.0f, -1.0f, 0.0f}).unsqueeze(0);
  const at::Tensor r = at::tensor({0.2f, -0.2f, -0.2f, 0.2f, 0.2f}).unsqueeze(0);
  const at::Tensor got = M2poHarmful(r, adv, at::ones({1, 5}));
  EXPECT_TRUE(at::equal(got, at::tensor({1, 0, 1, 0, 0}).unsqueeze(0).to(at::kBool)));
}

// The loss: log r = 0.5, 0.3, 0.1, -0.4 against the behaviour policy, A = 1, tau 0.04. The
// first three are harmful (squares 0.25, 0.09, 0.01): bound sqrt(0.055) = 0.2345, so the first
// two are held at e^0.2345 (no gradient); the third is inside, the fourth (r < 1 with A > 0)
// is not clipped. Loss -(2 e^0.2345 + e^0.1 + e^-0.4) / 4.
TEST(PolicyLossTest, M2poClipsTheHarmfulTokensAtItsBound) {
  PolicyLossInputs in;
  in.logp = Logs({0.6, 0.6, 0.6, 0.6}).requires_grad_(true);
  in.behav_logp = in.logp.detach() - at::tensor({0.5f, 0.3f, 0.1f, -0.4f}).unsqueeze(0);
  in.prox_logp = in.logp.detach() - 0.05;  // not used by m2po: its ratio is to the behaviour policy
  in.advantages = at::tensor({1.0f});
  in.mask = at::ones({1, 4});
  PolicyLossOptions opt;
  opt.correction = Correction::kM2po;
  PolicyLossOutput out = PolicyLoss(in, opt);
  const double b = std::exp(std::sqrt(0.055));
  EXPECT_NEAR(out.loss.item<double>(), -(2 * b + std::exp(0.1) + std::exp(-0.4)) / 4, 1e-5);
  EXPECT_NEAR(out.clip_frac_high, 0.5, 1e-9);
  EXPECT_EQ(out.clip_frac_low, 0.0);
  EXPECT_EQ(out.health.masked_frac, 0.0) << "m2po drops no token";
  out.loss.backward();
  EXPECT_EQ(in.logp.grad()[0][0].item<float>(), 0.0f);
  EXPECT_EQ(in.logp.grad()[0][1].item<float>(), 0.0f);
  EXPECT_NEAR(in.logp.grad()[0][2].item<float>(), -std::exp(0.1) / 4, 1e-5);
  EXPECT_NEAR(in.logp.grad()[0][3].item<float>(), -std::exp(-0.4) / 4, 1e-5);

  // Under the budget (tau 1) nothing is clipped: the plain ratio to the behaviour policy.
  opt.m2po_tau = 1.0;
  out = PolicyLoss(in, opt);
  EXPECT_NEAR(out.loss.item<double>(), -(std::exp(0.5) + std::exp(0.3) + std::exp(0.1) + std::exp(-0.4)) / 4, 1e-5);
  EXPECT_EQ(out.clip_frac, 0.0);
}

// rl.max_group_share by hand: group 0 has two rows of 8 tokens, groups 1 and 2 one row of 2
// each, so under token_mean group 0 carries 16/20 = 0.8 of the loss. A cap of 0.5 scales its
// tokens to 0.5 in all (1/32 each) and leaves the others at 0.1; 0 or 1 leave everything.
TEST(PolicyLossTest, MaxGroupShareCapsALongGroup) {
  const at::Tensor mask = at::cat({at::ones({2, 8}), at::cat({at::ones({2, 2}), at::zeros({2, 6})}, 1)});
  const at::Tensor shares = TokenShares(mask, LossAggregation::kTokenMean, 8);
  const std::vector<int64_t> groups = {0, 0, 1, 2};
  const at::Tensor capped = CapGroupShares(shares, groups, 0.5);
  EXPECT_NEAR(capped.slice(0, 0, 2).sum().item<double>(), 0.5, 1e-6);
  EXPECT_NEAR(capped[0][0].item<double>(), 1.0 / 32, 1e-7);
  EXPECT_NEAR(capped[2].sum().item<double>(), 0.1, 1e-6);
  EXPECT_NEAR(capped[3].sum().item<double>(), 0.1, 1e-6);
  EXPECT_EQ(capped[2][5].item<float>(), 0.0f) << "padding keeps no share";
  EXPECT_TRUE(at::equal(CapGroupShares(shares, groups, 0.0), shares));
  EXPECT_TRUE(at::equal(CapGroupShares(shares, groups, 1.0), shares));
  EXPECT_NEAR(LargestGroupShare(shares, groups), 0.8, 1e-6);  // the metric group_share_max
  EXPECT_NEAR(LargestGroupShare(capped, groups), 0.5, 1e-6);
}

// With m2po_within_clip the budget only tightens PPO's clip: the same tokens at tau 1 (no M2PO
// clip) are held at 1 + clip_high = 1.28, and at tau 0.04 (bound e^0.2345 = 1.264) at 1.264.
TEST(PolicyLossTest, M2poWithinClipIsNeverWiderThanPpos) {
  PolicyLossInputs in;
  in.logp = Logs({0.6, 0.6, 0.6, 0.6}).requires_grad_(true);
  in.behav_logp = in.logp.detach() - at::tensor({0.5f, 0.3f, 0.1f, -0.4f}).unsqueeze(0);
  in.advantages = at::tensor({1.0f});
  in.mask = at::ones({1, 4});
  PolicyLossOptions opt;
  opt.correction = Correction::kM2po;
  opt.m2po_within_clip = true;
  opt.m2po_tau = 1.0;
  EXPECT_NEAR(PolicyLoss(in, opt).loss.item<double>(), -(2 * 1.28 + std::exp(0.1) + std::exp(-0.4)) / 4, 1e-5);
  opt.m2po_tau = 0.04;
  const double b = std::exp(std::sqrt(0.055));
  EXPECT_NEAR(PolicyLoss(in, opt).loss.item<double>(), -(2 * b + std::exp(0.1) + std::exp(-0.4)) / 4, 1e-5);
}

// One forged token in a batch of many near-on-policy harmful tokens keeps the harmful mean
// under the budget; the clip still holds it at max(c, 1 + clip_high), as under `none`.
TEST(PolicyLossTest, M2poBoundIsNeverWiderThanTheDualClip) {
  const int64_t n = 2000;
  PolicyLossInputs in;
  in.logp = at::full({1, n}, std::log(0.5f)).requires_grad_(true);
  at::Tensor lie = at::full({1, n}, 0.01f);
  lie[0][0] = 8.0f;  // claimed e^8 less likely than it is: (8^2 + 1999 * 1e-4) / 2000 = 0.032 <= 0.04
  in.behav_logp = in.logp.detach() - lie;
  in.advantages = at::tensor({1.0f});
  in.mask = at::ones({1, n});
  PolicyLossOptions opt;
  opt.correction = Correction::kM2po;
  PolicyLossOutput out = PolicyLoss(in, opt);
  out.loss.backward();
  EXPECT_EQ(in.logp.grad()[0][0].item<float>(), 0.0f) << "clipped at c = 3, no gradient";
  EXPECT_NEAR(out.loss.item<double>(), -(opt.clip_ratio_c + (n - 1) * std::exp(0.01)) / n, 1e-5);
}

// A behaviour log-prob of -100 (the intake lets it through; -110 is its floor) would make
// exp(logp - behav) overflow fp32: the log-ratio is clamped to 20, the loss and gradient stay
// finite, and the clamped token adds no gradient (the dual clip floors its objective at c A).
TEST(PolicyLossTest, ExtremeLogRatiosAreClampedAndStayFinite) {
  for (Correction c : {Correction::kNone, Correction::kDecoupled}) {
    PolicyLossInputs in;
    in.logp = Logs({0.5, 0.5}).requires_grad_(true);
    in.behav_logp = at::tensor({-100.0f, std::log(0.5f)}).unsqueeze(0);
    in.advantages = at::tensor({-1.0f});
    in.mask = at::ones({1, 2});
    PolicyLossOptions opt;
    opt.correction = c;
    PolicyLossOutput out = PolicyLoss(in, opt);
    ASSERT_TRUE(std::isfinite(out.loss.item<double>()));
    out.loss.backward();
    EXPECT_TRUE(at::isfinite(in.logp.grad()).all().item<bool>());
    EXPECT_EQ(in.logp.grad()[0][0].item<float>(), 0.0f);
    if (c == Correction::kNone) {
      // Token 0: ratio e^20 with A = -1, dual-clipped to c A = -3; token 1 on-policy: (3 + 1) / 2.
      EXPECT_NEAR(out.loss.item<double>(), (opt.clip_ratio_c + 1.0) / 2, 1e-5);
      EXPECT_NEAR(out.clip_frac, 0.5, 1e-9);
    } else {
      // Token 0's weight e^20 is above the cap: dropped (weight 0), so the mean weight is 1 / 2.
      EXPECT_NEAR(out.behav_weight_mean, 0.5, 1e-6);
      EXPECT_NEAR(out.health.masked_frac, 0.5, 1e-9);
    }
  }
}

// The gradient hijack: a behaviour log-prob forged 19.9 nats below the truth (inside the
// log-ratio clamp and above the intake's floor) used to multiply that token's gradient by
// e^19.9 under `none` and `decoupled`. Whatever the claim, every correction now bounds a
// token's gradient by W max(c, 1 + clip_high) |A| / tokens (grpo.h).
TEST(PolicyLossTest, ForgedBehaviourLogProbsCannotScaleATokensGradient) {
  for (Correction c : {Correction::kNone, Correction::kTruncatedIS, Correction::kDecoupled, Correction::kIcePop,
                       Correction::kM2po}) {
    for (float a : {-1.0f, 1.0f}) {
      for (float lie : {-19.9f, -5.0f, -1.5f, 0.7f}) {
        PolicyLossInputs in;
        in.logp = Logs({0.5, 0.5}).requires_grad_(true);
        in.behav_logp = in.logp.detach() + at::tensor({lie, 0.0f}).unsqueeze(0);
        in.behav_logp = at::clamp_max(in.behav_logp, 0.0);
        in.advantages = at::tensor({a});
        in.mask = at::ones({1, 2});
        PolicyLossOptions opt;
        opt.correction = c;
        PolicyLossOutput out = PolicyLoss(in, opt);
        out.loss.backward();
        const double w = c == Correction::kTruncatedIS ? opt.tis_cap
                         : c == Correction::kDecoupled ? opt.decoupled_cap
                         : c == Correction::kIcePop    ? opt.icepop_beta
                                                       : 1.0;
        const double bound = w * std::max(opt.clip_ratio_c, 1.0 + opt.clip_high) * std::abs(a) / 2;
        const double g = in.logp.grad().abs().max().item<double>();
        EXPECT_LE(g, bound * (1 + 1e-6)) << "correction " << static_cast<int>(c) << " A " << a << " lie " << lie;
        // The metric that reports it: the largest w r of a token that has a gradient.
        EXPECT_LE(out.max_token_weight, bound * 2 / std::abs(a) * (1 + 1e-6));
        EXPECT_NEAR(out.max_token_weight * std::abs(a) / 2, g, 1e-5 * (1 + g));
      }
    }
  }
}

// A token with A = 0 has no gradient whatever its ratio: it does not count in
// max_token_weight (a group without reward spread, sampled by a stale actor, reported 12.7).
TEST(PolicyLossTest, TokensWithoutAdvantageDoNotCountInTheLargestTokenWeight) {
  PolicyLossInputs in;
  in.logp = Logs({0.5, 0.5}).requires_grad_(true);
  in.behav_logp = Logs({0.5, 0.01});  // ratio 50 on token 1
  in.advantages = at::tensor({0.0f});
  in.mask = at::ones({1, 2});
  EXPECT_EQ(PolicyLoss(in, PolicyLossOptions{}).max_token_weight, 0.0);
  in.advantages = at::tensor({-1.0f});
  EXPECT_NEAR(PolicyLoss(in, PolicyLossOptions{}).max_token_weight, 1.0, 1e-6);  // token 1 dual-clipped
}

TEST(PolicyLossTest, KlToReferenceIsK3Estimator) {
  // ref = log 0.5, logp = log 0.25: d = ln 2, k3 = 2 - ln 2 - 1.
  PolicyLossInputs in;
  in.logp = Logs({0.25}).requires_grad_(true);
  in.behav_logp = Logs({0.25});
  in.ref_logp = Logs({0.5});
  in.advantages = at::tensor({0.0f});
  in.mask = at::ones({1, 1});
  PolicyLossOptions opt;
  opt.kl_coef = 0.1;
  PolicyLossOutput out = PolicyLoss(in, opt);
  const double k3 = 1.0 - std::log(2.0);
  EXPECT_NEAR(out.kl, k3, 1e-6);
  EXPECT_NEAR(out.loss.item<double>(), 0.1 * k3, 1e-6);
}

TEST(PolicyLossTest, TokenLevelAggregationIgnoresPaddingAndWeighsByTokens) {
  // Row 0 has 3 tokens with A=1 at r=1, row 1 has 1 token with A=-1 at r=1 and 2 padding.
  PolicyLossInputs in;
  in.logp = at::zeros({2, 3}).requires_grad_(true);
  in.behav_logp = at::zeros({2, 3});
  in.advantages = at::tensor({1.0f, -1.0f});
  in.mask = at::tensor({1.f, 1.f, 1.f, 1.f, 0.f, 0.f}).reshape({2, 3});
  PolicyLossOutput out = PolicyLoss(in, PolicyLossOptions{});
  EXPECT_NEAR(out.loss.item<double>(), -(3.0 - 1.0) / 4.0, 1e-6);
}

TEST(PolicyLossTest, ParseCorrectionRejectsUnknown) {
  EXPECT_EQ(ParseCorrection("m2po").value(), Correction::kM2po);
  EXPECT_EQ(ParseCorrection("icepop").value(), Correction::kIcePop);
  EXPECT_TRUE(ParseCorrection("tis").ok());
  Result<Correction> bad = ParseCorrection("vtrace");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("vtrace"), std::string::npos);
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// DAPO's soft overlong punishment at its boundaries: Lmax 100, buffer 20.
TEST(Overlong, PenaltyAtTheBoundaries) {
  const OverlongOptions o{20, 1.0, false};
  EXPECT_EQ(OverlongPenalty(50, 100, o), 0.0);
  EXPECT_EQ(OverlongPenalty(80, 100, o), 0.0);       // Lmax - buffer: no punishment yet
  EXPECT_DOUBLE_EQ(OverlongPenalty(81, 100, o), -0.05);
  EXPECT_DOUBLE_EQ(OverlongPenalty(90, 100, o), -0.5);
  EXPECT_DOUBLE_EQ(OverlongPenalty(100, 100, o), -1.0);  // at the limit: -penalty
  EXPECT_DOUBLE_EQ(OverlongPenalty(100, 100, {20, 0.5, false}), -0.5);
  EXPECT_EQ(OverlongPenalty(100, 100, {0, 1.0, false}), 0.0) << "buffer 0: off";
}

// Cut at the limit means: the limit's tokens and no stop id at the end.
TEST(Overlong, TruncatedIsDecidedFromTheTokens) {
  const std::vector<int64_t> stops = {2, 7};
  EXPECT_FALSE(Truncated({5, 5, 5}, 4, stops));
  EXPECT_TRUE(Truncated({5, 5, 5, 5}, 4, stops));
  EXPECT_FALSE(Truncated({5, 5, 5, 7}, 4, stops)) << "stopped exactly at the limit";
  EXPECT_FALSE(Truncated({5, 5, 5, 5}, 0, stops)) << "no limit known";
}

// A two-group batch: rows of 2 and 4 completion tokens (group 0), 1 and 3 (group 1), advantages
// +1, -1, +0.5, -0.5, ratio 1 everywhere (so a token's loss is -A): each aggregation by hand.
TEST(LossAggregation, EachModeOnATwoGroupBatch) {
  const std::vector<int64_t> lengths = {2, 4, 1, 3};
  at::Tensor mask = at::zeros({4, 5});
  for (int64_t r = 0; r < 4; ++r) mask[r].narrow(0, 0, lengths[static_cast<size_t>(r)]).fill_(1.0);
  PolicyLossInputs in;
  in.logp = at::full({4, 5}, -1.0).requires_grad_(true);
  in.behav_logp = at::full({4, 5}, -1.0);
  in.advantages = at::tensor({1.0f, -1.0f, 0.5f, -0.5f});
  in.mask = mask;
  struct Case {
    LossAggregation how;
    double share_row0, loss;
  };
  // token_mean: 10 tokens, -(2 - 4 + 0.5 - 1.5) / 10. seq_mean_token_mean: -(1 - 1 + 0.5 - 0.5) / 4.
  // seq_mean_token_sum_norm, max_new_tokens 5: -(2 - 4 + 0.5 - 1.5) / (5 x 4).
  for (const Case& c : {Case{LossAggregation::kTokenMean, 0.1, 0.3}, Case{LossAggregation::kSeqMeanTokenMean, 0.125, 0.0},
                        Case{LossAggregation::kSeqMeanTokenSumNorm, 0.05, 0.15}}) {
    const at::Tensor shares = TokenShares(mask, c.how, 5);
    EXPECT_NEAR(shares[0][0].item<double>(), c.share_row0, 1e-7);
    EXPECT_EQ(shares[0][2].item<double>(), 0.0) << "no share off the mask";
    in.token_share = shares;
    EXPECT_NEAR(PolicyLoss(in, {}).loss.item<double>(), c.loss, 1e-6) << static_cast<int>(c.how);
  }
  EXPECT_NEAR(TokenShares(mask, LossAggregation::kSeqMeanTokenMean, 5)[1][0].item<double>(), 1.0 / 16, 1e-7);
  EXPECT_THROW(TokenShares(mask, LossAggregation::kSeqMeanTokenSumNorm, 0), c10::Error);
  EXPECT_FALSE(ParseLossAggregation("sequence").ok());
}

// One token held by each clip: A > 0 above 1 + clip_high, A < 0 below 1 - clip_low, A < 0
// above c (the dual clip), and one unclipped.
TEST(PolicyLossTest, ClipFractionsByClip) {
  PolicyLossInputs in;
  in.behav_logp = at::zeros({4, 1});
  in.logp = at::log(at::tensor({1.5f, 0.5f, 5.0f, 1.0f})).view({4, 1}).requires_grad_(true);
  in.advantages = at::tensor({1.0f, -1.0f, -1.0f, 1.0f});
  in.mask = at::ones({4, 1});
  const PolicyLossOutput out = PolicyLoss(in, {});
  EXPECT_DOUBLE_EQ(out.clip_frac_high, 0.25);
  EXPECT_DOUBLE_EQ(out.clip_frac_low, 0.25);
  EXPECT_DOUBLE_EQ(out.clip_frac_dual, 0.25);
  EXPECT_DOUBLE_EQ(out.clip_frac, 0.75);
}

}  // namespace
}  // namespace echelon::learn

namespace echelon::learn {
namespace {

// GSPO's sequence ratio by hand: row 0's two tokens have log-ratios 0.1 and 0.3 (s = e^0.2),
// row 1's one token -0.2 (s = e^-0.2); A = +1, -1. Averaged per completion (seq_mean_token_mean):
// unclipped, loss = -(s0 - s1) / 2 and a token of row 0 gets -s0 / 2 / 2; clipped at 0.1, both
// rows sit on the clip (s0 > 1.1 with A > 0, s1 < 0.9 with A < 0): loss -(1.1 - 0.9) / 2, no
// gradient.
TEST(PolicyLossTest, SequenceRatioAndItsClipByHand) {
  const at::Tensor mask = at::tensor({1.0f, 1.0f, 1.0f, 0.0f}).view({2, 2});
  PolicyLossInputs in;
  in.behav_logp = at::full({2, 2}, -1.0);
  in.logp = (in.behav_logp + at::tensor({0.1f, 0.3f, -0.2f, 0.0f}).view({2, 2})).requires_grad_(true);
  in.advantages = at::tensor({1.0f, -1.0f});
  in.mask = mask;
  in.token_share = TokenShares(mask, LossAggregation::kSeqMeanTokenMean, 2);
  PolicyLossOptions o;
  o.ratio = RatioLevel::kSequence;
  o.clip_low = o.clip_high = 0.5;
  const double s0 = std::exp(0.2), s1 = std::exp(-0.2);
  PolicyLossOutput out = PolicyLoss(in, o);
  EXPECT_NEAR(out.loss.item<double>(), -(s0 - s1) / 2, 1e-6);
  at::Tensor g = torch::autograd::grad({out.loss}, {in.logp})[0];
  EXPECT_NEAR(g[0][0].item<double>(), -s0 / 4, 1e-6);
  EXPECT_NEAR(g[0][1].item<double>(), -s0 / 4, 1e-6);
  EXPECT_NEAR(g[1][0].item<double>(), s1 / 2, 1e-6);
  EXPECT_EQ(g[1][1].item<double>(), 0.0);
  o.clip_low = o.clip_high = 0.1;
  out = PolicyLoss(in, o);
  EXPECT_NEAR(out.loss.item<double>(), -(1.1 - 0.9) / 2, 1e-6);
  EXPECT_DOUBLE_EQ(out.clip_frac, 1.0);
  g = torch::autograd::grad({out.loss}, {in.logp})[0];
  EXPECT_EQ(g.abs().max().item<double>(), 0.0);
  EXPECT_FALSE(ParseRatioLevel("group").ok());
}

}  // namespace
}  // namespace echelon::learn
