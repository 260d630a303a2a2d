#include "echelon/model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

namespace echelon::model {

KVCache::KVCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t limit,
                 at::TensorOptions options, int64_t block)
    // A cache never holds more than its limit: a short one is one block of exactly that.
    : batch_(batch), kv_heads_(kv_heads), head_dim_(head_dim), limit_(limit),
      block_(std::max<int64_t>(1, std::min(block, limit))), options_(options),
      k_(static_cast<size_t>(layers)), v_(static_cast<size_t>(layers)) {
  TORCH_CHECK(layers >= 0 && batch >= 0 && limit >= 0 && block > 0, "KVCache: bad shape (layers ", layers, ", batch ",
              batch, ", limit ", limit, ", block ", block, ")");
}

void KVCache::Reserve(int64_t columns) {
  TORCH_CHECK(columns <= limit_, "KV cache capacity ", limit_, " exceeded by ", columns);
  if (columns <= capacity()) return;
  TORCH_CHECK(!view_, "KVCache: a view of rows cannot grow (", columns, " columns, ", capacity(),
              " held): reserve on the cache it views");
  while (capacity() < columns) {
    for (size_t i = 0; i < k_.size(); ++i) {
      // Zeros, not garbage: masked columns of a tile still meet the probabilities (0 x NaN).
      k_[i].push_back(at::zeros({batch_, kv_heads_, block_, head_dim_}, options_));
      v_[i].push_back(at::zeros({batch_, kv_heads_, block_, head_dim_}, options_));
    }
    if (k_.empty()) break;
  }
}

KVCache KVCache::Rows(int64_t first, int64_t count) const {
  TORCH_CHECK(first >= 0 && count >= 0 && first + count <= batch_, "KVCache: rows [", first, ", ", first + count,
              ") of ", batch_);
  KVCache view = *this;
  view.batch_ = count;
  view.view_ = true;
  view.row_lengths.clear();
  view.row_prefix.clear();
  for (size_t i = 0; i < k_.size(); ++i)
    for (size_t j = 0; j < k_[i].size(); ++j) {
      view.k_[i][j] = k_[i][j].narrow(0, first, count);
      view.v_[i][j] = v_[i][j].narrow(0, first, count);
    }
  return view;
}

void KVCache::Write(size_t layer, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  const int64_t t = k.size(2);
  TORCH_CHECK(start >= 0 && start + t <= capacity(), "KVCache: columns [", start, ", ", start + t, ") past the ",
              capacity(), " held");
  for (int64_t col = start; col < start + t;) {
    const int64_t j = col / block_, offset = col % block_, n = std::min(block_ - offset, start + t - col);
    k_[layer][static_cast<size_t>(j)].narrow(2, offset, n).copy_(k.narrow(2, col - start, n));
    v_[layer][static_cast<size_t>(j)].narrow(2, offset, n).copy_(v.narrow(2, col - start, n));
    col += n;
  }
}

KVCache::WritePlan KVCache::PlanWrite(const std::vector<int64_t>& starts, int64_t t) const {
  TORCH_CHECK(static_cast<int64_t>(starts.size()) == batch_, "KVCache: ", starts.size(), " starts for ", batch_,
              " rows");
  for (int64_t s : starts)
    TORCH_CHECK(s >= 0 && s + t <= capacity(), "KVCache: columns [", s, ", ", s + t, ") past the ", capacity(),
                " held");
  WritePlan plan;
  const at::Tensor all = at::arange(batch_, at::TensorOptions().dtype(at::kLong).device(options_.device()));
  for (int64_t i = 0; i < t; ++i) {
    // The rows whose column i falls in each block: one indexed store per block and token.
    std::map<int64_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> by_block;  // block -> (rows, offsets)
    for (size_t r = 0; r < starts.size(); ++r) {
      auto& [rows, offsets] = by_block[(starts[r] + i) / block_];
      rows.push_back(static_cast<int64_t>(r));
      offsets.push_back((starts[r] + i) % block_);
    }
    for (const auto& [j, entry] : by_block) {
      WritePlan::Part part;
      part.token = i;
      part.block = j;
      part.every = static_cast<int64_t>(entry.first.size()) == batch_;
      part.rows = part.every ? all : at::tensor(entry.first, at::kLong).to(options_.device());
      part.offsets = at::tensor(entry.second, at::kLong).to(options_.device());
      if (part.every) part.scatter = part.offsets.view({batch_, 1, 1, 1}).expand({batch_, kv_heads_, 1, head_dim_});
      plan.parts.push_back(std::move(part));
    }
  }
  return plan;
}

void KVCache::Write(size_t layer, const at::Tensor& k, const at::Tensor& v, const WritePlan& plan) {
  for (const WritePlan::Part& p : plan.parts) {
    if (p.every) {  // one scatter along the columns (cheaper than an indexed store)
      k_[layer][static_cast<size_t>(p.block)].scatter_(2, p.scatter, k.narrow(2, p.token, 1));
      v_[layer][static_cast<size_t>(p.block)].scatter_(2, p.scatter, v.narrow(2, p.token, 1));
      continue;
    }
    const c10::List<c10::optional<at::Tensor>> index({p.rows, c10::optional<at::Tensor>(), p.offsets});
    const at::Tensor kc = k.select(2, p.token), vc = v.select(2, p.token);  // [B, KV, D]
    k_[layer][static_cast<size_t>(p.block)].index_put_(index, kc.index_select(0, p.rows));
    v_[layer][static_cast<size_t>(p.block)].index_put_(index, vc.index_select(0, p.rows));
  }
}

at::Tensor KVCache::Read(size_t layer, bool keys, int64_t row, int64_t from, int64_t n) const {
  TORCH_CHECK(from >= 0 && from + n <= capacity(), "KVCache: reading columns [", from, ", ", from + n, ") of ",
              capacity());
  const std::vector<at::Tensor>& blocks = keys ? k_[layer] : v_[layer];
  std::vector<at::Tensor> parts;
  for (int64_t col = from; col < from + n;) {
    const int64_t j = col / block_, offset = col % block_, m = std::min(block_ - offset, from + n - col);
    parts.push_back(blocks[static_cast<size_t>(j)][row].narrow(1, offset, m));
    col += m;
  }
  if (parts.empty()) return at::empty({kv_heads_, 0, head_dim_}, options_);
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, 1);
}

void KVCache::WriteColumns(std::vector<at::Tensor>& blocks, int64_t row, int64_t at, const at::Tensor& src) {
  const int64_t n = src.size(1);
  for (int64_t col = at; col < at + n;) {
    const int64_t j = col / block_, offset = col % block_, m = std::min(block_ - offset, at + n - col);
    blocks[static_cast<size_t>(j)][row].narrow(1, offset, m).copy_(src.narrow(1, col - at, m));
    col += m;
  }
}

void KVCache::WriteRow(size_t layer, int64_t row, int64_t at, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(at >= 0 && at + k.size(1) <= capacity(), "KVCache: columns [", at, ", ", at + k.size(1), ") past the ",
              capacity(), " held");
  WriteColumns(k_[layer], row, at, k);
  WriteColumns(v_[layer], row, at, v);
}

void KVCache::CopyRow(int64_t from, int64_t to, int64_t n) {
  for (size_t i = 0; i < k_.size(); ++i) {
    const int64_t blocks = (n + block_ - 1) / block_;
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t m = std::min(block_, n - j * block_);
      k_[i][static_cast<size_t>(j)][to].narrow(1, 0, m).copy_(k_[i][static_cast<size_t>(j)][from].narrow(1, 0, m));
      v_[i][static_cast<size_t>(j)][to].narrow(1, 0, m).copy_(v_[i][static_cast<size_t>(j)][from].narrow(1, 0, m));
    }
  }
}

}  // namespace echelon::model
