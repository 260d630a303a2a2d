// The memory probe's phases and rank protocol, with the worker rank as a thread of this test
// (so every rank reads the same process's resident set; `plan --measure` runs processes and
// tests/plan_from_run_test.sh checks the figures against the estimate).
#include "echelon/learn/learner_memory_probe.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <sstream>

#include "echelon/learn/testing.h"

namespace echelon::learn {
namespace {

TEST(LearnerMemoryProbe, EveryRankIsReadAfterEveryPhaseAndTheRunResumesFromItsCheckpoint) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("echelon_probe_" + std::to_string(::getpid()))).string();
  MemoryProbeOptions o;
  o.setup.ranks = 2;
  o.setup.shard = Shard::kParams;
  o.setup.precision = Precision::kFp32;
  o.setup.micro_batch_tokens = 64;
  o.dir = dir;
  std::future<Status> worker;
  std::stringstream log;
  int started = 0;
  o.start_workers = [&](int port, int world) {
    ++started;
    worker = std::async(std::launch::async, [port, world, &log] {
      RankGroupOptions r;
      r.rank = 1;
      r.world = world;
      r.master_port = port;
      r.timeout_seconds = 60;
      Result<std::unique_ptr<RankGroup>> g = RankGroup::Connect(r);
      if (!g.ok()) return g.status();
      return RunRankWorker(*g.value(), log);
    });
    return Status::Ok();
  };
  o.wait_workers = [&] {
    ASSERT_TRUE(worker.valid());
    const Status st = worker.get();
    EXPECT_TRUE(st.ok()) << st.message();
  };
  std::stringstream progress;
  Result<std::vector<PhaseMemory>> phases = MeasureLearnerMemory(TinyConfig(), o, progress);
  ASSERT_TRUE(phases.ok()) << phases.status().message();
  EXPECT_EQ(started, 2);  // once at set-up, once at the resume
  const std::vector<std::string> names = {"set-up", "updates", "publication", "checkpoint save", "resume"};
  ASSERT_EQ(phases->size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const PhaseMemory& p = phases.value()[i];
    EXPECT_EQ(p.phase, names[i]);
    ASSERT_EQ(p.measured.size(), 2u);
    ASSERT_EQ(p.estimate_mb.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_GT(p.measured[r].peak_mb, 0) << p.phase << " rank " << r;
      EXPECT_GT(p.measured[r].start_mb, 0);
      EXPECT_GE(p.estimate_mb[r], p.measured[r].start_mb);  // the runtime and something more
    }
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step-2/optimizer.safetensors"));
  const std::string table = MeasuredMemoryTable(phases.value(), TinyConfig(), o.setup);
  EXPECT_NE(table.find("checkpoint save"), std::string::npos);
  EXPECT_NE(table.find("whole run"), std::string::npos);
  // TinyConfig's 16 bytes a parameter over 2 ranks, in MiB, and one line per rank.
  char state[64];
  std::snprintf(state, sizeof state, "state/N %.0f MiB", TinyConfig().NumParameters() * 16.0 / 2 / 1048576.0);
  EXPECT_NE(table.find(state), std::string::npos) << table;
  EXPECT_NE(table.find("rank 1: whole-run peak = runtime"), std::string::npos) << table;
  std::filesystem::remove_all(dir);
}

TEST(LearnerMemoryProbe, RefusesWhatItCannotMeasure) {
  MemoryProbeOptions o;
  o.dir = std::filesystem::temp_directory_path().string();
  o.setup.ranks = 2;  // and nothing to start the workers with
  std::stringstream progress;
  EXPECT_FALSE(MeasureLearnerMemory(TinyConfig(), o, progress).ok());
  o.setup.ranks = 1;
  o.setup.micro_batch_tokens = 8;
  EXPECT_FALSE(MeasureLearnerMemory(TinyConfig(), o, progress).ok());
}

}  // namespace
}  // namespace echelon::learn
