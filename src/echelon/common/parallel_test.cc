#include "echelon/common/parallel.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace echelon {
namespace {

TEST(ParallelForTest, RunsEveryIndexExactlyOnce) {
  for (int threads : {0, 1, 3, 64}) {
    std::vector<std::atomic<int>> calls(1000);
    ASSERT_TRUE(ParallelFor(calls.size(), threads, [&](size_t i) {
                  calls[i]++;
                  return Status::Ok();
                }).ok());
    for (size_t i = 0; i < calls.size(); ++i) ASSERT_EQ(calls[i].load(), 1) << "index " << i << ", threads " << threads;
  }
  EXPECT_TRUE(ParallelFor(0, 4, [](size_t) { return Internal("never called"); }).ok());
}

TEST(ParallelForTest, ReturnsTheLowestFailingIndexsError) {
  // Every index from 10 on fails; whichever thread fails first, the error is index 10's.
  for (int threads : {1, 2, 8}) {
    Status st = ParallelFor(100, threads, [](size_t i) {
      return i >= 10 ? InvalidArgument("item " + std::to_string(i)) : Status::Ok();
    });
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), "item 10") << "threads " << threads;
  }
}

TEST(ParallelForTest, OneThreadRunsOnTheCallerAndThreadsNeverExceedItems) {
  const std::thread::id caller = std::this_thread::get_id();
  ASSERT_TRUE(ParallelFor(5, 1, [&](size_t) {
                EXPECT_EQ(std::this_thread::get_id(), caller);
                return Status::Ok();
              }).ok());
  EXPECT_EQ(ParallelThreads(16, 3), 3);
  EXPECT_EQ(ParallelThreads(2, 100), 2);
  EXPECT_EQ(ParallelThreads(4, 0), 1);
  EXPECT_GE(ParallelThreads(0, 100), 1);
}

}  // namespace
}  // namespace echelon
