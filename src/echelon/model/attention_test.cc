#include "echelon/model/attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>

namespace echelon::model {
namespace {

double MaxDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

struct Case {
  std::string name;
  int64_t batch, heads, kv, t, s, d;
  AttentionLayout layout;
};

// Left padding: row b's first pad[b] key columns are padding.
at::Tensor LeftPadded(const std::vector<int64_t>& pad, int64_t s) {
  at::Tensor valid = at::ones({static_cast<int64_t>(pad.size()), s}, at::kBool);
  for (size_t b = 0; b < pad.size(); ++b) valid[static_cast<int64_t>(b)].narrow(0, 0, pad[b]).fill_(false);
  return valid;
}

// Packed rows: sequences of the given lengths back to back, then padding (-1) to t.
at::Tensor Packed(const std::vector<std::vector<int64_t>>& lengths, int64_t t) {
  at::Tensor seg = at::full({static_cast<int64_t>(lengths.size()), t}, -1, at::kLong);
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t at = 0, id = 0;
    for (int64_t len : lengths[b]) {
      seg[static_cast<int64_t>(b)].narrow(0, at, len).fill_(id++);
      at += len;
    }
  }
  return seg;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"causal, GQA 3", 2, 6, 2, 37, 37, 8, {}});
  cases.push_back({"causal, MHA, one row", 1, 4, 4, 50, 50, 16, {}});
  Case offset{"queries after a 32-key prefix", 2, 4, 2, 5, 37, 8, {}};
  offset.layout.start = 32;
  cases.push_back(offset);
  Case rows{"a start per row", 3, 4, 1, 3, 41, 8, {}};
  rows.layout.row_start = {0, 38, 17};
  cases.push_back(rows);
  Case padded{"left padding", 3, 4, 2, 29, 29, 8, {}};
  padded.layout.key_valid = LeftPadded({0, 5, 28}, 29);
  cases.push_back(padded);
  Case packed{"packed rows with trailing padding", 2, 6, 3, 45, 45, 8, {}};
  packed.layout.segments = Packed({{10, 1, 19, 12}, {44}}, 45);
  cases.push_back(packed);
  return cases;
}

// Tiled attention equals the untiled definition within 1e-5 (fp32) in its output and in the
// gradients of q, k and v, for tile sizes that divide nothing.
TEST(AttentionTest, TiledEqualsPlainInOutputsAndGradients) {
  at::manual_seed(11);
  for (const Case& c : Cases()) {
    for (const AttentionTiles tiles : {AttentionTiles{7, 5}, AttentionTiles{16, 9}, AttentionTiles{}}) {
      const at::Tensor q = at::randn({c.batch, c.heads, c.t, c.d}).requires_grad_(true);
      const at::Tensor k = at::randn({c.batch, c.kv, c.s, c.d}).requires_grad_(true);
      const at::Tensor v = at::randn({c.batch, c.kv, c.s, c.d}).requires_grad_(true);
      const at::Tensor w = at::randn({c.batch, c.heads, c.t, c.d});
      const double scale = 1.0 / std::sqrt(double(c.d));
      const at::Tensor tiled = Attend(q, k, v, c.layout, scale, tiles);
      const at::Tensor plain = PlainAttention(q, k, v, c.layout, scale);
      const std::string where = c.name + " tiles " + std::to_string(tiles.query) + "x" + std::to_string(tiles.key);
      EXPECT_LT(MaxDiff(tiled, plain), 1e-5) << where;
      const auto g_tiled = torch::autograd::grad({(tiled * w).sum()}, {q, k, v});
      const auto g_plain = torch::autograd::grad({(plain * w).sum()}, {q, k, v});
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_LT(MaxDiff(g_tiled[i], g_plain[i]), 1e-5) << where << " gradient " << "qkv"[i];
        EXPECT_TRUE(g_tiled[i].isfinite().all().item<bool>()) << where;
      }
    }
  }
}

// A query that sees no key (all its keys padding) gets zeros, and nothing turns NaN.
TEST(AttentionTest, AQueryThatSeesNoKeyGetsZeros) {
  AttentionLayout layout;
  layout.key_valid = LeftPadded({6}, 8);  // queries 0..5 see nothing
  const at::Tensor q = at::randn({1, 2, 8, 4}).requires_grad_(true);
  const at::Tensor k = at::randn({1, 1, 8, 4}).requires_grad_(true), v = at::randn({1, 1, 8, 4});
  const at::Tensor out = Attend(q, k, v, layout, 0.5, {3, 3});
  EXPECT_EQ(out.narrow(2, 0, 6).abs().max().item<double>(), 0.0);
  EXPECT_GT(out.narrow(2, 6, 2).abs().max().item<double>(), 0.0);
  const auto g = torch::autograd::grad({out.sum()}, {q, k});
  EXPECT_TRUE(g[0].isfinite().all().item<bool>() && g[1].isfinite().all().item<bool>());
}

// Keys held in blocks (a KV cache) give what the same keys in one tensor give, for queries
// appended after them and for rows at their own lengths.
TEST(AttentionTest, BlocksEqualContiguousKeys) {
  at::manual_seed(12);
  const int64_t batch = 3, heads = 4, kv = 2, d = 8, s = 45, block = 8;
  const at::Tensor k = at::randn({batch, kv, s, d}), v = at::randn({batch, kv, s, d});
  std::vector<at::Tensor> kb, vb;
  for (int64_t j = 0; j < s; j += block) {
    at::Tensor kj = at::zeros({batch, kv, block, d}), vj = at::zeros({batch, kv, block, d});
    const int64_t n = std::min(block, s - j);
    kj.narrow(2, 0, n).copy_(k.narrow(2, j, n));
    vj.narrow(2, 0, n).copy_(v.narrow(2, j, n));
    kb.push_back(kj);
    vb.push_back(vj);
  }
  const at::Tensor q = at::randn({batch, heads, 6, d});
  AttentionLayout appended;
  appended.start = s - 6;
  for (const AttentionTiles tiles : {AttentionTiles{4, 5}, AttentionTiles{}}) {
    EXPECT_LT(MaxDiff(AttendBlocks(q, kb, vb, s, appended, 0.3, tiles), PlainAttention(q, k, v, appended, 0.3)), 1e-5);
    AttentionLayout rows;
    rows.row_start = {0, 20, 39};  // rows at their own lengths: row 0 sees 1..6 keys
    EXPECT_LT(MaxDiff(AttendBlocks(q, kb, vb, s, rows, 0.3, tiles), PlainAttention(q, k, v, rows, 0.3)), 1e-5);
  }
  EXPECT_THROW(AttendBlocks(q, kb, vb, s + 40, appended, 0.3), c10::Error) << "more columns than the blocks hold";
}

// bf16 inputs accumulate in fp32: the tiled output of bf16 tensors equals the fp32 definition
// over the same (bf16-rounded) values to bf16's rounding of the output.
TEST(AttentionTest, Bf16InputsAccumulateInFp32) {
  at::manual_seed(13);
  const at::Tensor q = at::randn({2, 4, 70, 16}).to(at::kBFloat16), k = at::randn({2, 2, 70, 16}).to(at::kBFloat16);
  const at::Tensor v = at::randn({2, 2, 70, 16}).to(at::kBFloat16);
  const at::Tensor out = Attend(q, k, v, {}, 0.25, {16, 16});
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  const at::Tensor want = PlainAttention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), {}, 0.25);
  EXPECT_LT(MaxDiff(out.to(at::kFloat), want), 1e-2);
}

TEST(AttentionTest, RefusesShapesThatDoNotFit) {
  const at::Tensor q = at::randn({1, 3, 4, 8}), k = at::randn({1, 2, 4, 8});
  EXPECT_THROW(Attend(q, k, k, {}, 1.0), c10::Error) << "3 heads over 2 kv heads";
  AttentionLayout bad;
  bad.segments = at::zeros({1, 3}, at::kLong);
  EXPECT_THROW(Attend(at::randn({1, 2, 4, 8}), k, k, bad, 1.0), c10::Error) << "segments of the wrong length";
  AttentionLayout rows;
  rows.row_start = {0, 1};
  EXPECT_THROW(Attend(at::randn({1, 2, 4, 8}), k, k, rows, 1.0), c10::Error) << "two row starts for one row";
}

}  // namespace
}  // namespace echelon::model
