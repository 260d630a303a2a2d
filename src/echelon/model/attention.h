// Exact attention in tiles (the FlashAttention-2 algorithm on ATen operations), for every
// attention the decoder computes: training forwards and their backward pass, prefills, decoding
// over a block KV cache, and the learner's reference copies.
//
//   AttentionLayout layout;                       // causal, queries at columns 0..T-1
//   at::Tensor out = Attend(q, k, v, layout, 1.0 / std::sqrt(double(d)));   // [B, H, T, D]
//
// Queries go in tiles; within a query tile the keys go in tiles too, folded into the output by
// an online softmax (a running maximum and sum per query), so the largest intermediate is one
// tile of scores, never T x S. The forward keeps only the output and each query's log-sum-exp;
// the backward pass recomputes the tiles' scores from them (FlashAttention-2's backward), so
// training memory is linear in the length as well. Grouped-query attention reads each kv head
// once for its G query heads (no repeated K/V); packed rows are block-diagonal: a query tile
// reads only the key tiles its segments reach. Scores, the softmax and the sums run in fp32
// whatever the inputs' dtype (bf16 in, fp32 accumulation); the output comes in q's dtype.
//
// Where the LibTorch has fused scaled-dot-product kernels (a CUDA build of LibTorch >= 2.5) and
// the layout is plain causal self-attention, Attend uses them; the tiled path is the fallback
// and the reference they are checked against (PlainAttention is the untiled definition, for
// tests).
//
// Thread contract: pure functions of their arguments.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace echelon::model {

// Which keys each query sees. Keys are columns [0, S); query i of row b sits at column
// row_start[b] + i (`start` + i when row_start is empty) and sees the keys at columns up to its
// own (causal) that are valid and, in packed rows, of its own segment. A query that sees no key
// at all (a padding slot) gets a zero output.
struct AttentionLayout {
  int64_t start = 0;
  std::vector<int64_t> row_start;  // one per row (rows at their own lengths), or empty
  at::Tensor key_valid;            // [B, >= S] bool, false for padding columns; undefined: all valid
  at::Tensor segments;             // [B, T] int64, packed rows (then S == T, start 0); -1: padding
};

// Tile sizes (0: chosen from the shapes, so one tile of fp32 scores stays near kTileElements).
struct AttentionTiles {
  int64_t query = 0;
  int64_t key = 0;
};

// Elements of one tile of scores across the batch and heads that the automatic tile sizes aim
// for: 8M fp32 = 32 MiB, a few of which (scores, probabilities, their gradients) live at once.
// Large enough that a small model's tile overheads stay small, small enough that a 30B model's
// tile stays far below a layer's weights.
inline constexpr int64_t kTileElements = int64_t{8} << 20;

// q [B, H, T, D]; k, v [B, KV, S, D] with H a multiple of KV (query head h reads kv head
// h / (H / KV)). Returns [B, H, T, D] in q's dtype; differentiable in q, k and v.
at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionLayout& layout,
                  double scale, AttentionTiles tiles = {});

// The same over keys held in blocks (KVCache): k_blocks[j], v_blocks[j] are [B, KV, block, D]
// and hold columns [j * block, (j + 1) * block); `length` columns are read. Without gradients.
at::Tensor AttendBlocks(const at::Tensor& q, const std::vector<at::Tensor>& k_blocks,
                        const std::vector<at::Tensor>& v_blocks, int64_t length, const AttentionLayout& layout,
                        double scale, AttentionTiles tiles = {});

// Process-wide: the untiled definitions instead of the tiled paths (Attend and AttendBlocks
// compute PlainAttention's T x S scores, TokenLogProbs whole logits), for benchmarks that
// measure what tiling saves (bench/long_sequence.sh). Off by default; not for runs.
void SetUntiledReference(bool on);
bool UntiledReference();

// The definition, untiled: T x S scores, masked, softmax in fp32 (a query that sees no key gets
// zeros). For tests of the tiled path.
at::Tensor PlainAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionLayout& layout, double scale);

}  // namespace echelon::model
