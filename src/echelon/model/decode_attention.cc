#include "echelon/model/decode_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "echelon/model/cpu_clones.h"

namespace echelon::model {
namespace {

// The kernels read each key and value once for all G query heads of the kv head: decoding
// attention is bound by reading the cache from memory.

// One (row, kv head), first pass over one run of `n` keys: the scaled dot products of its G
// query heads with them, into `scores` (G rows of `stride`).
ECHELON_CPU_CLONES
void ScoreKeys(const float* q, const float* k, float* scores, int64_t group, int64_t n, int64_t stride, int64_t d,
               float scale) {
  for (int64_t s = 0; s < n; ++s) {
    const float* ks = k + s * d;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * d;
      // Eight partial sums, so the dot product vectorises without reassociating one sum.
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= d; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += qg[i + j] * ks[i + j];
      float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; i < d; ++i) dot += qg[i] * ks[i];
      scores[g * stride + s] = dot * scale;
    }
  }
}

// Each head's `n` scores minus their largest; -inf up to `stride` (exp gives 0 there).
void CenterScores(float* scores, int64_t group, int64_t n, int64_t stride) {
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * stride;
    const float top = *std::max_element(sg, sg + n);
    for (int64_t s = 0; s < n; ++s) sg[s] -= top;
    std::fill(sg + n, sg + stride, -INFINITY);
  }
}

// Second pass, after exp, over one run of `n` values: adds each head's weighted values to `mix`
// (G x d).
ECHELON_CPU_CLONES
void MixValues(const float* weights, const float* v, float* mix, int64_t group, int64_t n, int64_t stride,
               int64_t d) {
  for (int64_t s = 0; s < n; ++s) {
    const float* vs = v + s * d;
    for (int64_t g = 0; g < group; ++g) {
      const float w = weights[g * stride + s];
      float* mg = mix + g * d;
      for (int64_t i = 0; i < d; ++i) mg[i] += w * vs[i];
    }
  }
}

}  // namespace

bool DecodeAttentionSupports(const at::Tensor& like) {
  return like.device().is_cpu() && like.scalar_type() == at::kFloat;
}

at::Tensor DecodeAttention(const at::Tensor& q, const std::vector<at::Tensor>& k_blocks,
                           const std::vector<at::Tensor>& v_blocks, const std::vector<int64_t>& lengths, double scale,
                           const std::vector<DecodePrefix>& prefixes) {
  TORCH_CHECK(!k_blocks.empty() && k_blocks.size() == v_blocks.size(), "DecodeAttention: ", k_blocks.size(),
              " key and ", v_blocks.size(), " value blocks");
  const at::Tensor& k0 = k_blocks[0];
  TORCH_CHECK(q.dim() == 3 && k0.dim() == 4, "DecodeAttention: q [B, H, D] and blocks [B, KV, block, D] expected, got ",
              q.sizes(), " and ", k0.sizes());
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(2), kv = k0.size(1), block = k0.size(2);
  const int64_t capacity = block * static_cast<int64_t>(k_blocks.size());
  TORCH_CHECK(k0.size(0) == batch && k0.size(3) == d && heads % kv == 0, "DecodeAttention: shapes do not match: q ",
              q.sizes(), ", blocks ", k0.sizes());
  TORCH_CHECK(static_cast<int64_t>(lengths.size()) == batch, "DecodeAttention: ", lengths.size(), " lengths for ",
              batch, " rows");
  TORCH_CHECK(prefixes.empty() || static_cast<int64_t>(prefixes.size()) == batch, "DecodeAttention: ",
              prefixes.size(), " prefixes for ", batch, " rows");
  for (int64_t len : lengths)
    TORCH_CHECK(len >= 1 && len <= capacity, "DecodeAttention: row length ", len, " outside [1, ", capacity, "]");
  TORCH_CHECK(DecodeAttentionSupports(q) && q.is_contiguous(), "DecodeAttention: a contiguous fp32 CPU query");
  std::vector<const float*> kb, vb;  // each block's data
  for (size_t j = 0; j < k_blocks.size(); ++j) {
    const at::Tensor &kj = k_blocks[j], &vj = v_blocks[j];
    TORCH_CHECK(kj.sizes() == k0.sizes() && vj.sizes() == k0.sizes(), "DecodeAttention: block ", j, " is ",
                kj.sizes(), ", block 0 ", k0.sizes());
    TORCH_CHECK(DecodeAttentionSupports(kj) && DecodeAttentionSupports(vj) && kj.is_contiguous() && vj.is_contiguous(),
                "DecodeAttention: contiguous fp32 CPU blocks only");
    kb.push_back(kj.data_ptr<float>());
    vb.push_back(vj.data_ptr<float>());
  }
  std::vector<int64_t> prefix_len(static_cast<size_t>(batch), 0);
  for (size_t b = 0; b < prefixes.size(); ++b) {
    const DecodePrefix& p = prefixes[b];
    if (!p.k.defined()) continue;
    TORCH_CHECK(p.k.dim() == 3 && p.k.size(0) == kv && p.k.size(2) == d && p.v.sizes() == p.k.sizes(),
                "DecodeAttention: a prefix must be [", kv, ", length, ", d, "], got ", p.k.sizes());
    TORCH_CHECK(DecodeAttentionSupports(p.k) && DecodeAttentionSupports(p.v) && p.k.is_contiguous() &&
                    p.v.is_contiguous(), "DecodeAttention: prefixes must be contiguous fp32 CPU tensors");
    prefix_len[b] = p.k.size(1);
  }
  const int64_t group = heads / kv;
  int64_t longest = 0;  // prefix + own keys, the longest row
  for (int64_t b = 0; b < batch; ++b)
    longest = std::max(longest, prefix_len[static_cast<size_t>(b)] + lengths[static_cast<size_t>(b)]);
  at::Tensor out = at::empty({batch, heads, d}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  // Per (row, kv head): the scores of its prefix's keys then its own, block by block, into one
  // row of `longest`; exp over all scores at once (vectorised by ATen); then the weighted values.
  at::Tensor scores = at::empty({batch, heads, longest}, q.options());
  float* sp = scores.data_ptr<float>();
  struct Run {
    const float *k, *v;
    int64_t n;
  };
  // Rows that read the same prefix go one after another, kv head by kv head, so each prefix
  // head comes from memory once and from cache for the group's other rows.
  std::vector<int64_t> order(static_cast<size_t>(batch * kv));
  for (int64_t pair = 0; pair < batch * kv; ++pair) order[static_cast<size_t>(pair)] = pair;
  if (!prefixes.empty()) {
    const auto prefix_of = [&](int64_t pair) {
      const at::Tensor& k = prefixes[static_cast<size_t>(pair / kv)].k;
      return k.defined() ? reinterpret_cast<uintptr_t>(k.data_ptr<float>()) : uintptr_t{0};
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      const uintptr_t px = prefix_of(x), py = prefix_of(y);
      return px != py ? px < py : x % kv < y % kv;
    });
  }
  // fn(runs, total keys, first query head): the prefix's run, then one run per block.
  const auto for_each_pair = [&](const auto& fn) {
    at::parallel_for(0, batch * kv, 1, [&](int64_t begin, int64_t end) {
      std::vector<Run> runs;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t pair = order[static_cast<size_t>(i)], b = pair / kv, h = pair % kv;
        const size_t row = static_cast<size_t>(b);
        const int64_t plen = prefix_len[row], len = lengths[row];
        runs.clear();
        if (plen > 0)
          runs.push_back({prefixes[row].k.data_ptr<float>() + h * plen * d, prefixes[row].v.data_ptr<float>() + h * plen * d,
                          plen});
        // (b, kv head) in a block [B, KV, block, D].
        for (int64_t j = 0; j * block < len; ++j)
          runs.push_back({kb[static_cast<size_t>(j)] + pair * block * d, vb[static_cast<size_t>(j)] + pair * block * d,
                          std::min(block, len - j * block)});
        fn(runs, plen + len, pair * group);
      }
    });
  };
  for_each_pair([&](const std::vector<Run>& runs, int64_t total, int64_t head) {
    float* sc = sp + head * longest;
    int64_t at = 0;
    for (const Run& r : runs) {
      ScoreKeys(qp + head * d, r.k, sc + at, group, r.n, longest, d, s);
      at += r.n;
    }
    CenterScores(sc, group, total, longest);
  });
  scores.exp_();
  for_each_pair([&](const std::vector<Run>& runs, int64_t total, int64_t head) {
    const float* w = sp + head * longest;
    float* o = op + head * d;
    std::fill(o, o + group * d, 0.0f);
    int64_t at = 0;
    for (const Run& r : runs) {
      MixValues(w + at, r.v, o, group, r.n, longest, d);
      at += r.n;
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* wg = w + g * longest;
      float total_weight = 0;
      for (int64_t i = 0; i < total; ++i) total_weight += wg[i];
      const float inv = 1.0f / total_weight;
      for (int64_t i = 0; i < d; ++i) o[g * d + i] *= inv;
    }
  });
  return out;
}

}  // namespace echelon::model
