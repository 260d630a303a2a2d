// LoRA adapters on the decoder (model/model_config.h LoraConfig): the adapted projections
// compute what the merged weights W + (alpha / rank) B A compute, fresh adapters leave the base
// as it is, and the config round-trips through config.json with clear errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "echelon/model/generate.h"
#include "echelon/model/qwen3.h"
#include "echelon/model/testing.h"

namespace echelon::model {
namespace {

ModelConfig WithAdapters(ModelConfig c, int64_t rank, std::vector<std::string> targets = kLoraTargets) {
  c.lora.rank = rank;
  c.lora.alpha = 8;
  c.lora.targets = std::move(targets);
  return c;
}

// The adapted model's weights merged into a plain model of the base config.
Qwen3Model Merged(const Qwen3Model& adapted, const ModelConfig& base) {
  const std::map<std::string, at::Tensor> all = adapted->StateDict();
  std::map<std::string, at::Tensor> w;
  for (const auto& [name, t] : all)
    if (!IsLoraTensor(name)) w[name] = t.clone();
  const double scale = adapted->config().lora.scale();
  int merged = 0;
  for (const auto& [name, a] : all) {
    const std::string suffix = ".lora_A.weight";
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string stem = name.substr(0, name.size() - suffix.size());
    w[stem + ".weight"] += scale * at::matmul(all.at(stem + ".lora_B.weight"), a);
    ++merged;
  }
  EXPECT_GT(merged, 0);
  Qwen3Model m(base);
  EXPECT_TRUE(m->LoadStateDict(w, "merged").ok());
  return m;
}

// Every projection adapted, B drawn away from zero: the logits of a full forward and a
// cached, token-by-token greedy decode equal those of the merged weights (dense, and MoE with
// its dense layer's MLP adapted and the experts not); MergeLora gives those merged weights.
TEST(Lora, AdaptersComputeTheMergedWeights) {
  const ModelConfig dense = TinyTestConfig(/*vocab=*/40, /*hidden=*/32);
  for (const ModelConfig& base : {dense, AsTinyMoe(dense, 16, 0)}) {
    Qwen3Model adapted(WithAdapters(base, 4));
    adapted->InitWeights(3);
    {
      at::NoGradGuard no_grad;
      for (auto& [name, t] : adapted->AdapterStateDict())
        if (name.find("lora_B") != std::string::npos) t.normal_(0.0, 0.05);
    }
    Qwen3Model merged = Merged(adapted, base);
    const std::map<std::string, at::Tensor> before = Merged(adapted, base)->StateDict();
    Result<Qwen3Model> library = MergeLora(adapted);
    ASSERT_TRUE(library.ok()) << library.status().message();
    EXPECT_FALSE(library.value()->config().lora.on());
    EXPECT_EQ(library.value()->StateDict().size(), merged->StateDict().size());
    for (const auto& [name, t] : merged->StateDict())
      EXPECT_LT((t - library.value()->StateDict().at(name)).abs().max().item<double>(), 1e-6) << name;
    for (const auto& [name, t] : Merged(adapted, base)->StateDict())
      EXPECT_TRUE(at::equal(t, before.at(name))) << "merging left the adapted model as it was: " << name;
    const at::Tensor ids = at::randint(3, 40, {2, 9}, at::kLong);
    const at::Tensor pos = at::arange(9, at::kLong).unsqueeze(0).expand({2, 9});
    at::NoGradGuard no_grad;
    const at::Tensor a = adapted->Forward(ids, pos, at::Tensor(), nullptr);
    const at::Tensor m = merged->Forward(ids, pos, at::Tensor(), nullptr);
    EXPECT_LT((a - m).abs().max().item<double>(), 1e-5) << base.model_type;
    // The adapters matter: the base alone computes something else.
    Qwen3Model plain(base);
    std::map<std::string, at::Tensor> w;
    for (const auto& [name, t] : adapted->StateDict())
      if (!IsLoraTensor(name)) w[name] = t;
    ASSERT_TRUE(plain->LoadStateDict(w, "base").ok());
    EXPECT_GT((a - plain->Forward(ids, pos, at::Tensor(), nullptr)).abs().max().item<double>(), 1e-3);
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_new_tokens = 6;
    const std::vector<std::vector<int64_t>> prompts = {{1, 5, 7}, {1, 9, 9, 9}};
    const std::vector<Completion> ca = Generate(adapted, prompts, sp), cm = Generate(merged, prompts, sp);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(ca[i].tokens, cm[i].tokens);
      for (size_t k = 0; k < ca[i].logprobs.size() && k < cm[i].logprobs.size(); ++k)
        EXPECT_NEAR(ca[i].logprobs[k], cm[i].logprobs[k], 1e-4);
    }
  }
}

// WithLora adds adapters whose B is zero: the model computes its base's logits to the bit,
// carries the base's weights, and holds A and B of each target of every layer.
TEST(Lora, FreshAdaptersComputeTheBase) {
  const ModelConfig c = TinyTestConfig(40, 32);
  Qwen3Model base(c);
  base->InitWeights(9);
  Result<Qwen3Model> adapted = WithLora(base, WithAdapters(c, 2, {"q_proj", "down_proj"}).lora, 4);
  ASSERT_TRUE(adapted.ok()) << adapted.status().message();
  EXPECT_EQ(adapted.value()->AdapterStateDict().size(), 2u * 2u * 2u);  // 2 layers x 2 targets x {A, B}
  EXPECT_EQ(adapted.value()->AdapterStateDict().at("model.layers.1.mlp.down_proj.lora_B.weight").sizes(),
            (std::vector<int64_t>{32, 2}));
  const at::Tensor ids = at::randint(3, 40, {1, 7}, at::kLong);
  const at::Tensor pos = at::arange(7, at::kLong).unsqueeze(0);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(base->Forward(ids, pos, at::Tensor(), nullptr),
                        adapted.value()->Forward(ids, pos, at::Tensor(), nullptr)));
  EXPECT_FALSE(WithLora(adapted.value(), adapted.value()->config().lora, 4).ok()) << "adapters twice";
}

TEST(Lora, ConfigRoundTripsAndNamesWhatIsWrong) {
  ModelConfig c = WithAdapters(TinyTestConfig(40, 32), 8, {"q_proj", "v_proj"});
  Result<ModelConfig> back = ModelConfig::FromJson(c.ToJson(), "config.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->lora == c.lora);
  EXPECT_FALSE(TinyTestConfig(40, 32).ToJson().contains("echelon_lora")) << "a plain model's config.json is HF's";

  Result<std::vector<std::string>> t = ParseLoraTargets(" q_proj, up_proj ,q_proj");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value(), (std::vector<std::string>{"q_proj", "up_proj"}));
  EXPECT_NE(ParseLoraTargets("q_proj,qkv").status().message().find("\"qkv\""), std::string::npos);
  EXPECT_FALSE(ParseLoraTargets(" , ").ok());

  nlohmann::json j = c.ToJson();
  j["echelon_lora"]["targets"] = {"lm_head"};
  EXPECT_NE(ModelConfig::FromJson(j, "c.json").status().message().find("lm_head"), std::string::npos);
  j["echelon_lora"] = "rank 8";
  EXPECT_NE(ModelConfig::FromJson(j, "c.json").status().message().find("echelon_lora"), std::string::npos);
  // Every layer sparse: MLP targets would adapt nothing.
  ModelConfig moe = AsTinyMoe(TinyTestConfig(40, 32), 16, 0);
  moe.mlp_only_layers.clear();
  moe.lora = WithAdapters(moe, 4, {"q_proj", "up_proj"}).lora;
  EXPECT_NE(moe.Validate().message().find("up_proj"), std::string::npos);
  moe.lora.targets = {"q_proj"};
  EXPECT_TRUE(moe.Validate().ok());
}

}  // namespace
}  // namespace echelon::model
