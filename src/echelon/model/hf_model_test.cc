// Model directories in the Hugging Face layout: golden logits of all three families (from an
// independent PyTorch implementation; tests/data/model/README.md), sharded and half-precision
// weights, save -> load round trips, and refusal of broken directories by name.
#include "echelon/model/hf_model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "echelon/common/fs.h"
#include "echelon/model/checkpoint.h"
#include "echelon/model/safetensors.h"
#include "echelon/tokenizer/bpe.h"

namespace echelon::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kData = std::string(ECHELON_TEST_DATA) + "/model/";

at::Tensor Logits(Qwen3Model& m, const std::vector<int64_t>& ids) {
  at::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(ids.size());
  return m->Forward(at::tensor(ids, at::kLong).unsqueeze(0), at::arange(n, at::kLong).unsqueeze(0), at::Tensor(),
                    nullptr)[0];
}

void ExpectGolden(const std::string& name, const std::string& architecture) {
  Result<TextModel> m = LoadModelDir(kData + name);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->architecture, architecture);
  EXPECT_EQ(m->format, "huggingface");
  const json golden = json::parse(ReadFile(kData + name + "/golden_logits.json").value());
  for (const json& g : golden) {
    const auto ids = g["ids"].get<std::vector<int64_t>>();
    const auto rows = g["logits"].get<std::vector<std::vector<float>>>();
    at::Tensor expected = at::empty({static_cast<int64_t>(rows.size()), m->config.vocab_size});
    for (size_t t = 0; t < rows.size(); ++t) expected[t].copy_(at::tensor(rows[t]));
    const double err = (Logits(m->model, ids) - expected).abs().max().item<double>();
    EXPECT_LT(err, 1e-4) << name << " ids " << g["ids"].dump();
    EXPECT_GT(expected.abs().max().item<double>(), 0.1);
  }
}

TEST(HfModelGolden, Qwen3Bf16) { ExpectGolden("qwen3_bf16", "Qwen3ForCausalLM"); }
TEST(HfModelGolden, Qwen2F16ShardedWithQkvBias) { ExpectGolden("qwen2_f16_sharded", "Qwen2ForCausalLM"); }
TEST(HfModelGolden, LlamaTiedSingleKvHead) { ExpectGolden("llama_tied", "LlamaForCausalLM"); }

class HfModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("echelon_hf_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "tok");
    // A byte-level tokenizer: the 256 byte symbols, no merges, and one special token.
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[tokenizer::BytesToSymbols(std::string(1, static_cast<char>(b)))] = b;
    json tok = {
        {"version", "1.0"},
        {"added_tokens", json::array({{{"id", 256}, {"content", "<|im_end|>"}, {"special", true}, {"normalized", false}}})},
        {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
    ASSERT_TRUE(WriteFileAtomic((root_ / "tok/tokenizer.json").string(), tok.dump()).ok());
    ASSERT_TRUE(WriteFileAtomic((root_ / "tok/tokenizer_config.json").string(),
                                json{{"chat_template", "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"}}.dump())
                    .ok());
    ASSERT_TRUE(WriteFileAtomic((root_ / "tok/generation_config.json").string(), json{{"temperature", 0.6}, {"top_p", 0.95}}.dump()).ok());
  }
  void TearDown() override { fs::remove_all(root_); }

  static ModelConfig Config(const std::string& type) {
    ModelConfig c;
    c.model_type = type;
    c.vocab_size = 260;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.attention_bias = type == "llama";
    c.mlp_bias = type == "llama";
    return c;
  }

  fs::path root_;
};

TEST_F(HfModelDirTest, SaveThenLoadGivesIdenticalLogitsForEveryFamily) {
  for (const std::string type : {"qwen3", "qwen2", "llama"}) {
    SCOPED_TRACE(type);
    Qwen3Model m(Config(type));
    m->InitWeights(3);
    // Non-zero biases, so that a bias lost on the way shows.
    for (auto& item : m->named_parameters())
      if (item.key().find(".bias") != std::string::npos) item.value().data().normal_(0.0, 0.5);
    const std::string dir = (root_ / type).string();
    ASSERT_TRUE(SaveModelDir(dir, m, Config(type).architecture(), {256, 7}, (root_ / "tok").string()).ok());
    Result<TextModel> back = LoadModelDir(dir);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_TRUE(at::equal(Logits(back->model, {1, 50, 99, 3}), Logits(m, {1, 50, 99, 3})));
    EXPECT_EQ(back->architecture, Config(type).architecture());
    EXPECT_EQ(back->stop_ids, (std::vector<int64_t>{256, 7}));
    EXPECT_DOUBLE_EQ(back->temperature, 0.6);
    const json gen = json::parse(ReadFile(dir + "/generation_config.json").value());
    EXPECT_EQ(gen["eos_token_id"], json::array({256, 7})) << "the source's file is merged, not copied over ours";
    EXPECT_DOUBLE_EQ(back->top_p, 0.95);
    EXPECT_NE(back->chat_template.find("<|im_start|>"), std::string::npos);
    ASSERT_TRUE(back->vocab);
    EXPECT_EQ(back->vocab->Encode("hi<|im_end|>").value(), (std::vector<int64_t>{'h', 'i', 256}));
    EXPECT_EQ(back->vocab->codec().Decode({'o', 'k', 256}).value(), "ok<|im_end|>");
    EXPECT_EQ(back->vocab->codec().SpecialTokenId("<|im_end|>"), 256);
    const json config = json::parse(ReadFile(dir + "/config.json").value());
    EXPECT_EQ(config["architectures"][0], Config(type).architecture());
    EXPECT_EQ(config["torch_dtype"], "float32");
  }
}

TEST_F(HfModelDirTest, EchelonCheckpointsAndTokenizerlessDirectoriesLoadToo) {
  // A run directory's checkpoint carries a character tokenizer.
  const CharTokenizer chars = CharTokenizer::ForAlphabet("0123456789+-= ");
  ModelConfig c = Config("qwen3");
  c.vocab_size = chars.vocab_size();
  Qwen3Model m(c);
  m->InitWeights(5);
  ASSERT_TRUE(SaveCheckpoint((root_ / "run_ckpt").string(), m, chars).ok());
  Result<TextModel> ck = LoadModelDir((root_ / "run_ckpt").string());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->format, "echelon");
  EXPECT_EQ(ck->stop_ids, std::vector<int64_t>{CharTokenizer::kEos});
  EXPECT_EQ(ck->vocab->Encode("12+3").value(), chars.Encode("12+3").value());
  EXPECT_TRUE(at::equal(Logits(ck->model, {1, 4, 5}), Logits(m, {1, 4, 5})));
  // No tokenizer.json: ids in, logits out.
  Result<TextModel> bare = LoadModelDir(kData + "qwen3_tied");
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  EXPECT_FALSE(bare->vocab.has_value());
  EXPECT_FALSE(SaveModelDir((root_ / "x").string(), bare->model, "LlamaForCausalLM", {}, "").ok())
      << "architecture must match the model";
}

TEST_F(HfModelDirTest, BrokenDirectoriesAreRefusedByName) {
  const fs::path dir = root_ / "sharded";
  fs::copy(kData + "qwen2_f16_sharded", dir);
  ASSERT_TRUE(LoadModelDir(dir.string()).ok());
  auto error = [&] { return LoadModelDir(dir.string()).status().message(); };
  auto restore = [&] {
    fs::remove_all(dir);
    fs::copy(kData + "qwen2_f16_sharded", dir);
  };
  // A truncated shard.
  const fs::path shard = dir / "model-00002-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 10);
  EXPECT_NE(error().find("model-00002-of-00003.safetensors"), std::string::npos) << error();
  restore();
  // The index sends a tensor to a shard that does not hold it.
  json index = json::parse(ReadFile((dir / "model.safetensors.index.json").string()).value());
  const std::string moved = "model.layers.1.self_attn.q_proj.bias";
  const std::string home = index["weight_map"][moved];
  index["weight_map"][moved] = home == "model-00001-of-00003.safetensors" ? "model-00002-of-00003.safetensors"
                                                                           : "model-00001-of-00003.safetensors";
  ASSERT_TRUE(WriteFileAtomic((dir / "model.safetensors.index.json").string(), index.dump()).ok());
  EXPECT_NE(error().find(moved), std::string::npos) << error();
  restore();
  // A missing shard file.
  fs::remove(dir / "model-00003-of-00003.safetensors");
  EXPECT_NE(error().find("model-00003-of-00003.safetensors"), std::string::npos) << error();
  restore();
  // A config that does not match the weights: the first tensor that disagrees is named.
  json config = json::parse(ReadFile((dir / "config.json").string()).value());
  config["intermediate_size"] = 100;
  ASSERT_TRUE(WriteFileAtomic((dir / "config.json").string(), config.dump()).ok());
  EXPECT_NE(error().find("mlp."), std::string::npos) << error();
  EXPECT_NE(error().find("shape"), std::string::npos) << error();
  restore();
  // Weights of another family (no q/k/v biases for a qwen3 config): "unexpected tensor".
  config = json::parse(ReadFile((dir / "config.json").string()).value());
  config["model_type"] = "llama";
  config["architectures"] = {"LlamaForCausalLM"};
  ASSERT_TRUE(WriteFileAtomic((dir / "config.json").string(), config.dump()).ok());
  EXPECT_NE(error().find("unexpected tensor"), std::string::npos) << error();
  EXPECT_NE(error().find(".bias"), std::string::npos) << error();
  restore();
  // Integer weights are not weights.
  Result<SafetensorsFile> f = ReadSafetensors((dir / "model-00001-of-00003.safetensors").string());
  ASSERT_TRUE(f.ok());
  const std::string name = f->tensors.begin()->first;
  f->tensors[name] = f->tensors[name].to(at::kInt);
  ASSERT_TRUE(WriteSafetensors((dir / "model-00001-of-00003.safetensors").string(), f->tensors).ok());
  EXPECT_NE(error().find(name), std::string::npos) << error();
  EXPECT_NE(error().find("floating-point"), std::string::npos) << error();
  EXPECT_NE(LoadModelDir((root_ / "nowhere").string()).status().message().find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace echelon::model
