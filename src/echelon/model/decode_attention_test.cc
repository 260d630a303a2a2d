#include "echelon/model/decode_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace echelon::model {
namespace {

// The same attention by plain tensor ops, one row at a time over exactly its own keys.
at::Tensor Reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<int64_t>& lengths,
                     double scale) {
  const int64_t group = q.size(1) / k.size(1);
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < q.size(0); ++b) {
    const int64_t len = lengths[static_cast<size_t>(b)];
    const at::Tensor kb = k[b].narrow(1, 0, len).repeat_interleave(group, 0).to(at::kDouble);  // [H, len, D]
    const at::Tensor vb = v[b].narrow(1, 0, len).repeat_interleave(group, 0).to(at::kDouble);
    const at::Tensor scores = at::matmul(kb, q[b].to(at::kDouble).unsqueeze(-1)).squeeze(-1) * scale;  // [H, len]
    rows.push_back(at::matmul(at::softmax(scores, -1).unsqueeze(1), vb).squeeze(1));
  }
  return at::stack(rows).to(at::kFloat);
}

// [B, KV, C, D] cut into contiguous blocks of `block` columns (the last one zero-padded), as a
// KVCache holds them.
std::vector<at::Tensor> Blocks(const at::Tensor& t, int64_t block) {
  std::vector<at::Tensor> out;
  for (int64_t j = 0; j < t.size(2); j += block) {
    at::Tensor b = at::zeros({t.size(0), t.size(1), block, t.size(3)}, t.options());
    const int64_t n = std::min(block, t.size(2) - j);
    b.narrow(2, 0, n).copy_(t.narrow(2, j, n));
    out.push_back(b);
  }
  return out;
}

at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths, double scale,
                           const std::vector<DecodePrefix>& prefixes = {}, int64_t block = 16) {
  return model::DecodeAttention(q, Blocks(k, block), Blocks(v, block), lengths, scale, prefixes);
}

TEST(DecodeAttentionTest, EqualsPerRowSoftmaxAttention) {
  at::manual_seed(3);
  for (int64_t d : {32, 12}) {  // 12: a head size that is not a multiple of the 8-wide sums
    const int64_t batch = 5, heads = 6, kv = 2, capacity = 40;
    const at::Tensor q = at::randn({batch, heads, d});
    const at::Tensor k = at::randn({batch, kv, capacity, d});
    const at::Tensor v = at::randn({batch, kv, capacity, d});
    const std::vector<int64_t> lengths = {1, 40, 7, 23, 2};
    const double scale = 1.0 / std::sqrt(double(d));
    const at::Tensor got = DecodeAttention(q, k, v, lengths, scale);
    EXPECT_LT((got - Reference(q, k, v, lengths, scale)).abs().max().item<float>(), 1e-5) << "d=" << d;
    // One block or blocks of 7 (rows ending mid-block) give the same.
    for (int64_t block : {int64_t{40}, int64_t{7}})
      EXPECT_LT((DecodeAttention(q, k, v, lengths, scale, {}, block) - got).abs().max().item<float>(), 1e-6)
          << "d=" << d << " block " << block;
    // Keys past a row's length are never read.
    const at::Tensor k2 = k.clone(), v2 = v.clone();
    k2[2].narrow(1, 7, capacity - 7).fill_(NAN);
    v2[2].narrow(1, 7, capacity - 7).fill_(1e30);
    EXPECT_TRUE(at::equal(DecodeAttention(q, k2, v2, lengths, scale), got)) << "d=" << d;
  }
}

// A shared prefix read ahead of a row's own keys equals attention over the two concatenated.
TEST(DecodeAttentionTest, SharedPrefixEqualsConcatenatedKeys) {
  at::manual_seed(4);
  const int64_t batch = 4, heads = 4, kv = 2, d = 16, capacity = 12;
  const at::Tensor q = at::randn({batch, heads, d});
  const at::Tensor k = at::randn({batch, kv, capacity, d}), v = at::randn({batch, kv, capacity, d});
  const std::vector<int64_t> lengths = {3, 1, 12, 5};
  const DecodePrefix shared{at::randn({kv, 9, d}), at::randn({kv, 9, d})};
  const std::vector<DecodePrefix> prefixes = {shared, DecodePrefix{}, shared, {at::randn({kv, 2, d}), at::randn({kv, 2, d})}};
  const at::Tensor got = DecodeAttention(q, k, v, lengths, 0.25, prefixes);
  for (int64_t b = 0; b < batch; ++b) {
    const DecodePrefix& p = prefixes[static_cast<size_t>(b)];
    const int64_t own = lengths[static_cast<size_t>(b)];
    at::Tensor kb = k[b].narrow(1, 0, own), vb = v[b].narrow(1, 0, own);
    if (p.k.defined()) {
      kb = at::cat({p.k, kb}, 1);
      vb = at::cat({p.v, vb}, 1);
    }
    const at::Tensor want = Reference(q.narrow(0, b, 1), kb.unsqueeze(0).contiguous(), vb.unsqueeze(0).contiguous(),
                                      {kb.size(1)}, 0.25);
    EXPECT_LT((got[b] - want[0]).abs().max().item<float>(), 1e-5) << "row " << b;
  }
  EXPECT_THROW(DecodeAttention(q, k, v, lengths, 0.25, {shared}), c10::Error) << "one prefix entry per row";
  EXPECT_THROW(DecodeAttention(q, k, v, lengths, 0.25, {shared, {}, {at::randn({3, 2, d}), at::randn({3, 2, d})}, {}}),
               c10::Error)
      << "a prefix of another shape";
}

TEST(DecodeAttentionTest, RefusesBadShapesAndLengths) {
  const at::Tensor q = at::randn({2, 4, 8}), k = at::randn({2, 2, 5, 8});
  EXPECT_THROW(DecodeAttention(q, k, k, {1}, 1.0), c10::Error);
  EXPECT_THROW(DecodeAttention(q, k, k, {0, 3}, 1.0), c10::Error);
  EXPECT_THROW(DecodeAttention(q, k, k, {6, 3}, 1.0, {}, 5), c10::Error);
  EXPECT_THROW(DecodeAttention(q, at::randn({2, 3, 5, 8}), at::randn({2, 3, 5, 8}), {1, 1}, 1.0), c10::Error);
  EXPECT_THROW(DecodeAttention(q.to(at::kDouble), k, k, {1, 1}, 1.0), c10::Error);
  EXPECT_FALSE(DecodeAttentionSupports(q.to(at::kBFloat16)));
}

}  // namespace
}  // namespace echelon::model
