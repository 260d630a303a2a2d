#include "echelon/model/decode_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace echelon::model {
namespace {

// The inner loops, built twice: for x86-64-v3 (AVX2 + FMA) and for the baseline, chosen at load
// time by the CPU (GCC's function multi-versioning); other compilers and targets get one build.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ECHELON_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ECHELON_CPU_CLONES
#endif

// The kernels read each key and value once for all G query heads of the kv head: decoding
// attention is bound by reading the cache from memory.

// One (row, kv head), first pass: the scaled dot products of its G query heads with its first
// `len` keys, minus each head's largest, into `scores` (G rows of `stride`); -inf past `len`.
ECHELON_CPU_CLONES
void ScoreHeadGroup(const float* q, const float* k, float* scores, int64_t group, int64_t len, int64_t stride,
                    int64_t d, float scale) {
  for (int64_t s = 0; s < len; ++s) {
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
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * stride;
    const float top = *std::max_element(sg, sg + len);
    for (int64_t s = 0; s < len; ++s) sg[s] -= top;
    std::fill(sg + len, sg + stride, -INFINITY);
  }
}

// Second pass, after exp: the values weighted by each head's weights, normalised; `mix` is
// G x d floats of scratch.
ECHELON_CPU_CLONES
void MixValues(const float* weights, const float* v, float* out, int64_t group, int64_t len, int64_t stride,
               int64_t d, float* mix) {
  std::fill(mix, mix + group * d, 0.0f);
  for (int64_t s = 0; s < len; ++s) {
    const float* vs = v + s * d;
    for (int64_t g = 0; g < group; ++g) {
      const float w = weights[g * stride + s];
      float* mg = mix + g * d;
      for (int64_t i = 0; i < d; ++i) mg[i] += w * vs[i];
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float* wg = weights + g * stride;
    float total = 0;
    for (int64_t s = 0; s < len; ++s) total += wg[s];
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < d; ++i) out[g * d + i] = mix[g * d + i] * inv;
  }
}

}  // namespace

bool DecodeAttentionSupports(const at::Tensor& like) {
  return like.device().is_cpu() && like.scalar_type() == at::kFloat;
}

at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes(), "DecodeAttention: q [B, H, D] and k, v "
              "[B, KV, C, D] expected, got ", q.sizes(), " and ", k.sizes());
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(2), kv = k.size(1), capacity = k.size(2);
  TORCH_CHECK(k.size(0) == batch && k.size(3) == d && heads % kv == 0, "DecodeAttention: shapes do not match: q ",
              q.sizes(), ", k ", k.sizes());
  TORCH_CHECK(static_cast<int64_t>(lengths.size()) == batch, "DecodeAttention: ", lengths.size(), " lengths for ",
              batch, " rows");
  for (int64_t len : lengths)
    TORCH_CHECK(len >= 1 && len <= capacity, "DecodeAttention: row length ", len, " outside [1, ", capacity, "]");
  TORCH_CHECK(DecodeAttentionSupports(q) && DecodeAttentionSupports(k) && DecodeAttentionSupports(v),
              "DecodeAttention: fp32 CPU tensors only");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "DecodeAttention: contiguous tensors only");
  const int64_t group = heads / kv;
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  at::Tensor out = at::empty({batch, heads, d}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  // Pass 1 per (row, kv head); exp over all scores at once (vectorised by ATen); pass 2.
  at::Tensor scores = at::empty({batch, heads, longest}, q.options());
  float* sp = scores.data_ptr<float>();
  const auto for_each_pair = [&](const auto& fn) {
    at::parallel_for(0, batch * kv, 1, [&](int64_t begin, int64_t end) {
      for (int64_t pair = begin; pair < end; ++pair) {
        // (b, kv head): its keys in [B, KV, C, D], its first query head in [B, H, D].
        fn(pair * capacity * d, pair * group, lengths[static_cast<size_t>(pair / kv)]);
      }
    });
  };
  for_each_pair([&](int64_t cache_offset, int64_t head, int64_t len) {
    ScoreHeadGroup(qp + head * d, kp + cache_offset, sp + head * longest, group, len, longest, d, s);
  });
  scores.exp_();
  for_each_pair([&](int64_t cache_offset, int64_t head, int64_t len) {
    thread_local std::vector<float> mix;
    mix.resize(static_cast<size_t>(group * d));
    MixValues(sp + head * longest, vp + cache_offset, op + head * d, group, len, longest, d, mix.data());
  });
  return out;
}

}  // namespace echelon::model
