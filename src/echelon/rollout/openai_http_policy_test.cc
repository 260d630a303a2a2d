// The openai-http backend against `echelon serve` (in process, on a free port): the same
// prompts and seeds give bit-identical tokens and log-probs to the builtin backend.
#include "echelon/rollout/openai_http_policy.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "echelon/model/checkpoint.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/testing.h"
#include "echelon/rollout/model_policy.h"
#include "echelon/serve/openai_server.h"

namespace echelon::rollout {
namespace {

namespace fs = std::filesystem;

model::ModelConfig TinyConfig(int64_t vocab, int64_t hidden) { return model::TinyTestConfig(vocab, hidden, /*tied=*/true); }

class OpenAiHttpPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("echelon_openai_http_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    tok_ = model::CharTokenizer::ForAlphabet("0123456789+-= ");
    model::Qwen3Model m(TinyConfig(tok_.vocab_size(), 32));
    m->InitWeights(3);
    dir_ = (root_ / "served").string();
    ASSERT_TRUE(model::SaveCheckpoint(dir_, m, tok_).ok());
    Result<model::TextModel> served = model::LoadModelDir(dir_);
    ASSERT_TRUE(served.ok()) << served.status().message();
    Result<std::unique_ptr<serve::OpenAiServer>> s = serve::OpenAiServer::Create(std::move(served).value(), {});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    fs::remove_all(root_);
  }

  model::SamplingParams Sampling(double temperature) const {
    model::SamplingParams sp;
    sp.temperature = temperature;
    sp.top_p = temperature > 0 ? 0.9 : 1.0;
    sp.max_new_tokens = 8;
    sp.eos_token_id = model::CharTokenizer::kEos;
    return sp;
  }
  std::unique_ptr<ModelPolicy> Local(double temperature) {
    Result<model::LoadedCheckpoint> ck = model::LoadCheckpoint(dir_);
    EXPECT_TRUE(ck.ok());
    return std::make_unique<ModelPolicy>(ck->model, ck->vocab, Sampling(temperature));
  }
  std::unique_ptr<OpenAiHttpPolicy> Remote(double temperature) {
    OpenAiHttpOptions o;
    o.url = "http://127.0.0.1:" + std::to_string(server_->port()) + "/v1";
    o.snapshot_dir = (root_ / "snapshots").string();
    o.snapshot_files = {{"config.json", TinyConfig(tok_.vocab_size(), 32).ToJson().dump()},
                        {"tokenizer.json", tok_.ToJson().dump()}};
    const model::CharTokenizer tok = tok_;
    PromptEncoder encode = [tok](const data::PolicyPrompt& p) -> Result<std::vector<int64_t>> {
      ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> ids, tok.Encode(p.user));
      ids.insert(ids.begin(), model::CharTokenizer::kBos);
      return ids;
    };
    TokenDecoder decode = [tok](const std::vector<int64_t>& ids) { return tok.Decode(ids); };
    return std::make_unique<OpenAiHttpPolicy>(o, encode, decode, Sampling(temperature));
  }
  static void ExpectSameTurns(const std::vector<data::Turn>& got, const std::vector<data::Turn>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].prompt_ids, want[i].prompt_ids) << "turn " << i;
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "turn " << i;
      EXPECT_EQ(got[i].logprobs, want[i].logprobs) << "turn " << i;  // bit for bit
      EXPECT_EQ(got[i].text, want[i].text) << "turn " << i;
      for (float lp : got[i].logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f);
    }
  }

  fs::path root_;
  model::CharTokenizer tok_;
  std::string dir_;
  std::unique_ptr<serve::OpenAiServer> server_;
};

TEST_F(OpenAiHttpPolicyTest, GreedyTokensAndLogprobsEqualLocalGeneration) {
  const std::vector<data::PolicyPrompt> prompts = {"12+34=", "7-3=", "99+1="};
  ExpectSameTurns(Remote(0.0)->Sample(prompts, 5).value(), Local(0.0)->Sample(prompts, 5).value());
}

TEST_F(OpenAiHttpPolicyTest, SeededSamplingEqualsLocalSampling) {
  const std::vector<data::PolicyPrompt> group(4, "45+45=");
  auto remote = Remote(1.0);
  auto local = Local(1.0);
  const std::vector<data::Turn> a = remote->Sample(group, 77).value();
  ExpectSameTurns(a, local->Sample(group, 77).value());
  const std::vector<data::Turn> b = remote->Sample(group, 78).value();
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs = differs || a[i].tokens != b[i].tokens;
  EXPECT_TRUE(differs) << "another seed should draw differently";
}

// A server applies its model's generation_config.json to what a request leaves out (Qwen3's
// says top_k 20): the backend sent no top_k, min_p or repetition_penalty, so its actors sampled
// another policy than the configured one. Here the served model's defaults would make every
// draw greedy; the draws must still equal the builtin backend's.
TEST_F(OpenAiHttpPolicyTest, ServerGenerationDefaultsDoNotChangeTheSampledPolicy) {
  server_->Stop();
  Result<model::TextModel> served = model::LoadModelDir(dir_);
  ASSERT_TRUE(served.ok()) << served.status().message();
  served->top_k = 1;
  served->min_p = 0.5;
  served->repetition_penalty = 1.5;
  Result<std::unique_ptr<serve::OpenAiServer>> s = serve::OpenAiServer::Create(std::move(served).value(), {});
  ASSERT_TRUE(s.ok()) << s.status().message();
  server_ = std::move(s).value();
  ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
  const std::vector<data::PolicyPrompt> group(4, "45+45=");
  ExpectSameTurns(Remote(1.0)->Sample(group, 77).value(), Local(1.0)->Sample(group, 77).value());
}

TEST_F(OpenAiHttpPolicyTest, SnapshotsReachTheServer) {
  model::Qwen3Model next(TinyConfig(tok_.vocab_size(), 32));
  next->InitWeights(42);
  const std::string bytes = model::SerializeSafetensors(next->StateDict(), {}).value();
  auto remote = Remote(0.0);
  auto local = Local(0.0);
  ASSERT_TRUE(remote->LoadSnapshot(bytes, 4).ok());
  ASSERT_TRUE(local->LoadSnapshot(bytes, 4).ok());
  EXPECT_EQ(remote->version(), 4);
  const std::vector<data::PolicyPrompt> prompts = {"1+2=", "30-4="};
  ExpectSameTurns(remote->Sample(prompts, 1).value(), local->Sample(prompts, 1).value());
  EXPECT_TRUE(fs::exists(root_ / "snapshots" / "v4" / "model.safetensors"));

  // A snapshot of another shape is refused by the server; the policy keeps its version.
  model::Qwen3Model wide(TinyConfig(tok_.vocab_size(), 48));
  const std::string wide_bytes = model::SerializeSafetensors(wide->StateDict(), {}).value();
  Status st = remote->LoadSnapshot(wide_bytes, 5);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("snapshot v5"), std::string::npos) << st.message();
  EXPECT_EQ(remote->version(), 4);
  EXPECT_FALSE(fs::exists(root_ / "snapshots" / "v5"));
  ExpectSameTurns(remote->Sample(prompts, 1).value(), local->Sample(prompts, 1).value());
}

TEST_F(OpenAiHttpPolicyTest, UnreachableServerIsNamed) {
  OpenAiHttpOptions o;
  o.url = "http://127.0.0.1:1";
  o.model = "m";
  OpenAiHttpPolicy p(o, [](const data::PolicyPrompt&) { return Result<std::vector<int64_t>>(std::vector<int64_t>{1}); }, {},
                     Sampling(0.0));
  Result<std::vector<data::Turn>> r = p.Sample({"x"}, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("http://127.0.0.1:1/v1/completions"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace echelon::rollout
