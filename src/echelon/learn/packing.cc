#include "echelon/learn/packing.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace echelon::learn {

std::vector<std::vector<size_t>> PackFirstFitDecreasing(const std::vector<int64_t>& lengths, int64_t width) {
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> rows;
  std::vector<int64_t> free;  // free width of each row
  for (size_t i : order) {
    if (lengths[i] < 1 || lengths[i] > width)
      throw std::invalid_argument("PackFirstFitDecreasing: sequence " + std::to_string(i) + " has length " +
                                  std::to_string(lengths[i]) + ", outside [1, " + std::to_string(width) + "]");
    auto it = std::find_if(free.begin(), free.end(), [&](int64_t f) { return f >= lengths[i]; });
    if (it == free.end()) {
      rows.emplace_back();
      free.push_back(width);
      it = free.end() - 1;
    }
    *it -= lengths[i];
    rows[static_cast<size_t>(it - free.begin())].push_back(i);
  }
  return rows;
}

bool PackingPays(size_t rows, size_t packed_rows) { return packed_rows * 8 <= rows * 7; }

}  // namespace echelon::learn
