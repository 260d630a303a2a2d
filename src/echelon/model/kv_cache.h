// The decoder's key/value cache for incremental decoding, held in fixed-size blocks that are
// added as the sequences grow: nothing is reallocated or copied when a row gets longer, and a
// cache holds only the blocks its longest row has reached (a 32k-token limit costs nothing
// until a row is that long). Keys and values are stored after the k-norm and rotary embedding.
//
//   KVCache cache = model->NewCache(/*batch=*/4, /*limit=*/32768);
//   model->Forward(ids, positions, key_valid, &cache);   // appends T columns, adding blocks
//
// Rows share one filled length (`length`, rows left-padded to line up) unless `row_lengths`
// holds one length per row: then each row's keys fill [0, row_lengths[b]) and a Forward
// appends each row's T new keys at its own length (sequences of different lengths decoding
// side by side, as continuous batching needs).
//
// With row lengths, a row may also read a shared prefix ahead of its own keys (a group's
// prompt, held once for all its rows): `row_prefix[b]` points at a KVPrefix that must outlive
// the Forward. Only the fused decoding attention reads prefixes (one new token per row, fp32 on
// the CPU: DecodeAttentionSupports); a Forward that cannot take it fails. The caller gives the
// positions (prefix length + own length).
//
// Thread contract: used by one thread at a time, as the model that writes it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace echelon::model {

// Columns per block: small against a long sequence (a row wastes under one block), large
// enough that decoding reads runs of keys and a prefill writes few blocks per tile.
inline constexpr int64_t kKvBlock = 256;

// One sequence's keys and values for every layer, contiguous: k[layer], v[layer] are
// [kv_heads, length, head_dim] (a group's shared prompt).
struct KVPrefix {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;
};

class KVCache {
 public:
  KVCache() = default;
  // An empty cache of `layers` layers for `batch` rows of [kv_heads, columns, head_dim] tensors
  // of `options`, holding at most `limit` columns, in blocks of `block` columns (of `limit`
  // when that is fewer).
  KVCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t limit,
          at::TensorOptions options, int64_t block = kKvBlock);

  int64_t length = 0;                    // positions filled so far, every row (when row_lengths is empty)
  std::vector<int64_t> row_lengths;      // one per row, or empty
  std::vector<const KVPrefix*> row_prefix;  // empty, or one per row (nullptr: none)

  size_t layers() const { return k_.size(); }
  int64_t batch() const { return batch_; }
  int64_t block() const { return block_; }
  int64_t limit() const { return limit_; }
  // Columns held in blocks now.
  int64_t capacity() const { return k_.empty() ? 0 : static_cast<int64_t>(k_[0].size()) * block_; }
  // Adds blocks until `columns` fit; fails (c10::Error) past the limit, or on a view of rows
  // that lacks them (a view cannot grow: reserve on the cache it views).
  void Reserve(int64_t columns);
  // Rows [first, first + count) sharing this cache's blocks, with the same limit; cannot grow.
  KVCache Rows(int64_t first, int64_t count) const;

  // Layer `layer`'s blocks, each [batch, kv_heads, block, head_dim].
  const std::vector<at::Tensor>& k(size_t layer) const { return k_[layer]; }
  const std::vector<at::Tensor>& v(size_t layer) const { return v_[layer]; }

  // Where a Forward's T new columns go when each row writes at its own start: per token and
  // block, the rows that write there and their offsets in it. Made once per Forward (PlanWrite)
  // and used by every layer's Write.
  struct WritePlan {
    struct Part {
      int64_t token = 0, block = 0;
      at::Tensor rows;     // [n] int64 on the cache's device
      at::Tensor offsets;  // [n] int64 on the cache's device
      bool every = false;  // rows are every row, in order (the new columns need no gather)
      at::Tensor scatter;  // every row: the offsets as a scatter index [batch, kv_heads, 1, head_dim]
    };
    std::vector<Part> parts;
  };
  WritePlan PlanWrite(const std::vector<int64_t>& starts, int64_t t) const;

  // Writes new keys and values [batch, kv_heads, T, head_dim] at columns [start, start + T) of
  // every row, or each row at its own start (a plan). The blocks must be there (Reserve).
  void Write(size_t layer, const at::Tensor& k, const at::Tensor& v, int64_t start);
  void Write(size_t layer, const at::Tensor& k, const at::Tensor& v, const WritePlan& plan);
  // Row `row`'s keys (or values) of columns [from, from + n): [kv_heads, n, head_dim], contiguous.
  at::Tensor Read(size_t layer, bool keys, int64_t row, int64_t from, int64_t n) const;
  // Stores [kv_heads, n, head_dim] keys and values at columns [at, at + n) of row `row`.
  void WriteRow(size_t layer, int64_t row, int64_t at, const at::Tensor& k, const at::Tensor& v);
  // Copies columns [0, n) of row `from` over row `to`, every layer.
  void CopyRow(int64_t from, int64_t to, int64_t n);

 private:
  void WriteColumns(std::vector<at::Tensor>& blocks, int64_t row, int64_t at, const at::Tensor& src);

  int64_t batch_ = 0, kv_heads_ = 0, head_dim_ = 0, limit_ = 0, block_ = kKvBlock;
  at::TensorOptions options_;
  bool view_ = false;
  std::vector<std::vector<at::Tensor>> k_, v_;  // [layer][block]
};

}  // namespace echelon::model
