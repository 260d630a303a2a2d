// Padding-free learner batches: sequences of different lengths packed back to back into rows of
// a fixed width, so a forward computes (almost) only real tokens (Qwen3Model::ForwardPacked
// keeps attention inside each sequence).
//
//   PackFirstFitDecreasing({9, 3, 6, 1}, 10) == {{0, 3}, {2, 1}}   // 9 + 1 and 6 + 3
//
// Thread contract: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace echelon::learn {

// First-fit decreasing bin packing: the sequences, longest first (ties in index order), each go
// into the first row whose free width holds them, or open a new row. Returns each row's
// sequences (indices into `lengths`) in their order along the row. Every length must be in
// [1, width] (std::invalid_argument otherwise). First fit leaves at most one row less than
// half full, so rows <= 2 * sum(lengths) / width + 1.
std::vector<std::vector<size_t>> PackFirstFitDecreasing(const std::vector<int64_t>& lengths, int64_t width);

// Whether `rows` rows of one width packed into `packed_rows` rows of the same width save enough
// to pay for the packed forward's extra work (a per-row segment mask instead of the causal one,
// and a gather back to the padded layout): on equal rows, where packing saves nothing, the packed
// forward costs 3-12% more (bench/learner_step_bench, docs/BENCHMARKS.md), so it must remove at
// least an eighth of the rows.
bool PackingPays(size_t rows, size_t packed_rows);

}  // namespace echelon::learn
