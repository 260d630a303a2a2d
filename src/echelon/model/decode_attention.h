// Attention of one new token per row over that row's own cached keys (a block KV cache), for decoding with a
// length per row (continuous batching), fused on the CPU in fp32:
//
//   out[b, h] = softmax(q[b, h] . K[b, h / G, 0:len_b] * scale) . V[b, h / G, 0:len_b]
//
// with G = heads / kv_heads (grouped-query attention). The generic path multiplies every row
// against the longest row's keys and masks the rest; here each row reads only its own keys, and
// the scores, softmax and weighted sum run in one pass per (row, kv head) without
// intermediate tensors. Numerically the same as the generic path up to float summation order.
// A row may read a shared prefix first: the G rows of a group keep their prompt's keys once,
// and a decoding step reads them from cache for every row after the first.
//
// Thread contract: a pure function; it splits the (row, kv head) pairs over ATen's intra-op
// threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace echelon::model {

// Keys and values a row reads ahead of its own (a prompt shared by a group's rows, held once):
// [kv_heads, length, D] float, contiguous; undefined: none.
struct DecodePrefix {
  at::Tensor k, v;
};

// q: [B, heads, D] float, contiguous; k_blocks, v_blocks: the cache's blocks (KVCache), each
// [B, kv_heads, block, D] float, contiguous, block j holding columns [j * block, (j + 1) * block);
// lengths: each row's own keys to read (1 <= lengths[b] <= the blocks' columns); prefixes: empty
// or one per row, read before the row's own keys. Returns [B, heads, D].
at::Tensor DecodeAttention(const at::Tensor& q, const std::vector<at::Tensor>& k_blocks,
                           const std::vector<at::Tensor>& v_blocks, const std::vector<int64_t>& lengths, double scale,
                           const std::vector<DecodePrefix>& prefixes = {});

// Whether DecodeAttention serves tensors of this device and dtype.
bool DecodeAttentionSupports(const at::Tensor& like);

}  // namespace echelon::model
