// ProcessGroup restarts children that die, and only those.
#include "echelon/cli/processes.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace echelon::cli {
namespace {

std::string LogPath(const std::string& name) {
  return testing::TempDir() + "/echelon_processes_" + name + "_" + std::to_string(::getpid()) + ".log";
}

// Regression: an actor that the learner told to finish exits with status 0 while the learner
// writes its final checkpoint; it used to be restarted as if it had crashed.
TEST(ProcessGroupTest, CleanExitIsNotRestarted) {
  ProcessGroup group(/*max_restarts=*/3);
  ASSERT_TRUE(group.Start("done", {"/bin/true"}, LogPath("done")).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_EQ(group.restarts(), 0);
  group.StopAll(1.0);
}

TEST(ProcessGroupTest, FailingChildIsRestartedUpToTheCap) {
  ProcessGroup group(/*max_restarts=*/2);
  ASSERT_TRUE(group.Start("crash", {"/bin/false"}, LogPath("crash")).ok());
  for (int i = 0; i < 50 && group.restarts() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // no third restart
  EXPECT_EQ(group.restarts(), 2);
  group.StopAll(1.0);
}

}  // namespace
}  // namespace echelon::cli
