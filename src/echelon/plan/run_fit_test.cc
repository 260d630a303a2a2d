#include "echelon/plan/run_fit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

namespace echelon::plan {
namespace {

namespace fs = std::filesystem;

// Writes a run directory the way the learner loop (learn/learner_run.cc) does, from per-update
// timings chosen by the test, so every fitted number has a known value.
class RunWriter {
 public:
  explicit RunWriter(const std::string& name) : dir_(::testing::TempDir() + "/run_fit_test_" + std::to_string(::getpid()) + "/" + name) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  const std::string& dir() const { return dir_; }

  // The run's shape (kappa 0: max(1, S - 1), as rl.publish_period: 0 resolves), and a
  // config.yaml for FitRun to find; the caller reads it (cli/plan.cc), not FitRun.
  void Config(int64_t b, int64_t g, int64_t s, int64_t kappa = 0, bool staleness_auto = false) {
    shape_ = {b, g, s, staleness_auto, kappa > 0 ? kappa : std::max<int64_t>(1, s - 1)};
    std::ofstream(dir_ + "/config.yaml") << "rl:\n  groups_per_step: " << b << "\n";
  }
  const RunShape& shape() const { return shape_; }
  void Event(const std::string& json) { lines_ += json + "\n"; }
  // A new process start (the first, or a resume): its RL clock starts `boot` seconds later.
  void Start(double boot) {
    rl_base_ = rl_;
    t_ = 0;
    wall0_ = wall_ + boot;
    first_ = true;
  }
  // One update: the learner waited `wait`, trained `train`, then spent `post` before the next
  // update (metrics, evaluation); actors delivered `groups` in it; `in_flight` at its end.
  void Update(double wait, double train, double post, std::map<std::string, int64_t> groups, int64_t in_flight,
              double tokens_per_group) {
    if (!first_) t_ += post_;
    first_ = false;
    post_ = post;
    const double step_s = wait + train;
    t_ += step_s;
    wall_ = wall0_ + t_;
    rl_ = rl_base_ + t_;
    busy_ += train;
    for (const auto& [name, n] : groups) {
      cumulative_[name] += n;
      tokens_ += n * tokens_per_group;
    }
    nlohmann::json line = {{"step", step_++},      {"version", step_},          {"wall_s", wall_},
                           {"step_s", step_s},     {"learner_busy_frac", busy_ / rl_},
                           {"tokens_per_s", tokens_ / rl_}, {"groups_in_flight", in_flight},
                           {"actor_groups", cumulative_},  {"tokens", 100},
                           {"actor_group_seconds", {{"a", 0.125}, {"b", 0.375}}},
                           {"tokens_by_fate", {{"consumed", 90 * step_}, {"stale", 5 * step_}, {"preempted", 5 * step_}}}};
    lines_ += line.dump() + "\n";
  }
  void Final() {
    Event(nlohmann::json{{"event", "final"}, {"learner_busy_frac", busy_ / (rl_ + 1.0)}, {"wall_s", wall_ + 1.0}}.dump());
  }
  void Write() { std::ofstream(dir_ + "/metrics.jsonl") << lines_; }
  void WriteRaw(const std::string& text) { std::ofstream(dir_ + "/metrics.jsonl") << text; }
  double busy() const { return busy_; }
  double rl() const { return rl_; }

 private:
  std::string dir_, lines_;
  RunShape shape_;
  double wall_ = 5, wall0_ = 5, t_ = 0, rl_ = 0, rl_base_ = 0, busy_ = 0, tokens_ = 0, post_ = 0;
  bool first_ = true;
  int64_t step_ = 0;
  std::map<std::string, int64_t> cumulative_;
};

TEST(RunFit, AsyncRunRecoversTimesRatesAndPredictsUtilisation) {
  // S = 2, B = 8 groups of 4: actor a makes 6 groups and b 2 per 0.8 s cycle (7.5 and 2.5
  // groups/s; 10 together, B / X = 0.8 s) while the learner trains 0.5 s: rollout-bound.
  RunWriter w("async");
  w.Config(8, 4, 2);
  w.Event(R"({"event": "warmstart", "wall_s": 4.0})");
  w.Start(0.7);
  w.Update(1.5, 0.5, 0.05, {{"a", 8}, {"b", 3}}, 5, 12);  // actors booting: a long first wait
  for (int k = 0; k < 40; ++k) w.Update(0.25, 0.5, 0.05, {{"a", 6}, {"b", 2}}, 4, 12);
  w.Event(R"({"event": "resume", "version": 41})");
  w.Start(3.0);
  w.Update(2.0, 0.5, 0.05, {{"a", 5}, {"b", 3}}, 4, 12);
  for (int k = 0; k < 20; ++k) w.Update(0.25, 0.5, 0.05, {{"a", 6}, {"b", 2}}, 4, 12);
  w.Final();
  w.Write();

  Result<RunFit> r = FitRun(w.dir(), w.shape());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const RunFit& f = r.value();
  EXPECT_EQ(f.updates, 62);
  EXPECT_EQ(f.process_starts, 2);
  EXPECT_EQ(f.groups_per_step, 8);
  EXPECT_EQ(f.group_size, 4);
  EXPECT_EQ(f.max_staleness, 2);
  EXPECT_EQ(f.publish_period, 1);  // 0 in the config: max(1, S - 1)
  EXPECT_NEAR(f.train_seconds, 0.5, 1e-9);
  EXPECT_NEAR(f.busy_seconds, w.busy(), 1e-9);
  EXPECT_NEAR(f.rl_seconds, w.rl(), 1e-9);
  EXPECT_NEAR(f.overhead_seconds, 0.05, 1e-9);
  EXPECT_NEAR(f.completion_tokens, 12.0 / 4, 1e-9);
  ASSERT_EQ(f.actors.size(), 2u);
  EXPECT_EQ(f.actors[0].name, "a");
  EXPECT_EQ(f.actors[0].groups, 6 * 60);
  EXPECT_NEAR(f.actors[0].groups_per_s, 7.5, 1e-9);
  EXPECT_NEAR(f.actors[1].groups_per_s, 2.5, 1e-9);
  EXPECT_NEAR(f.actors[0].tokens_per_s, 7.5 * 12, 1e-9);
  EXPECT_FALSE(f.learner_bound);
  EXPECT_NEAR(f.steady.step_seconds, 0.8, 1e-9);  // max(T_train + T_over, B / X) = max(0.55, 0.8)
  // Start-up: the two first updates' cycles (2.0 and 2.5 s) beyond the steady 0.8 s.
  EXPECT_NEAR(f.startup_seconds, (2.0 - 0.8) + (2.5 - 0.8), 1e-9);
  EXPECT_NEAR(f.predicted_utilization, f.measured_utilization, 1e-6);
  EXPECT_EQ(f.end_event, "final");
  EXPECT_GT(f.measured_utilization_end, 0);
  // The last line's tokens by fate: 90 consumed, 5 stale and 5 preempted per update.
  EXPECT_EQ(f.tokens_by_fate.at("consumed"), 90 * 62);
  EXPECT_DOUBLE_EQ(f.wasted_fraction(), 0.1);
  EXPECT_NE(RunFitTable(f).find("completion tokens: 5580 consumed, 10.0% wasted (310 stale, 310 preempted, 0 refused)"),
            std::string::npos)
      << RunFitTable(f);
  const nlohmann::json j = RunFitJson(f);
  EXPECT_DOUBLE_EQ(j["wasted_fraction"].get<double>(), 0.1);
  EXPECT_EQ(j["actors"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["measured_utilization"].get<double>(), f.measured_utilization);
  EXPECT_DOUBLE_EQ(f.actors[1].held_seconds, 0.375);  // actor_group_seconds of the last line

  // The simulator on the fitted run: its updates, every group accounted for, the learner as busy
  // as the capacity model says in the steady state (0.5 s of every 0.8 s), no failures to lose
  // tokens to.
  Result<nlohmann::json> sim = SimulateRun(f, RunSimOptions());
  ASSERT_TRUE(sim.ok()) << sim.status().message();
  const nlohmann::json& x = sim.value();
  EXPECT_EQ(x["groups_consumed"].get<uint64_t>(), 62u * 8);
  EXPECT_NEAR(x["utilization"].get<double>(), 0.5 / 0.8, 0.05);
  EXPECT_EQ(x["preempted_fraction"].get<double>(), 0.0);
  EXPECT_GE(x["wasted_fraction"].get<double>(), 0.0);
  EXPECT_LT(x["wasted_fraction"].get<double>(), 0.5);
}

TEST(RunFit, LearnerBoundRunIsFlaggedAndPredictedBusy) {
  // Actors deliver exactly what the learner consumes and the window is full after every
  // update (in flight = S * B): the learner never waits.
  RunWriter w("learner_bound");
  w.Config(8, 4, 2, 1);
  w.Start(0.5);
  w.Update(1.0, 0.5, 0.01, {{"a", 24}}, 16, 8);
  for (int k = 0; k < 30; ++k) w.Update(0.0, 0.5, 0.01, {{"a", 8}}, 16, 8);
  w.Write();
  Result<RunFit> r = FitRun(w.dir(), w.shape());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->learner_bound);
  EXPECT_DOUBLE_EQ(r->window_full_fraction, 1.0);
  EXPECT_NEAR(r->steady.utilization, 0.5 / 0.51, 1e-9);  // only the overhead keeps it below 1
  EXPECT_NEAR(r->predicted_utilization / r->measured_utilization, 1, 1e-6);
  EXPECT_EQ(r->end_event, "");
  EXPECT_LT(r->measured_utilization_end, 0);
}

TEST(RunFit, LockStepRunMeasuresActorsOnlyWhileWorkIsAdmitted) {
  // S = 0: actors generate only while the learner waits (0.8 s per update: a makes 24 groups,
  // b 8, i.e. 30 and 10 groups/s); the learner trains 0.4 s.
  RunWriter w("lockstep");
  w.Config(32, 2, 0);
  w.Start(0.5);
  w.Update(1.6, 0.4, 0.0, {{"a", 24}, {"b", 8}}, 0, 6);
  for (int k = 0; k < 30; ++k) w.Update(0.8, 0.4, 0.0, {{"a", 24}, {"b", 8}}, 0, 6);
  w.Write();
  Result<RunFit> r = FitRun(w.dir(), w.shape());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NEAR(r->actors[0].groups_per_s, 30, 1e-9);
  EXPECT_NEAR(r->actors[1].groups_per_s, 10, 1e-9);
  EXPECT_FALSE(r->learner_bound);
  // Lock-step: T_step = T_train + the batch list-scheduled over the two actors (32 groups at
  // 1/30 s and 1/10 s each: 0.8 s, give or take one group's time).
  EXPECT_NEAR(r->steady.step_seconds, 1.2, 0.1);
  EXPECT_NEAR(r->predicted_utilization / r->measured_utilization, 1, 0.05);
}

TEST(RunFit, ApplyRunFitSetsTheMeasuredNumbersOnThePlanConfig) {
  RunWriter w("apply");
  w.Config(8, 4, 2);
  w.Start(0.5);
  w.Update(1.0, 0.5, 0.05, {{"a", 8}, {"b", 3}}, 5, 12);
  for (int k = 0; k < 10; ++k) w.Update(0.25, 0.5, 0.05, {{"a", 6}, {"b", 2}}, 4, 12);
  w.Write();
  Result<RunFit> r = FitRun(w.dir(), w.shape());
  ASSERT_TRUE(r.ok()) << r.status().message();

  PlanConfig one;
  one.workers.push_back({"local", "a100", 4});
  std::vector<std::string> notes;
  ASSERT_TRUE(ApplyRunFit(r.value(), &one, &notes).ok());
  EXPECT_NEAR(one.workers[0].tokens_per_second, (7.5 + 2.5) / 2 * 12, 1e-9);  // mean of both actors
  EXPECT_EQ(one.workers[0].concurrent_groups, 1);
  EXPECT_NEAR(one.learner_step_seconds, 0.5, 1e-9);
  EXPECT_NEAR(one.learner_overhead_seconds, 0.05, 1e-9);
  EXPECT_EQ(one.groups_per_step, 8);
  EXPECT_EQ(one.shape.group_size, 4);
  EXPECT_NEAR(one.shape.completion_tokens, 3, 1e-9);

  PlanConfig two;
  two.workers.push_back({"fast", "a100", 4});
  two.workers.push_back({"slow", "a100", 4});
  two.workers[1].run_actors = {"b"};
  ASSERT_TRUE(ApplyRunFit(r.value(), &two, &notes).ok());
  EXPECT_EQ(two.workers[0].tokens_per_second, 0);  // names no actor: keeps its own
  EXPECT_NEAR(two.workers[1].tokens_per_second, 2.5 * 12, 1e-9);

  two.workers[0].run_actors = {"actor-9"};
  two.workers[0].run_actors_where = "plan.yaml:12";
  Status st = ApplyRunFit(r.value(), &two, &notes);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("plan.yaml:12: workers run_actors names 'actor-9'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("its actors: a, b"), std::string::npos) << st.message();
}

class RunFitErrors : public ::testing::Test {
 protected:
  std::string Message(const std::string& dir, const RunShape& shape = {8, 4, 2, false, 1}) {
    Result<RunFit> r = FitRun(dir, shape);
    EXPECT_FALSE(r.ok());
    return r.ok() ? "" : r.status().message();
  }
  static bool Has(const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  }
};

TEST_F(RunFitErrors, MissingDirectoryAndFilesAreNamed) {
  const std::string nowhere = ::testing::TempDir() + "/run_fit_test_" + std::to_string(::getpid()) + "/nowhere";
  EXPECT_TRUE(Has(Message(nowhere), nowhere + ": no such run directory")) << Message(nowhere);
  RunWriter w("no_config");
  EXPECT_TRUE(Has(Message(w.dir()), w.dir() + "/config.yaml: missing")) << Message(w.dir());
  w.Config(8, 4, 2);
  EXPECT_TRUE(Has(Message(w.dir()), w.dir() + "/metrics.jsonl: cannot open")) << Message(w.dir());
  w.WriteRaw("");
  EXPECT_TRUE(Has(Message(w.dir()), w.dir() + "/metrics.jsonl: empty")) << Message(w.dir());
  w.WriteRaw("{\"event\": \"warmstart\", \"wall_s\": 3}\n");
  EXPECT_TRUE(Has(Message(w.dir()), "metrics.jsonl: no learner update lines")) << Message(w.dir());
}

TEST_F(RunFitErrors, CorruptLinesNameFileAndLine) {
  RunWriter w("corrupt");
  w.Config(8, 4, 2);
  w.Start(0.5);
  for (int k = 0; k < 3; ++k) w.Update(0.2, 0.5, 0.0, {{"a", 8}}, 4, 8);
  w.Write();
  const std::string path = w.dir() + "/metrics.jsonl";
  std::ofstream(path, std::ios::app) << "{\"step\": 3, \"wall_s\": oops}\n";
  EXPECT_TRUE(Has(Message(w.dir()), path + ":4: not a JSON object")) << Message(w.dir());

  w.Write();
  std::ofstream(path, std::ios::app) << "{\"step\": 3, \"wall_s\": 99.0, \"learner_busy_frac\": 0.5}\n";
  EXPECT_TRUE(Has(Message(w.dir()), path + ":4: a learner update line needs a number 'step_s'")) << Message(w.dir());

  w.Write();
  std::ofstream(path, std::ios::app)
      << R"({"step": 5, "wall_s": 99.0, "step_s": 0.7, "learner_busy_frac": 0.5, "tokens_per_s": 1, "groups_in_flight": 1, "actor_groups": {"a": 40}})"
      << "\n";
  EXPECT_TRUE(Has(Message(w.dir()), path + ":4: update step 5 follows step 2")) << Message(w.dir());

  w.Write();
  std::ofstream(path, std::ios::app)
      << R"({"step": 3, "wall_s": 99.0, "step_s": 0.7, "learner_busy_frac": 0.5, "tokens_per_s": 1, "groups_in_flight": 1, "actor_groups": {"a": -4}})"
      << "\n";
  EXPECT_TRUE(Has(Message(w.dir()), path + ":4: actor_groups[\"a\"] is -4")) << Message(w.dir());
}

TEST_F(RunFitErrors, BadShapeAutoStalenessWithoutBoundAndTooShortRuns) {
  RunWriter w("bad_shape");
  w.Config(8, 4, 2);
  w.Start(0.5);
  for (int k = 0; k < 3; ++k) w.Update(0.2, 0.5, 0.0, {{"a", 8}}, 4, 8);
  w.Write();
  EXPECT_TRUE(Has(Message(w.dir(), {0, 4, 2, false, 1}), w.dir() + ": a run shape needs B >= 1"))
      << Message(w.dir(), {0, 4, 2, false, 1});
  EXPECT_TRUE(Has(Message(w.dir(), {8, 4, 2, false, 0}), "kappa = 0")) << Message(w.dir(), {8, 4, 2, false, 0});
  // rl.staleness: auto fits the run at the S of its last line, which these lines do not carry.
  EXPECT_TRUE(Has(Message(w.dir(), {8, 4, 2, true, 1}), "metrics.jsonl:3: rl.staleness is auto, and the last update "
                                                       "line has no staleness_bound"))
      << Message(w.dir(), {8, 4, 2, true, 1});

  RunWriter one("one_update");
  one.Config(8, 4, 2);
  one.Start(0.5);
  one.Update(0.2, 0.5, 0.0, {{"a", 8}}, 4, 8);
  one.Write();
  EXPECT_TRUE(Has(Message(one.dir()), "at least two consecutive updates")) << Message(one.dir());
}

}  // namespace
}  // namespace echelon::plan
