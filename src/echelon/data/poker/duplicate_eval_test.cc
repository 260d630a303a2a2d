#include "echelon/data/poker/duplicate_eval.h"

#include <gtest/gtest.h>

#include <cmath>

namespace echelon::data::poker {
namespace {

// Answers a pseudo-random letter from the prompt text alone, so the same prompt always gets
// the same answer whatever the batching.
class TextHashPolicy : public Policy {
 public:
  Result<std::vector<Turn>> Sample(const std::vector<PolicyPrompt>& prompts, uint64_t) override {
    std::vector<Turn> out(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      uint64_t h = 0;
      for (char c : prompts[i].user) h = HashCombine(h, static_cast<uint64_t>(c));
      out[i].text = std::string(1, "fcr"[h % 3]);
    }
    return out;
  }
};

// The result equals a direct computation over the same deals (both seats), and does not
// depend on the batch size.
TEST(PokerDuplicateEval, MatchesDirectComputation) {
  TextHashPolicy policy;
  DuplicateOptions o;
  o.opponent = OpponentKind::kTag;
  o.hands = 600;
  o.seed = 9;
  o.max_batch = 64;
  const DuplicateResult r = EvaluateDuplicate(policy, o).value();
  std::vector<TableSpec> tables;
  for (int64_t i = 0; i < 300; ++i)
    for (int seat = 0; seat < 2; ++seat) tables.push_back(TableSpec{EvalDealSeed(9, i), seat, OpponentKind::kTag});
  const std::vector<PlayedHand> played = PlayHands(tables, policy, 0, RunnerOptions()).value();
  std::vector<double> deal_mbb;
  double sum = 0;
  int64_t decisions = 0, illegal = 0;
  for (size_t i = 0; i < played.size(); i += 2) {
    deal_mbb.push_back(1000.0 * (played[i].chips + played[i + 1].chips) / 2 / 2);
    sum += deal_mbb.back();
  }
  for (const PlayedHand& h : played) {
    decisions += static_cast<int64_t>(h.episode.turns.size());
    illegal += h.illegal;
  }
  const double mean = sum / deal_mbb.size();
  double ss = 0;
  for (double v : deal_mbb) ss += (v - mean) * (v - mean);
  const double half = 1.96 * std::sqrt(ss / (deal_mbb.size() - 1) / deal_mbb.size());
  EXPECT_NEAR(r.mbb_per_hand, mean, 1e-9);
  EXPECT_NEAR(r.ci95_lo, mean - half, 1e-6);
  EXPECT_NEAR(r.ci95_hi, mean + half, 1e-6);
  EXPECT_EQ(r.decisions, decisions);
  EXPECT_EQ(r.illegal, illegal);
  EXPECT_GT(illegal, 0);  // "f" with a free check
  o.max_batch = 7;
  EXPECT_EQ(EvaluateDuplicate(policy, o).value().mbb_per_hand, r.mbb_per_hand);
}

TEST(PokerDuplicateEval, RejectsOddHandCounts) {
  TextHashPolicy policy;
  for (int64_t hands : {0, 1, 3, -2}) {
    DuplicateOptions o;
    o.hands = hands;
    Result<DuplicateResult> r = EvaluateDuplicate(policy, o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("hands must be an even number >= 2"), std::string::npos);
  }
}

}  // namespace
}  // namespace echelon::data::poker
