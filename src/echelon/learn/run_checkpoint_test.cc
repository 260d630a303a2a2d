#include "echelon/learn/run_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "echelon/common/fs.h"
#include "echelon/model/safetensors.h"
#include "echelon/obs/metrics_log.h"

namespace echelon::learn {
namespace {
namespace fs = std::filesystem;

model::ModelConfig Tiny() {
  model::ModelConfig c;
  c.vocab_size = 17;
  c.hidden_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.intermediate_size = 32;
  c.max_position_embeddings = 32;
  return c;
}

learn::LearnerGroup Group() {
  learn::LearnerGroup g;
  for (int i = 0; i < 2; ++i) {
    data::Episode e;
    e.turns.push_back({{1, 3, 4}, {5 + i, 2}, {-1.0f, -2.0f}, ""});
    e.reward = i;
    g.episodes.push_back(e);
  }
  return g;
}

class RunCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("echelon_runckpt_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    model_ = model::Qwen3Model(Tiny());
    model_->InitWeights(4);
    learner_ = std::make_unique<learn::Learner>(model_, learn::LearnerOptions{});
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Takes one update and saves a checkpoint at the new version.
  RunState StepAndSave(int64_t keep) {
    EXPECT_TRUE(learner_->Step({Group()}).ok());
    RunState s;
    s.version = learner_->version();
    s.dispatcher.version = s.version;
    s.dispatcher.next_group = 10 * s.version;
    s.dispatcher.counts.handed_out = s.dispatcher.counts.consumed = 10 * s.version;
    s.metrics_bytes = 100 * s.version;
    s.actor_groups = {{"actor-0", s.version}};
    s.rng_state_hex = CaptureRngState();
    EXPECT_TRUE(SaveRunCheckpoint(dir_.string(), *learner_, tok_, s, keep).ok());
    return s;
  }

  fs::path dir_;
  model::Qwen3Model model_{nullptr};
  std::unique_ptr<learn::Learner> learner_;
  model::Vocabulary tok_ = model::Vocabulary::Characters("0123456789+-= ");
};

TEST_F(RunCheckpointTest, NewestWholeCheckpointRestoresWeightsOptimizerAndState) {
  StepAndSave(3);
  const RunState saved = StepAndSave(3);
  std::vector<std::string> skipped;
  Result<ResumePoint> p = LoadNewestRunCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE(skipped.empty());
  EXPECT_EQ(p->dir, (dir_ / "step-2").string());
  EXPECT_EQ(RunStateToJson(p->state), RunStateToJson(saved));
  for (const auto& [name, w] : model_->StateDict()) EXPECT_TRUE(at::equal(w, p->checkpoint.model->StateDict().at(name)));
  const auto opt = learner_->OptimizerState();
  ASSERT_EQ(p->optimizer.size(), opt.size());
  for (const auto& [name, t] : opt) EXPECT_TRUE(at::equal(t, p->optimizer.at(name))) << name;
}

// A model stored in bf16 (a Hugging Face BF16 model) writes bf16 weights, and the run
// checkpoint carries the fp32 master weights too: the resumed run continues from them exactly.
TEST_F(RunCheckpointTest, Bf16StoredModelResumesFromExactFp32MasterWeights) {
  model::ModelConfig c = Tiny();
  c.torch_dtype = "bfloat16";
  model_ = model::Qwen3Model(c);
  model_->InitWeights(4);
  learner_ = std::make_unique<learn::Learner>(model_, learn::LearnerOptions{});
  StepAndSave(3);
  Result<model::SafetensorsFile> stored = model::ReadSafetensors((dir_ / "step-1" / "model.safetensors").string());
  ASSERT_TRUE(stored.ok());
  for (const auto& [name, t] : stored->tensors) EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name;
  std::vector<std::string> skipped;
  Result<ResumePoint> p = LoadNewestRunCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(p.ok()) << p.status().message();
  bool finer_than_bf16 = false;
  for (const auto& [name, w] : model_->StateDict()) {
    EXPECT_TRUE(at::equal(w, p->checkpoint.model->StateDict().at(name))) << name;
    finer_than_bf16 = finer_than_bf16 || !at::equal(w, w.to(at::kBFloat16).to(at::kFloat));
  }
  EXPECT_TRUE(finer_than_bf16);
}

TEST_F(RunCheckpointTest, CorruptOrUnfinishedNewestFallsBackToThePreviousAndSaysWhy) {
  StepAndSave(5);
  StepAndSave(5);
  StepAndSave(5);
  // step-3: one flipped bit in the optimizer state; step-2: checksums.json never written.
  const fs::path opt = dir_ / "step-3" / "optimizer.safetensors";
  std::string bytes = ReadFile(opt.string()).value();
  bytes[bytes.size() - 3] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(opt.string(), bytes).ok());
  fs::remove(dir_ / "step-2" / "checksums.json");
  // A leftover of a write killed half-way is not a candidate.
  fs::create_directories(dir_ / "step-4.tmp-99999");
  std::vector<std::string> skipped;
  Result<ResumePoint> p = LoadNewestRunCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->state.version, 1);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("step-3"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find("optimizer.safetensors"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("step-2"), std::string::npos) << skipped[1];
  EXPECT_NE(skipped[1].find("checksums.json"), std::string::npos) << skipped[1];
  // Nothing whole at all: NotFound, every one named.
  fs::remove(dir_ / "step-1" / "model.safetensors");
  skipped.clear();
  p = LoadNewestRunCheckpoint(dir_.string(), &skipped);
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(skipped.size(), 3u);
}

TEST_F(RunCheckpointTest, KeepsTheNewestKAndRemovesLeftovers) {
  fs::create_directories(dir_ / "step-0.tmp-99999");
  fs::create_directories(dir_ / "warmstart");
  for (int i = 0; i < 5; ++i) StepAndSave(2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-4", "step-5", "warmstart"}));
}

// A SIGKILL during a prune left step-N without its state file: never listed again, so never
// removed, and the run kept checkpoint.keep + 1 directories (resume_system, seed 24143).
TEST_F(RunCheckpointTest, CheckpointHalfRemovedByACrashIsRemovedLater) {
  StepAndSave(2);
  fs::remove(dir_ / "step-1" / "trainer_state.json");
  // Another process's leftover whose pid starts with ours.
  fs::create_directories(dir_ / ("step-1.tmp-" + std::to_string(::getpid()) + "7"));
  for (int i = 0; i < 3; ++i) StepAndSave(2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-3", "step-4"}));
}

TEST(RunStateJson, RoundTripsAndNamesBadFields) {
  RunState s;
  s.version = 7;
  s.dispatcher.version = 7;
  s.dispatcher.unsettled = {3, 9};
  s.refusals = {{"bad_version", 2}};
  s.rng_state_hex = "00ff";
  s.staleness_control = {{"staleness", 5}, {"seen", 1}, {"ess_sum", 0.9}, {"train_sum", 1.0}, {"wait_sum", 0.5}};
  Result<RunState> back = RunStateFromJson(RunStateToJson(s), "state.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(RunStateToJson(back.value()), RunStateToJson(s));
  // Checkpoints of releases before rl.staleness: auto have no such field: a fixed S.
  nlohmann::json old = RunStateToJson(s);
  old.erase("staleness_control");
  ASSERT_TRUE(RunStateFromJson(old, "state.json").ok());
  EXPECT_TRUE(RunStateFromJson(old, "state.json")->staleness_control.is_null());

  nlohmann::json j = RunStateToJson(s);
  j.erase("metrics_bytes");
  EXPECT_NE(RunStateFromJson(j, "state.json").status().message().find("\"metrics_bytes\""), std::string::npos);
  j = RunStateToJson(s);
  j["dispatcher"]["counts"]["consumed"] = "many";
  EXPECT_NE(RunStateFromJson(j, "state.json").status().message().find("consumed"), std::string::npos);
  j = RunStateToJson(s);
  j["dispatcher"]["version"] = 6;
  EXPECT_NE(RunStateFromJson(j, "state.json").status().message().find("disagree"), std::string::npos);
  j = RunStateToJson(s);
  j["format"] = "other";
  EXPECT_NE(RunStateFromJson(j, "state.json").status().message().find("format"), std::string::npos);
}

TEST(RngState, RestoringReplaysTheSameDraws) {
  const std::string saved = CaptureRngState();
  const at::Tensor a = at::rand({8});
  ASSERT_TRUE(RestoreRngState(saved).ok());
  EXPECT_TRUE(at::equal(a, at::rand({8})));
  EXPECT_FALSE(RestoreRngState("zz").ok());
  EXPECT_FALSE(RestoreRngState("abc").ok());
}

TEST(MetricsRollBack, CutsBackToTheCheckpointAndKeepsTheCutLines) {
  const fs::path dir = fs::temp_directory_path() / ("echelon_rollback_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "metrics.jsonl").string(), cut = (dir / "discarded.jsonl").string();
  uint64_t at_checkpoint = 0;
  {
    obs::MetricsLog log;
    ASSERT_TRUE(log.Open(path).ok());
    ASSERT_TRUE(log.Write({{"step", 0}}).ok());
    at_checkpoint = log.bytes();
    ASSERT_TRUE(log.Write({{"step", 1}}).ok());
  }
  // A line half-written when the process died.
  std::string text = ReadFile(path).value() + "{\"step\": 2, \"lo";
  ASSERT_TRUE(WriteFileAtomic(path, text).ok());
  Result<int64_t> moved = obs::MetricsLog::RollBack(path, at_checkpoint, cut);
  ASSERT_TRUE(moved.ok()) << moved.status().message();
  EXPECT_EQ(moved.value(), 2);
  EXPECT_EQ(ReadFile(path).value(), "{\"step\":0}\n");
  EXPECT_EQ(ReadFile(cut).value(), "{\"step\":1}\n{\"step\": 2, \"lo\n");
  EXPECT_EQ(obs::MetricsLog::RollBack(path, at_checkpoint, cut).value(), 0);
  EXPECT_FALSE(obs::MetricsLog::RollBack(path, at_checkpoint + 100, cut).ok()) << "file shorter than recorded";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace echelon::learn
