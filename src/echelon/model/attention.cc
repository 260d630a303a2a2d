// The tiled forward and backward of attention.h. Shapes inside: a query tile of the G query
// heads of each kv head is stacked as [B, KV, G * nq, D] (query head h = kv * G + g, as the
// [B, H, T, D] layout orders them), so one matmul per tile serves the whole group.
#include "echelon/model/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>

namespace echelon::model {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::atomic<bool> untiled_reference{false};

// A run of keys: [B, KV, n, D] views, columns [first, first + n).
struct KeyTile {
  at::Tensor k, v;
  int64_t first = 0;
  int64_t size() const { return k.size(2); }
};

// The tiles of whole K/V tensors, `width` columns each (the last one shorter).
std::vector<KeyTile> TilesOf(const at::Tensor& k, const at::Tensor& v, int64_t width) {
  std::vector<KeyTile> tiles;
  for (int64_t j = 0; j < k.size(2); j += width) {
    const int64_t n = std::min(width, k.size(2) - j);
    tiles.push_back({k.narrow(2, j, n), v.narrow(2, j, n), j});
  }
  return tiles;
}

// A tile size for `rows` x heads query rows: the largest power of two (64 .. 4096) whose square
// tile of scores stays within kTileElements.
int64_t AutoTile(int64_t batch_heads) {
  int64_t n = 64;
  while (n < 4096 && (2 * n) * (2 * n) * batch_heads <= kTileElements) n *= 2;
  return n;
}

// The layout's masks, tile by tile, and what each query tile can reach (decided on the host,
// so whole key tiles are skipped without looking at them).
class Tiler {
 public:
  Tiler(const AttentionLayout& layout, int64_t batch, int64_t t, int64_t s, at::Device device)
      : batch_(batch), s_(s) {
    const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(device);
    TORCH_CHECK(layout.row_start.empty() || static_cast<int64_t>(layout.row_start.size()) == batch,
                "attention: ", layout.row_start.size(), " row starts for ", batch, " rows");
    if (layout.row_start.empty()) {
      max_start_ = layout.start;
      query_col_ = (at::arange(t, longs) + layout.start).unsqueeze(0);  // [1, T]
    } else {
      max_start_ = *std::max_element(layout.row_start.begin(), layout.row_start.end());
      query_col_ = at::tensor(layout.row_start, at::kLong).to(device).unsqueeze(1) + at::arange(t, longs).unsqueeze(0);
    }
    if (layout.key_valid.defined()) {
      TORCH_CHECK(layout.key_valid.dim() == 2 && layout.key_valid.size(0) == batch && layout.key_valid.size(1) >= s,
                  "attention: key_valid must be [", batch, ", >= ", s, "], got ", layout.key_valid.sizes());
      valid_ = layout.key_valid.narrow(1, 0, s).to(device, at::kBool);
    }
    if (layout.segments.defined()) {
      TORCH_CHECK(layout.segments.dim() == 2 && layout.segments.size(0) == batch && layout.segments.size(1) == t &&
                      s == t && layout.row_start.empty() && layout.start == 0,
                  "attention: segments must be [B, T] for self-attention over the same T columns, got ",
                  layout.segments.sizes(), " with ", s, " keys");
      segments_ = layout.segments.to(device, at::kLong);
      // Per query: the first column of its segment in its row (the first column of that id, so
      // the skip stays safe whatever the ids' order).
      const at::Tensor host = layout.segments.to(at::kCPU, at::kLong).contiguous();
      const int64_t* seg = host.data_ptr<int64_t>();
      segment_first_.assign(static_cast<size_t>(batch * t), 0);
      for (int64_t b = 0; b < batch; ++b) {
        std::map<int64_t, int64_t> first;
        for (int64_t i = 0; i < t; ++i)
          segment_first_[static_cast<size_t>(b * t + i)] = first.emplace(seg[b * t + i], i).first->second;
      }
      t_ = t;
    }
  }

  // Allowed (query, key) pairs of queries [i0, i0 + nq) and keys [j0, j0 + nk):
  // [B or 1, 1, 1, nq, nk] bool, broadcast over kv heads and the group.
  at::Tensor Allowed(int64_t i0, int64_t nq, int64_t j0, int64_t nk) const {
    const at::Tensor keys = at::arange(j0, j0 + nk, query_col_.options()).view({1, 1, nk});
    at::Tensor allowed = keys <= query_col_.narrow(1, i0, nq).unsqueeze(2);  // [B or 1, nq, nk]
    if (valid_.defined()) allowed = allowed & valid_.narrow(1, j0, nk).unsqueeze(1);
    if (segments_.defined())
      allowed = allowed & (segments_.narrow(1, i0, nq).unsqueeze(2) == segments_.narrow(1, j0, nk).unsqueeze(1));
    return allowed.view({allowed.size(0), 1, 1, nq, nk});
  }
  // Whether any query of [i0, i0 + nq) may see a key of [j0, j0 + nk).
  bool Reaches(int64_t i0, int64_t nq, int64_t j0, int64_t nk) const {
    if (j0 > max_start_ + i0 + nq - 1 || j0 >= s_) return false;  // past every query (causal)
    if (segment_first_.empty()) return true;
    int64_t first = std::numeric_limits<int64_t>::max();
    for (int64_t b = 0; b < batch_; ++b)
      first = std::min(first, *std::min_element(segment_first_.begin() + b * t_ + i0,
                                                segment_first_.begin() + b * t_ + i0 + nq));
    return j0 + nk > first;
  }

 private:
  int64_t batch_, s_, t_ = 0, max_start_ = 0;
  at::Tensor query_col_;  // [B or 1, T] int64: each query's column
  at::Tensor valid_;      // [B, S] bool, or undefined
  at::Tensor segments_;   // [B, T] int64, or undefined
  std::vector<int64_t> segment_first_;
};

// Scores of a query tile against a key tile, masked: [B, KV, G * nq, nk] fp32.
at::Tensor TileScores(const at::Tensor& qt, const KeyTile& kt, const Tiler& tiler, int64_t i0, int64_t nq,
                      int64_t group, double scale) {
  at::Tensor s = at::matmul(qt, kt.k.to(at::kFloat).transpose(-1, -2)).mul_(scale);
  const int64_t b = s.size(0), kv = s.size(1), nk = kt.size();
  s = s.view({b, kv, group, nq, nk}).masked_fill_(tiler.Allowed(i0, nq, kt.first, nk).logical_not(), -kInf);
  return s.view({b, kv, group * nq, nk});
}

// Query tile i0 of q [B, H, T, D] as [B, KV, G * nq, D] fp32.
at::Tensor QueryTile(const at::Tensor& q, int64_t kv, int64_t i0, int64_t nq) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(3);
  return q.view({b, kv, h / kv, q.size(2), d}).narrow(3, i0, nq).reshape({b, kv, h / kv * nq, d}).to(at::kFloat);
}

struct ForwardResult {
  at::Tensor out;  // [B, H, T, D] in q's dtype
  at::Tensor lse;  // [B, KV, G, T] fp32; +inf for a query that sees no key
};

ForwardResult TiledForward(const at::Tensor& q, const std::vector<KeyTile>& keys, int64_t kv, const Tiler& tiler,
                           double scale, int64_t query_tile) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), group = h / kv;
  at::Tensor out = at::empty({b, kv, group, t, d}, q.options());
  at::Tensor lse = at::empty({b, kv, group, t}, q.options().dtype(at::kFloat));
  for (int64_t i0 = 0; i0 < t; i0 += query_tile) {
    const int64_t nq = std::min(query_tile, t - i0);
    const at::Tensor qt = QueryTile(q, kv, i0, nq);
    at::Tensor m = at::full({b, kv, group * nq}, -kInf, qt.options());
    at::Tensor l = at::zeros({b, kv, group * nq}, qt.options());
    at::Tensor acc = at::zeros({b, kv, group * nq, d}, qt.options());
    for (const KeyTile& kt : keys) {
      if (!tiler.Reaches(i0, nq, kt.first, kt.size())) continue;
      const at::Tensor s = TileScores(qt, kt, tiler, i0, nq, group, scale);
      const at::Tensor m_new = at::maximum(m, std::get<0>(s.max(-1)));
      const at::Tensor m_safe = m_new.masked_fill(m_new == -kInf, 0.0);  // rows with nothing seen yet
      const at::Tensor p = (s - m_safe.unsqueeze(-1)).exp_();
      const at::Tensor correction = (m - m_safe).exp_();
      l = l * correction + p.sum(-1);
      acc = acc * correction.unsqueeze(-1) + at::matmul(p, kt.v.to(at::kFloat));
      m = m_new;
    }
    const at::Tensor empty = l == 0;
    const at::Tensor m_safe = m.masked_fill(empty, 0.0);
    const at::Tensor l_safe = l.masked_fill(empty, 1.0);
    out.narrow(3, i0, nq).copy_((acc / l_safe.unsqueeze(-1)).view({b, kv, group, nq, d}));
    lse.narrow(3, i0, nq).copy_((m_safe + l_safe.log()).masked_fill(empty, kInf).view({b, kv, group, nq}));
  }
  return {out.view({b, h, t, d}), lse};
}

struct Gradients {
  at::Tensor dq, dk, dv;
};

// FlashAttention-2's backward: per query tile, per key tile it reaches, P = exp(S - lse),
// dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ += dS K scale, dK += dS^T Q scale.
Gradients TiledBackward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                        const at::Tensor& lse, const at::Tensor& dout, const Tiler& tiler, double scale,
                        AttentionTiles tiles) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), kv = k.size(1), group = h / kv;
  const at::TensorOptions floats = q.options().dtype(at::kFloat);
  const at::Tensor rowdot = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1).view({b, kv, group, t});
  at::Tensor dq = at::empty({b, kv, group, t, d}, floats);
  at::Tensor dk = at::zeros(k.sizes(), floats), dv = at::zeros(v.sizes(), floats);
  const std::vector<KeyTile> keys = TilesOf(k, v, tiles.key);
  for (int64_t i0 = 0; i0 < t; i0 += tiles.query) {
    const int64_t nq = std::min(tiles.query, t - i0);
    const at::Tensor qt = QueryTile(q, kv, i0, nq);
    const at::Tensor dot = QueryTile(dout, kv, i0, nq);
    const at::Tensor lse_t = lse.narrow(3, i0, nq).reshape({b, kv, group * nq, 1});
    const at::Tensor rowdot_t = rowdot.narrow(3, i0, nq).reshape({b, kv, group * nq, 1});
    at::Tensor dq_t = at::zeros_like(qt);
    for (const KeyTile& kt : keys) {
      if (!tiler.Reaches(i0, nq, kt.first, kt.size())) continue;
      const at::Tensor p = (TileScores(qt, kt, tiler, i0, nq, group, scale) - lse_t).exp_();
      const at::Tensor kf = kt.k.to(at::kFloat), vf = kt.v.to(at::kFloat);
      dv.narrow(2, kt.first, kt.size()).add_(at::matmul(p.transpose(-1, -2), dot));
      const at::Tensor ds = p * (at::matmul(dot, vf.transpose(-1, -2)) - rowdot_t);
      dq_t.add_(at::matmul(ds, kf), scale);
      dk.narrow(2, kt.first, kt.size()).add_(at::matmul(ds.transpose(-1, -2), qt), scale);
    }
    dq.narrow(3, i0, nq).copy_(dq_t.view({b, kv, group, nq, d}));
  }
  return {dq.view({b, h, t, d}).to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

void CheckShapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), "attention: q [B, H, T, D] and k, v [B, KV, "
              "S, D] expected, got ", q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "attention: shapes do not match: q ", q.sizes(), ", k ", k.sizes());
}

// Unset tile sizes from the shapes: square tiles of about kTileElements scores across the batch
// and heads, the query tile no longer than the queries, and the key tile widened to the budget
// when there are few queries (decoding: one query, so a tile reads many cache blocks at once).
AttentionTiles Resolve(AttentionTiles tiles, const at::Tensor& q) {
  const int64_t batch_heads = q.size(0) * q.size(1);
  if (tiles.query <= 0) tiles.query = std::min(AutoTile(batch_heads), std::max<int64_t>(1, q.size(2)));
  if (tiles.key <= 0)
    tiles.key = std::clamp<int64_t>(kTileElements / (batch_heads * tiles.query), 64, int64_t{1} << 16);
  return tiles;
}

// The layout's plain values (what a backward pass needs to build its Tiler again).
void SaveLayout(torch::autograd::AutogradContext* ctx, const AttentionLayout& layout) {
  ctx->saved_data["start"] = layout.start;
  ctx->saved_data["row_start"] = layout.row_start;
  ctx->saved_data["has_valid"] = layout.key_valid.defined();
  ctx->saved_data["has_segments"] = layout.segments.defined();
  if (layout.key_valid.defined()) ctx->saved_data["key_valid"] = layout.key_valid;
  if (layout.segments.defined()) ctx->saved_data["segments"] = layout.segments;
}

AttentionLayout LoadLayout(torch::autograd::AutogradContext* ctx) {
  AttentionLayout layout;
  layout.start = ctx->saved_data["start"].toInt();
  layout.row_start = ctx->saved_data["row_start"].toIntVector();
  if (ctx->saved_data["has_valid"].toBool()) layout.key_valid = ctx->saved_data["key_valid"].toTensor();
  if (ctx->saved_data["has_segments"].toBool()) layout.segments = ctx->saved_data["segments"].toTensor();
  return layout;
}

struct TiledAttention : public torch::autograd::Function<TiledAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const AttentionLayout& layout, double scale, AttentionTiles tiles) {
    const Tiler tiler(layout, q.size(0), q.size(2), k.size(2), q.device());
    ForwardResult r = TiledForward(q, TilesOf(k, v, tiles.key), k.size(1), tiler, scale, tiles.query);
    ctx->save_for_backward({q, k, v, r.out, r.lse});
    SaveLayout(ctx, layout);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["query_tile"] = tiles.query;
    ctx->saved_data["key_tile"] = tiles.key;
    return r.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const AttentionLayout layout = LoadLayout(ctx);
    const Tiler tiler(layout, q.size(0), q.size(2), k.size(2), q.device());
    const AttentionTiles tiles{ctx->saved_data["query_tile"].toInt(), ctx->saved_data["key_tile"].toInt()};
    Gradients g = TiledBackward(q, k, v, saved[3], saved[4], grads[0], tiler, ctx->saved_data["scale"].toDouble(),
                                tiles);
    return {g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Plain causal self-attention: what fused kernels take as is_causal.
bool PlainCausal(const AttentionLayout& layout, int64_t t, int64_t s) {
  return t == s && layout.start == 0 && layout.row_start.empty() && !layout.key_valid.defined() &&
         !layout.segments.defined();
}

}  // namespace

void SetUntiledReference(bool on) { untiled_reference = on; }
bool UntiledReference() { return untiled_reference.load(); }

at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionLayout& layout,
                  double scale, AttentionTiles tiles) {
  CheckShapes(q, k, v);
  if (UntiledReference()) return PlainAttention(q, k, v, layout, scale);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  // The fused kernels (flash / memory-efficient) on a GPU, grouped-query attention included.
  if (q.is_cuda() && PlainCausal(layout, q.size(2), k.size(2)))
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, scale,
                                            /*enable_gqa=*/true);
#else
  (void)PlainCausal;
#endif
  tiles = Resolve(tiles, q);
  return TiledAttention::apply(q, k, v, layout, scale, tiles);
}

at::Tensor AttendBlocks(const at::Tensor& q, const std::vector<at::Tensor>& k_blocks,
                        const std::vector<at::Tensor>& v_blocks, int64_t length, const AttentionLayout& layout,
                        double scale, AttentionTiles tiles) {
  TORCH_CHECK(!k_blocks.empty() && k_blocks.size() == v_blocks.size(), "attention: ", k_blocks.size(), " key and ",
              v_blocks.size(), " value blocks");
  CheckShapes(q, k_blocks[0], v_blocks[0]);
  const int64_t block = k_blocks[0].size(2);
  TORCH_CHECK(length >= 1 && length <= block * static_cast<int64_t>(k_blocks.size()), "attention: ", length,
              " columns over ", k_blocks.size(), " blocks of ", block);
  if (UntiledReference()) {
    at::NoGradGuard no_grad;
    return PlainAttention(q, at::cat(k_blocks, 2).narrow(2, 0, length), at::cat(v_blocks, 2).narrow(2, 0, length),
                          layout, scale);
  }
  tiles = Resolve(tiles, q);
  // Blocks joined into key tiles of about tiles.key columns (fewer, larger matmuls when the
  // blocks are small against the tile).
  const int64_t per_tile = std::max<int64_t>(1, tiles.key / block);
  std::vector<KeyTile> keys;
  for (int64_t j = 0; j * block < length; j += per_tile) {
    std::vector<at::Tensor> ks, vs;
    for (int64_t i = j; i < j + per_tile && i * block < length; ++i) {
      const int64_t n = std::min(block, length - i * block);
      ks.push_back(k_blocks[static_cast<size_t>(i)].narrow(2, 0, n));
      vs.push_back(v_blocks[static_cast<size_t>(i)].narrow(2, 0, n));
    }
    keys.push_back({ks.size() == 1 ? ks[0] : at::cat(ks, 2), vs.size() == 1 ? vs[0] : at::cat(vs, 2), j * block});
  }
  at::NoGradGuard no_grad;
  const Tiler tiler(layout, q.size(0), q.size(2), length, q.device());
  return TiledForward(q, keys, k_blocks[0].size(1), tiler, scale, tiles.query).out;
}

at::Tensor PlainAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionLayout& layout, double scale) {
  CheckShapes(q, k, v);
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), kv = k.size(1), s = k.size(2);
  const Tiler tiler(layout, b, t, s, q.device());
  const at::Tensor allowed = tiler.Allowed(0, t, 0, s);  // [B or 1, 1, 1, T, S]
  const at::Tensor blind = allowed.any(-1, /*keepdim=*/true).logical_not();  // queries that see no key
  at::Tensor scores = at::matmul(q.reshape({b, kv, h / kv * t, d}), k.transpose(-1, -2)).to(at::kFloat) * scale;
  // A blind query's row stays finite (it takes every key), then gets zero weights.
  scores = scores.view({b, kv, h / kv, t, s}).masked_fill((allowed | blind).logical_not(), -kInf);
  const at::Tensor probs = at::softmax(scores, -1).masked_fill(blind, 0.0);
  return at::matmul(probs.to(q.scalar_type()).view({b, kv, h / kv * t, s}), v).view({b, h, t, d});
}

}  // namespace echelon::model
