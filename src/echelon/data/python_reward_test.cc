#include "echelon/data/python_reward.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "echelon/common/testing.h"

namespace echelon::data {
namespace {

class PythonRewardTest : public TempDirTest {
 protected:
  std::unique_ptr<PythonReward> Start(const std::string& file, double timeout = 10) {
    Result<std::unique_ptr<PythonReward>> r = PythonReward::Start({file, "compute_score", timeout});
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::string StartError(const std::string& file, const std::string& function = "compute_score") {
    Result<std::unique_ptr<PythonReward>> r = PythonReward::Start({file, function, 10});
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  }
};

constexpr char kVerlStyle[] = R"PY(
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    print("scoring", solution_str)  # must not disturb the protocol
    if data_source == "dict":
        return {"score": 0.5, "length": len(solution_str), "bonus": extra_info["bonus"]}
    return 1.0 if solution_str.strip() == ground_truth else 0
)PY";

TEST_F(PythonRewardTest, CallsTheFunctionAsVerlDoes) {
  auto py = Start(Write("r.py", kVerlStyle));
  ASSERT_TRUE(py);
  Result<ExternalScore> s = py->Score("toy", " 72 ", "72", "null");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->score, 1.0);
  EXPECT_TRUE(s->extras.empty());
  EXPECT_EQ(py->Score("toy", "71", "72", "null")->score, 0.0);  // an int is a number
  s = py->Score("dict", "abc", "x", R"({"bonus": 2})");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->score, 0.5);
  EXPECT_EQ(s->extras, (std::map<std::string, double>{{"bonus", 2.0}, {"length", 3.0}}));
  // Unicode and control characters travel intact.
  EXPECT_EQ(py->Score("toy", "\xC3\xA9\n\t\"", "\xC3\xA9\n\t\"", "null")->score, 1.0);
}

TEST_F(PythonRewardTest, KeywordArgumentsReachAFunctionWithAnotherOrder) {
  auto py = Start(Write("r.py", "def compute_score(ground_truth, solution_str, **kw):\n"
                                "    return float(solution_str == ground_truth)\n"));
  ASSERT_TRUE(py);
  EXPECT_EQ(py->Score("s", "7", "7", "null")->score, 1.0);
}

TEST_F(PythonRewardTest, AnExceptionNamesFileLineAndSample) {
  const std::string file = Write("r.py", "def helper(x):\n    return 1 / x\n\ndef compute_score(data_source, solution_str, "
                                         "ground_truth, extra_info=None):\n    return helper(0)\n");
  auto py = Start(file);
  ASSERT_TRUE(py);
  Result<ExternalScore> s = py->Score("gsm8k", "the answer is 4", "4", "null");
  ASSERT_FALSE(s.ok());
  const std::string m = s.status().message();
  EXPECT_NE(m.find(file + ":2: ZeroDivisionError: division by zero"), std::string::npos) << m;
  EXPECT_NE(m.find("data_source \"gsm8k\", ground_truth \"4\", solution_str \"the answer is 4\""), std::string::npos) << m;
  // The worker lives on.
  EXPECT_FALSE(py->Score("x", "y", "z", "null").ok());
}

TEST_F(PythonRewardTest, ANonNumberIsRefused) {
  auto py = Start(Write("r.py", R"PY(
import math
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"str": "0.5", "none": None, "nan": math.nan, "nodict": {"x": 1}, "badextra": {"score": 1, "why": "x"},
            "inf": math.inf}[data_source]
)PY"));
  ASSERT_TRUE(py);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"str", "returned '0.5' (str), not a finite number"},
      {"none", "returned None (NoneType), not a finite number"},
      {"nan", "returned nan (float), not a finite number"},
      {"inf", "returned inf (float), not a finite number"},
      {"nodict", "returned a dict without \"score\" (keys: ['x'])"},
      {"badextra", "returned why = 'x': the other keys must be finite numbers"},
  };
  for (const auto& [source, message] : cases) {
    Result<ExternalScore> s = py->Score(source, "a", "b", "null");
    ASSERT_FALSE(s.ok()) << source;
    EXPECT_NE(s.status().message().find(message), std::string::npos) << s.status().message();
  }
}

TEST_F(PythonRewardTest, AHungCallIsKilledAtItsLimitAndTheNextCallWorks) {
  auto py = Start(Write("r.py", "import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                "    if data_source == 'slow':\n        time.sleep(60)\n    return 1.0\n"),
                  1.0);
  ASSERT_TRUE(py);
  const auto t0 = std::chrono::steady_clock::now();
  Result<ExternalScore> s = py->Score("slow", "a", "b", "null");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.status().message().find("no answer within 1"), std::string::npos) << s.status().message();
  EXPECT_LT(took, 5.0);
  Result<ExternalScore> next = py->Score("fast", "a", "b", "null");
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_EQ(next->score, 1.0);
}

// Regression: loading shared the per-call limit, so a file whose imports take longer than one
// call may (or an interpreter started on a loaded machine) could never start.
TEST_F(PythonRewardTest, ASlowImportIsNotCutByThePerCallLimit) {
  auto py = Start(Write("r.py", "import time\ntime.sleep(1.5)\n"
                                "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                "    return 3.0\n"),
                  1.0);
  ASSERT_TRUE(py);
  EXPECT_EQ(py->Score("x", "a", "b", "null")->score, 3.0);
}

TEST_F(PythonRewardTest, AFileThatNeverLoadsFailsAtTheLoadLimit) {
  PythonRewardOptions o{Write("r.py", "import time\ntime.sleep(60)\n"), "compute_score", 30};
  o.load_timeout_seconds = 1;
  Result<std::unique_ptr<PythonReward>> r = PythonReward::Start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("loading: no answer within 1"), std::string::npos) << r.status().message();
}

TEST_F(PythonRewardTest, AWorkerThatDiesIsNamedAndRestarted) {
  auto py = Start(Write("r.py", "import os\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                "    if data_source == 'die':\n        os._exit(3)\n    return 2.0\n"));
  ASSERT_TRUE(py);
  Result<ExternalScore> s = py->Score("die", "a", "b", "null");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("the Python worker exited (status 3)"), std::string::npos) << s.status().message();
  EXPECT_EQ(py->Score("ok", "a", "b", "null")->score, 2.0);
}

TEST_F(PythonRewardTest, FilesThatDoNotLoadSayWhy) {
  const std::string syntax = Write("syntax.py", "def compute_score(:\n    pass\n");
  EXPECT_NE(StartError(syntax).find(syntax + ":1: SyntaxError"), std::string::npos);
  const std::string raises = Write("raises.py", "import no_such_module_here\n");
  EXPECT_NE(StartError(raises).find(raises + ":1: ModuleNotFoundError"), std::string::npos);
  const std::string fine = Write("fine.py", kVerlStyle);
  EXPECT_NE(StartError(fine, "score_it").find("defines no function score_it"), std::string::npos);
  EXPECT_NE(StartError((dir_ / "missing.py").string()).find("missing.py: No such file"), std::string::npos);
}

TEST_F(PythonRewardTest, ConcurrentCallersGetTheirOwnAnswers) {
  auto py = Start(Write("r.py", "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                "    return float(solution_str) * 2\n"));
  ASSERT_TRUE(py);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        Result<ExternalScore> s = py->Score("c", std::to_string(t * 100 + i), "", "null");
        if (!s.ok() || s->score != 2.0 * (t * 100 + i)) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace echelon::data

namespace echelon::data {
namespace {

// A pool scores a group's samples side by side and returns what one worker returns for each,
// in order; a sample whose call hangs fails alone, at its time limit, and the pool goes on.
TEST_F(PythonRewardTest, APoolGivesTheSerialResultsInOrder) {
  const std::string file = Write("r.py", R"PY(
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(60)
    time.sleep(0.002)
    return {"score": float(len(solution_str)) / 10, "pid_parity": 0}
)PY");
  auto one = Start(file);
  ASSERT_TRUE(one);
  Result<std::unique_ptr<PythonRewardPool>> pool = PythonRewardPool::Start({file, "compute_score", 2}, 3);
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  EXPECT_EQ(pool.value()->workers(), 3u);
  std::vector<RewardSample> samples;
  for (int i = 0; i < 20; ++i) samples.push_back({"toy", std::string(static_cast<size_t>(i), 'x'), "", "null"});
  const std::vector<Result<ExternalScore>> got = pool.value()->ScoreAll(samples);
  ASSERT_EQ(got.size(), samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    Result<ExternalScore> want = one->Score("toy", samples[i].solution_str, "", "null");
    ASSERT_TRUE(got[i].ok() && want.ok()) << i;
    EXPECT_EQ(got[i]->score, want->score) << i;
    EXPECT_EQ(got[i]->extras, want->extras) << i;
  }
  samples[4].solution_str = "hang";
  const std::vector<Result<ExternalScore>> with_hang = pool.value()->ScoreAll(samples);
  EXPECT_EQ(with_hang[4].status().code(), StatusCode::kDeadlineExceeded) << with_hang[4].status().message();
  for (size_t i = 0; i < samples.size(); ++i)
    if (i != 4) EXPECT_TRUE(with_hang[i].ok()) << i;
  EXPECT_TRUE(pool.value()->ScoreAll({samples[3]})[0].ok()) << "the killed worker was started again";
}

// A text that makes the function slow, but each call under its own limit, held the one reward
// process for the group's size times that limit (8 x 29 s), and every other worker's group
// waited behind it. A group's calls now end with its budget: the ones still waiting are not
// made, the one running is cut, and the pool serves the next group at once.
TEST_F(PythonRewardTest, AGroupOfSlowTextsEndsWithItsBudgetAndTheNextGroupScores) {
  const std::string file = Write("slow.py", R"PY(
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("slow"):
        time.sleep(2.5)
    return 1.0
)PY");
  Result<std::unique_ptr<PythonRewardPool>> pool = PythonRewardPool::Start({file, "compute_score", 5}, 1);
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  std::vector<RewardSample> slow(8, {"toy", "slow text", "", "null"});
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Result<ExternalScore>> got = pool.value()->ScoreAll(slow, /*budget_seconds=*/3.0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 4.5) << "unbounded, it takes 8 x 2.5 s";
  EXPECT_TRUE(got[0].ok()) << "the first call fits the budget: " << got[0].status().message();
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_EQ(got[i].status().code(), StatusCode::kResourceExhausted) << i << ": " << got[i].status().message();
    EXPECT_NE(got[i].status().message().find("reward budget is spent"), std::string::npos);
  }
  const auto next = std::chrono::steady_clock::now();
  const std::vector<Result<ExternalScore>> fast = pool.value()->ScoreAll({{"toy", "42", "", "null"}}, 3.0);
  ASSERT_TRUE(fast[0].ok()) << fast[0].status().message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - next).count(), 2.5)
      << "the next group waited for the slow one";
}

}  // namespace
}  // namespace echelon::data
