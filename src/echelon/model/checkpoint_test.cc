#include "echelon/model/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/model/safetensors.h"

namespace echelon::model {
namespace {

namespace fs = std::filesystem;

ModelConfig SmallConfig() {
  ModelConfig c;
  c.vocab_size = 17;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.eos_token_id = 2;
  return c;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("echelon_ckpt_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = (root_ / "ckpt").string();
    model_ = Qwen3Model(SmallConfig());
    model_->InitWeights(21);
  }
  void TearDown() override { fs::remove_all(root_); }

  at::Tensor Logits(Qwen3Model& m) {
    at::Tensor ids = at::tensor(std::vector<int64_t>{1, 6, 10, 13, 7, 11, 15}, at::kLong).unsqueeze(0);
    return m->Forward(ids, at::arange(7, at::kLong).unsqueeze(0), at::Tensor(), nullptr);
  }

  std::string LoadError() {
    Result<LoadedCheckpoint> r = LoadCheckpoint(dir_);
    EXPECT_FALSE(r.ok());
    return r.ok() ? "" : r.status().message();
  }

  // Rewrites model.safetensors after `edit` changes its tensors.
  template <typename F>
  void EditWeights(F edit) {
    const std::string path = dir_ + "/model.safetensors";
    SafetensorsFile f = ReadSafetensors(path).value();
    edit(f.tensors);
    ASSERT_TRUE(WriteSafetensors(path, f.tensors, f.metadata).ok());
  }

  fs::path root_;
  std::string dir_;
  Qwen3Model model_{nullptr};
  CharTokenizer tok_ = CharTokenizer::ForAlphabet("0123456789+-= ");
};

TEST_F(CheckpointTest, SaveThenLoadGivesIdenticalLogits) {
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
  Result<LoadedCheckpoint> ck = LoadCheckpoint(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE(at::equal(Logits(ck->model), Logits(model_)));
  EXPECT_EQ(ck->config.ToJson(), model_->config().ToJson());
  ASSERT_TRUE(ck->vocab.is_characters());
  EXPECT_EQ(ck->vocab.Encode("12+3=").value(), tok_.Encode("12+3=").value());
  EXPECT_EQ(ck->vocab.files().at("tokenizer.json"), tok_.ToJson().dump(2) + "\n");
  // The Hugging Face files and their checksums, and no temporary directory beside the checkpoint.
  std::vector<std::string> files, siblings;
  for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(root_)) siblings.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"checksums.json", "config.json", "generation_config.json",
                                             "model.safetensors", "tokenizer.json", "tokenizer_config.json"}));
  EXPECT_EQ(siblings, std::vector<std::string>{"ckpt"});
}

// Hugging Face's split of the weights: in order, a file filled until the next item would pass
// the bound, an item larger than the bound alone; one file is model.safetensors.
TEST(WeightsShardsTest, ItemsFillEachFileInOrderUpToTheBound) {
  const std::vector<WeightsShard> s = PlanWeightsShards({5, 5, 5, 20, 1}, 10);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].file, "model-00001-of-00004.safetensors");
  EXPECT_EQ(s[3].file, "model-00004-of-00004.safetensors");
  EXPECT_EQ(std::make_pair(s[0].first, s[0].end), std::make_pair(size_t{0}, size_t{2}));
  EXPECT_EQ(s[0].bytes, 10u);
  EXPECT_EQ(std::make_pair(s[1].first, s[1].end), std::make_pair(size_t{2}, size_t{3}));
  EXPECT_EQ(s[2].bytes, 20u);
  EXPECT_EQ(std::make_pair(s[3].first, s[3].end), std::make_pair(size_t{4}, size_t{5}));
  const std::vector<WeightsShard> one = PlanWeightsShards({5, 5}, 10);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].file, "model.safetensors");
  const nlohmann::json index = nlohmann::json::parse(WeightsIndex(s, {{"a"}, {"b"}, {"c", "d"}, {"e"}, {"f"}}));
  EXPECT_EQ(index["metadata"]["total_size"], 36);
  EXPECT_EQ(index["weight_map"]["d"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["f"], "model-00004-of-00004.safetensors");
}

// SaveCheckpoint with a shard bound: no model.safetensors, shards within the bound that hold
// every tensor once, the index naming each one's file and the total; checksums cover them all,
// and the checkpoint loads to the same logits.
TEST_F(CheckpointTest, ShardedWeightsFollowHuggingFacesLayoutAndLoadTheSame) {
  const uint64_t max = 20000;
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, Vocabulary::Characters(tok_.alphabet()), {}, max).ok());
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "model.safetensors"));
  const nlohmann::json index = nlohmann::json::parse(ReadFile(dir_ + "/model.safetensors.index.json").value());
  const std::map<std::string, at::Tensor> weights = model_->StorageStateDict();
  std::set<std::string> files, seen;
  uint64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GT(files.size(), 2u);
  for (const std::string& file : files) {
    SafetensorsFile f = ReadSafetensors(dir_ + "/" + file).value();
    uint64_t bytes = 0;
    for (const auto& [name, t] : f.tensors) {
      EXPECT_EQ(index["weight_map"][name], file);
      EXPECT_TRUE(seen.insert(name).second) << name;
      EXPECT_TRUE(at::equal(t, weights.at(name))) << name;
      bytes += static_cast<uint64_t>(t.nbytes());
    }
    EXPECT_TRUE(bytes <= max || f.tensors.size() == 1) << file << " " << bytes;
    total += bytes;
  }
  EXPECT_EQ(seen.size(), weights.size());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_TRUE(VerifyCheckpoint(dir_, /*required=*/true).ok());
  Result<LoadedCheckpoint> ck = LoadCheckpoint(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE(at::equal(Logits(ck->model), Logits(model_)));
}

TEST_F(CheckpointTest, SavingAgainReplacesTheOldCheckpointWhole) {
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
  fs::path stray = fs::path(dir_) / "stray.txt";
  ASSERT_TRUE(WriteFileAtomic(stray.string(), "from the old checkpoint").ok());
  Qwen3Model other(SmallConfig());
  other->InitWeights(22);
  ASSERT_TRUE(SaveCheckpoint(dir_ + "/", other, tok_).ok());
  Result<LoadedCheckpoint> ck = LoadCheckpoint(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE(at::equal(Logits(ck->model), Logits(other)));
  EXPECT_FALSE(at::equal(Logits(ck->model), Logits(model_)));
  EXPECT_FALSE(fs::exists(stray)) << "the directory is replaced, not merged";
  EXPECT_EQ(std::distance(fs::directory_iterator(root_), fs::directory_iterator()), 1);
}

TEST_F(CheckpointTest, TiedModelRoundTripsWithoutLmHead) {
  ModelConfig c = SmallConfig();
  c.tie_word_embeddings = true;
  Qwen3Model tied(c);
  tied->InitWeights(5);
  ASSERT_TRUE(SaveCheckpoint(dir_, tied, tok_).ok());
  EXPECT_EQ(ReadSafetensors(dir_ + "/model.safetensors").value().tensors.count("lm_head.weight"), 0u);
  Result<LoadedCheckpoint> ck = LoadCheckpoint(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE(at::equal(Logits(ck->model), Logits(tied)));
}

TEST_F(CheckpointTest, MissingFilesAreNamed) {
  EXPECT_NE(LoadError().find(dir_), std::string::npos) << "no directory yet";
  for (const char* name : {"tokenizer.json", "model.safetensors", "config.json"}) {
    ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
    ASSERT_TRUE(fs::remove(fs::path(dir_) / name));
    const std::string err = LoadError();
    EXPECT_NE(err.find(dir_ + "/" + name), std::string::npos) << err;
  }
}

TEST_F(CheckpointTest, TruncatedWeightsAreRejected) {
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
  const fs::path path = fs::path(dir_) / "model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 100);
  const std::string err = LoadError();
  EXPECT_NE(err.find(path.string()), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

// Checkpoints from elsewhere have no checksums.json; their contents are still checked.
TEST_F(CheckpointTest, WrongShapeAndMissingTensorAreNamed) {
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
  fs::remove(fs::path(dir_) / "checksums.json");
  EditWeights([](auto& t) { t["model.layers.1.self_attn.v_proj.weight"] = at::zeros({8, 32}); });
  std::string err = LoadError();
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.1.self_attn.v_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[8, 32]"), std::string::npos) << err;

  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
  fs::remove(fs::path(dir_) / "checksums.json");
  EditWeights([](auto& t) { t.erase("model.layers.0.mlp.down_proj.weight"); });
  err = LoadError();
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing tensor model.layers.0.mlp.down_proj.weight"), std::string::npos) << err;
}

TEST_F(CheckpointTest, BadConfigAndTokenizerAreNamed) {
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_).ok());
  fs::remove(fs::path(dir_) / "checksums.json");
  ASSERT_TRUE(
      WriteFileAtomic(dir_ + "/tokenizer.json", CharTokenizer::ForAlphabet("0123456789+-= abc").ToJson().dump()).ok());
  std::string err = LoadError();
  EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << err;
  EXPECT_NE(err.find("vocab_size is 17"), std::string::npos) << err;

  ASSERT_TRUE(WriteFileAtomic(dir_ + "/config.json", "{\"vocab_size\": 17").ok());
  err = LoadError();
  EXPECT_NE(err.find(dir_ + "/config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("JSON"), std::string::npos) << err;
}

TEST_F(CheckpointTest, ChecksumsCoverEveryFileAndRefuseAnyChange) {
  const CheckpointFiles extra = {{"trainer_state.json", "{\"version\": 3}\n"}, {"optimizer.safetensors", "0123"}};
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "trainer_state.json",
                           "optimizer.safetensors"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_, extra).ok());
    ASSERT_TRUE(VerifyCheckpoint(dir_, /*required=*/true).ok());
    const fs::path path = fs::path(dir_) / name;
    // One flipped bit: same size, different hash.
    std::string bytes = ReadFile(path.string()).value();
    bytes[bytes.size() / 2] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomic(path.string(), bytes).ok());
    Status st = VerifyCheckpoint(dir_, true);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(path.string()), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("corrupt"), std::string::npos) << st.message();
    EXPECT_NE(LoadError().find(path.string()), std::string::npos);
    // Truncated: named with both sizes.
    ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_, extra).ok());
    fs::resize_file(path, fs::file_size(path) - 1);
    st = VerifyCheckpoint(dir_, true);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(path.string()), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  }
  // Unfinished (no checksums.json) or damaged checksums.json.
  ASSERT_TRUE(SaveCheckpoint(dir_, model_, tok_, extra).ok());
  const fs::path sums = fs::path(dir_) / "checksums.json";
  const std::string text = ReadFile(sums.string()).value();
  ASSERT_TRUE(WriteFileAtomic(sums.string(), text.substr(0, text.size() / 2)).ok());
  Status st = VerifyCheckpoint(dir_, false);
  EXPECT_NE(st.message().find("checksums.json"), std::string::npos) << st.message();
  fs::remove(sums);
  EXPECT_TRUE(VerifyCheckpoint(dir_, false).ok());
  st = VerifyCheckpoint(dir_, true);
  EXPECT_NE(st.message().find("checksums.json is missing"), std::string::npos) << st.message();
  // Reserved or path-like extra names are refused.
  EXPECT_FALSE(SaveCheckpoint(dir_, model_, tok_, {{"checksums.json", "x"}}).ok());
  EXPECT_FALSE(SaveCheckpoint(dir_, model_, tok_, {{"../escape", "x"}}).ok());
}

TEST_F(CheckpointTest, FailedSaveLeavesNothingBehind) {
  const CharTokenizer too_big = CharTokenizer::ForAlphabet("0123456789+-= abcdef");
  Status st = SaveCheckpoint(dir_, model_, too_big);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(fs::exists(dir_));
  // A parent that is a regular file: the temporary directory cannot be created.
  ASSERT_TRUE(WriteFileAtomic((root_ / "file").string(), "x").ok());
  st = SaveCheckpoint((root_ / "file" / "ckpt").string(), model_, tok_);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("file/ckpt"), std::string::npos) << st.message();
  EXPECT_EQ(std::distance(fs::directory_iterator(root_), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace echelon::model
