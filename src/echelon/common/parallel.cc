#include "echelon/common/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace echelon {

int ParallelThreads(int threads, size_t n) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(1, n)));
}

Status ParallelFor(size_t n, int threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t first_failure = n;
  Status failure;
  auto work = [&] {
    for (size_t i = next++; i < n && !failed; i = next++) {
      Status st = fn(i);
      if (st.ok()) continue;
      failed = true;
      std::lock_guard<std::mutex> lock(mu);
      if (i < first_failure) {
        first_failure = i;
        failure = std::move(st);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < ParallelThreads(threads, n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return failure;
}

}  // namespace echelon
