// The decoder against golden logits from an independent PyTorch implementation of HF Qwen3
// (tests/data/model/*/golden_logits.json; see tests/data/model/README.md), plus the
// properties the learner and sampler rely on.
#include "echelon/model/qwen3.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <set>

#include "echelon/common/fs.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/testing.h"

namespace echelon::model {
namespace {

const std::string kData = std::string(ECHELON_TEST_DATA) + "/model/";

ModelConfig TinyConfig(bool tied) {
  ModelConfig c;
  c.vocab_size = 23;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;  // deliberately != hidden / heads
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  return c;
}

// Random weights with norm weights away from 1, so a skipped or misplaced norm shows.
Qwen3Model TinyModel(bool tied, uint64_t seed) {
  Qwen3Model m(TinyConfig(tied));
  m->InitWeights(seed);
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 100);
  for (auto& p : m->parameters()) p.normal_(0.0, p.dim() == 1 ? 0.5 : 0.3, gen).add_(p.dim() == 1 ? 1.0 : 0.0);
  return m;
}

at::Tensor Positions(int64_t batch, int64_t len) { return at::arange(len, at::kLong).expand({batch, len}); }

double MaxDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

Qwen3Model LoadReference(const std::string& name) {
  Result<std::string> text = ReadFile(kData + name + "/config.json");
  EXPECT_TRUE(text.ok()) << text.status().message();
  Result<ModelConfig> cfg = ModelConfig::FromJsonText(text.value(), name + "/config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  Result<SafetensorsFile> st = ReadSafetensors(kData + name + "/model.safetensors");
  EXPECT_TRUE(st.ok()) << st.status().message();
  Qwen3Model m(cfg.value());
  Status loaded = m->LoadStateDict(st->tensors, name);
  EXPECT_TRUE(loaded.ok()) << loaded.message();
  return m;
}

void ExpectMatchesGolden(const std::string& name) {
  Qwen3Model m = LoadReference(name);
  nlohmann::json golden = nlohmann::json::parse(ReadFile(kData + name + "/golden_logits.json").value());
  ASSERT_GE(golden.size(), 3u);
  for (const auto& g : golden) {
    const auto ids_vec = g["ids"].get<std::vector<int64_t>>();
    const auto rows = g["logits"].get<std::vector<std::vector<float>>>();
    const int64_t len = static_cast<int64_t>(ids_vec.size());
    at::Tensor expected = at::empty({len, m->config().vocab_size}, at::kFloat);
    for (int64_t t = 0; t < len; ++t) {
      expected[t].copy_(at::tensor(rows[static_cast<size_t>(t)], at::kFloat));
    }
    at::Tensor ids = at::tensor(ids_vec, at::kLong).unsqueeze(0);
    at::Tensor logits = m->Forward(ids, Positions(1, len), at::Tensor(), nullptr)[0];
    EXPECT_LT(MaxDiff(logits, expected), 1e-4) << name << " ids " << g["ids"].dump();
    EXPECT_GT(expected.abs().max().item<double>(), 1.0) << "golden logits should not be trivially small";
  }
}

TEST(Qwen3GoldenTest, Bf16UntiedCheckpointMatchesReference) { ExpectMatchesGolden("qwen3_bf16"); }
TEST(Qwen3GoldenTest, TiedCheckpointWithWideHeadsMatchesReference) { ExpectMatchesGolden("qwen3_tied"); }
// 6 experts, top-2 renormalised, layer 1 dense (mlp_only_layers), F32, untied.
TEST(Qwen3GoldenTest, MoeF32CheckpointMatchesReference) { ExpectMatchesGolden("qwen3_moe_f32"); }
// 4 experts, top-3 not renormalised, decoder_sparse_step 2 (layer 0 dense), BF16, tied.
TEST(Qwen3GoldenTest, MoeBf16CheckpointMatchesReference) { ExpectMatchesGolden("qwen3_moe_bf16"); }

// A tiny Qwen3-MoE: 4 experts, top-2, layer 0 sparse and layer 1 dense (mlp_only_layers).
ModelConfig TinyMoeConfig() { return AsTinyMoe(TinyConfig(false), 24, 1); }

TEST(Qwen3MoeTest, ParametersHaveHuggingFaceNamesAndTheCountMatches) {
  Qwen3Model m(TinyMoeConfig());
  const auto sd = m->StateDict();
  EXPECT_EQ(sd.at("model.layers.0.mlp.gate.weight").sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(sd.at("model.layers.0.mlp.experts.3.gate_proj.weight").sizes(), (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(sd.at("model.layers.0.mlp.experts.3.down_proj.weight").sizes(), (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(sd.count("model.layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(sd.at("model.layers.1.mlp.gate_proj.weight").sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(sd.count("model.layers.1.mlp.gate.weight"), 0u);
  int64_t total = 0;
  for (const auto& p : m->parameters()) total += p.numel();
  EXPECT_EQ(total, TinyMoeConfig().NumParameters());
  // Active: 2 of the 4 experts of layer 0 (each 3 * 32 * 24).
  EXPECT_EQ(TinyMoeConfig().NumParameters() - TinyMoeConfig().NumActiveParameters(), 2 * 3 * 32 * 24);
}

TEST(Qwen3MoeTest, GradientsReachTheRouterAndEveryRoutedExpert) {
  Qwen3Model m(TinyMoeConfig());
  m->InitWeights(3);
  at::Tensor ids = at::randint(23, {4, 9}, at::kLong);
  at::Tensor logits = m->Forward(ids.narrow(1, 0, 8), Positions(4, 8), at::Tensor(), nullptr);
  at::cross_entropy_loss(logits.reshape({-1, 23}), ids.narrow(1, 1, 8).reshape({-1})).backward();
  const at::Tensor load = m->TakeRouterLoad();
  ASSERT_EQ(load.sizes(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(load.sum().item<int64_t>(), 4 * 8 * 2);  // every token, top-2
  for (const auto& item : m->named_parameters()) {
    const std::string& name = item.key();
    const size_t at = name.find("experts.");
    if (at != std::string::npos && load[0][std::stoi(name.substr(at + 8))].item<int64_t>() == 0) continue;
    ASSERT_TRUE(item.value().grad().defined()) << name;
    EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0.0) << name;
  }
  EXPECT_EQ(m->TakeRouterLoad().sum().item<int64_t>(), 0) << "taking the load resets it";
  Qwen3Model dense(TinyConfig(false));
  EXPECT_EQ(dense->TakeRouterLoad().numel(), 0);
}

// The expert dispatch against a per-token loop: with o_proj zeroed the attention adds nothing,
// so the one layer's MLP input is RMSNorm(embedding) and the logits follow by hand.
TEST(Qwen3MoeTest, ExpertsEqualAPerTokenLoop) {
  ModelConfig c = TinyMoeConfig();
  c.mlp_only_layers = {};
  c.num_hidden_layers = 1;
  c.tie_word_embeddings = true;
  for (bool norm : {true, false}) {
    c.norm_topk_prob = norm;
    Qwen3Model m(c);
    m->InitWeights(9);
    auto sd = m->StateDict();
    {
      at::NoGradGuard no_grad;
      sd.at("model.layers.0.mlp.gate.weight").mul_(20);  // routing far from ties
      sd.at("model.layers.0.self_attn.o_proj.weight").zero_();
    }
    const at::Tensor ids = at::randint(23, {3, 6}, at::kLong);
    const at::Tensor logits = m->Forward(ids, Positions(3, 6), at::Tensor(), nullptr);
    auto rms = [&](const at::Tensor& x) { return x * at::rsqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps); };
    const at::Tensor embed = sd.at("model.embed_tokens.weight");
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t t = 0; t < 6; ++t) {
        const at::Tensor x = embed[ids[b][t].item<int64_t>()];
        const at::Tensor h = rms(x) * sd.at("model.layers.0.post_attention_layernorm.weight");
        const at::Tensor probs = at::softmax(at::mv(sd.at("model.layers.0.mlp.gate.weight"), h), 0);
        auto [w, top] = probs.topk(2);
        if (norm) w = w / w.sum();
        at::Tensor y = at::zeros_like(x);
        for (int64_t s = 0; s < 2; ++s) {
          const std::string e = "model.layers.0.mlp.experts." + std::to_string(top[s].item<int64_t>()) + ".";
          const at::Tensor inner = at::silu(at::mv(sd.at(e + "gate_proj.weight"), h)) * at::mv(sd.at(e + "up_proj.weight"), h);
          y = y + w[s] * at::mv(sd.at(e + "down_proj.weight"), inner);
        }
        const at::Tensor expected = at::mv(embed, rms(x + y) * sd.at("model.norm.weight"));
        EXPECT_LT(MaxDiff(logits[b][t], expected), 1e-4) << "norm_topk_prob=" << norm << " b=" << b << " t=" << t;
      }
    }
  }
}

// The load-balancing loss by hand, on the same o_proj-zeroed layer as above.
TEST(Qwen3MoeTest, RouterAuxLossEqualsTheSwitchLossByHand) {
  ModelConfig c = TinyMoeConfig();
  c.mlp_only_layers = {};
  c.num_hidden_layers = 1;
  c.tie_word_embeddings = true;
  Qwen3Model m(c);
  m->InitWeights(9);
  auto sd = m->StateDict();
  {
    at::NoGradGuard no_grad;
    sd.at("model.layers.0.mlp.gate.weight").mul_(20);
    sd.at("model.layers.0.self_attn.o_proj.weight").zero_();
  }
  const at::Tensor ids = at::randint(23, {2, 7}, at::kLong);
  EXPECT_FALSE(m->TakeRouterAuxLoss().defined()) << "nothing recorded";
  m->RecordRouting(true);
  (void)m->Forward(ids, Positions(2, 7), at::Tensor(), nullptr);
  m->RecordRouting(false);
  const at::Tensor aux = m->TakeRouterAuxLoss();
  ASSERT_TRUE(aux.defined());
  at::Tensor share = at::zeros({2, 4}, at::kDouble), mean_prob = at::zeros({4}, at::kDouble);
  const at::Tensor embed = sd.at("model.embed_tokens.weight").detach();
  for (int64_t i = 0; i < 14; ++i) {
    const at::Tensor x = embed[ids.view({-1})[i].item<int64_t>()];
    const at::Tensor h = x * at::rsqrt(x.pow(2).mean() + c.rms_norm_eps) * sd.at("model.layers.0.post_attention_layernorm.weight").detach();
    const at::Tensor probs = at::softmax(at::mv(sd.at("model.layers.0.mlp.gate.weight").detach(), h), 0);
    const at::Tensor top = std::get<1>(probs.topk(2));
    for (int64_t s = 0; s < 2; ++s) share[s][top[s].item<int64_t>()] += 1.0 / 14;
    mean_prob += probs.to(at::kDouble) / 14;
  }
  EXPECT_NEAR(aux.item<double>(), 4 * (share * mean_prob.unsqueeze(0)).sum().item<double>(), 1e-5);
  aux.backward();
  const at::Tensor router_grad = m->named_parameters()["model.layers.0.mlp.gate.weight"].grad();
  ASSERT_TRUE(router_grad.defined());
  EXPECT_GT(router_grad.abs().sum().item<double>(), 0);
  EXPECT_FALSE(m->TakeRouterAuxLoss().defined()) << "taking clears";
  // A uniform router: every probability 1/X, so the loss is k whatever the choices.
  {
    at::NoGradGuard no_grad;
    sd.at("model.layers.0.mlp.gate.weight").zero_();
  }
  m->RecordRouting(true);
  (void)m->Forward(ids, Positions(2, 7), at::Tensor(), nullptr);
  EXPECT_NEAR(m->TakeRouterAuxLoss().item<double>(), 2.0, 1e-6);
}

TEST(Qwen3MoeTest, SaveLoadIsIdenticalAndConfigRoundTrips) {
  const ModelConfig c = TinyMoeConfig();
  Result<ModelConfig> back = ModelConfig::FromJson(c.ToJson(), "rt");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), c.ToJson());
  EXPECT_EQ(back->ToJson()["architectures"][0], "Qwen3MoeForCausalLM");
  Qwen3Model a(c), b(back.value());
  a->InitWeights(4);
  ASSERT_TRUE(b->LoadStateDict(a->StorageStateDict(), "a").ok());
  for (const auto& [name, t] : a->StateDict()) EXPECT_TRUE(at::equal(t, b->StateDict().at(name))) << name;
  const at::Tensor ids = at::randint(23, {2, 5}, at::kLong);
  EXPECT_TRUE(at::equal(a->Forward(ids, Positions(2, 5), at::Tensor(), nullptr),
                        b->Forward(ids, Positions(2, 5), at::Tensor(), nullptr)));
}

TEST(Qwen3Test, ParametersHaveHuggingFaceNames) {
  Qwen3Model untied(TinyConfig(false));
  std::set<std::string> names;
  for (const auto& item : untied->named_parameters()) names.insert(item.key());
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* s : {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                          "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      expected.insert(p + s + ".weight");
    }
  }
  EXPECT_EQ(names, expected);
  int64_t total = 0;
  for (const auto& p : untied->parameters()) total += p.numel();
  EXPECT_EQ(total, TinyConfig(false).NumParameters());

  Qwen3Model tied(TinyConfig(true));
  const auto sd = tied->StateDict();
  EXPECT_EQ(sd.count("lm_head.weight"), 0u);
  EXPECT_EQ(sd.size(), expected.size() - 1);
  EXPECT_EQ(static_cast<int64_t>(tied->parameters().size()), static_cast<int64_t>(expected.size()) - 1);
  EXPECT_EQ(sd.at("model.layers.1.self_attn.q_proj.weight").sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(sd.at("model.layers.1.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{32, 32}));
}

TEST(Qwen3Test, GradientsReachEveryParameterAndADescentStepLowersTheLoss) {
  for (bool tied : {false, true}) {
    Qwen3Model m = TinyModel(tied, 5);
    at::Tensor ids = at::randint(23, {3, 7}, at::kLong);
    auto loss_fn = [&] {
      at::Tensor logits = m->Forward(ids.narrow(1, 0, 6), Positions(3, 6), at::Tensor(), nullptr);
      return at::cross_entropy_loss(logits.reshape({-1, 23}), ids.narrow(1, 1, 6).reshape({-1}));
    };
    at::Tensor loss = loss_fn();
    loss.backward();
    for (const auto& item : m->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0.0) << item.key();
    }
    {
      at::NoGradGuard no_grad;
      for (auto& p : m->parameters()) p.sub_(p.grad() * 0.05);
    }
    EXPECT_LT(loss_fn().item<double>(), loss.item<double>()) << "tied=" << tied;
  }
}

TEST(Qwen3Test, LeftPaddedBatchEqualsPerRowForward) {
  Qwen3Model m = TinyModel(false, 1);
  const std::vector<std::vector<int64_t>> rows = {{3, 9, 4}, {1, 2, 3, 4, 5, 6, 7}, {11}, {5, 5, 6, 22, 0}};
  const int64_t width = 7;
  at::Tensor ids = at::zeros({4, width}, at::kLong);
  at::Tensor valid = at::zeros({4, width}, at::kBool);
  for (int64_t r = 0; r < 4; ++r) {
    const auto& row = rows[static_cast<size_t>(r)];
    const int64_t pad = width - static_cast<int64_t>(row.size());
    ids[r].narrow(0, pad, static_cast<int64_t>(row.size())).copy_(at::tensor(row, at::kLong));
    valid[r].narrow(0, pad, static_cast<int64_t>(row.size())).fill_(true);
  }
  at::Tensor positions = (valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  at::Tensor padded = m->Forward(ids, positions, valid, nullptr);
  for (int64_t r = 0; r < 4; ++r) {
    const auto& row = rows[static_cast<size_t>(r)];
    const int64_t len = static_cast<int64_t>(row.size());
    at::Tensor alone = m->Forward(at::tensor(row, at::kLong).unsqueeze(0), Positions(1, len), at::Tensor(), nullptr)[0];
    EXPECT_LT(MaxDiff(padded[r].narrow(0, width - len, len), alone), 1e-5) << "row " << r;
  }
}

// Sequences back to back in packed rows (positions restarting, attention kept inside each
// segment, trailing padding): each sequence's logits and gradients equal its own forward's.
TEST(Qwen3Test, PackedRowsEqualPerSequenceForward) {
  Qwen3Model m = TinyModel(false, 3);
  const std::vector<std::vector<int64_t>> seqs = {{3, 9, 4}, {1, 2, 3, 4, 5, 6, 7}, {11}, {5, 5, 6, 22, 0}, {8, 8}};
  // Row 0: seqs 1, 0 (10 positions); row 1: seqs 3, 4, 2, then two padding positions.
  const std::vector<std::vector<size_t>> rows = {{1, 0}, {3, 4, 2}};
  const int64_t width = 10;
  at::Tensor ids = at::zeros({2, width}, at::kLong), positions = at::zeros({2, width}, at::kLong);
  at::Tensor segments = at::full({2, width}, -1, at::kLong);
  std::vector<std::pair<int64_t, int64_t>> where(seqs.size());  // (row, offset)
  for (int64_t r = 0; r < 2; ++r) {
    int64_t offset = 0;
    for (size_t i : rows[static_cast<size_t>(r)]) {
      const int64_t len = static_cast<int64_t>(seqs[i].size());
      ids[r].narrow(0, offset, len).copy_(at::tensor(seqs[i], at::kLong));
      positions[r].narrow(0, offset, len).copy_(at::arange(len, at::kLong));
      segments[r].narrow(0, offset, len).fill_(static_cast<int64_t>(i));
      where[i] = {r, offset};
      offset += len;
    }
  }
  at::Tensor packed = m->ForwardPacked(ids, positions, segments);
  // One scalar through every sequence's logits, so the gradients of all weights are compared.
  const at::Tensor weights = at::randn({2, width, 23});
  std::vector<at::Tensor> params = m->parameters();
  at::Tensor packed_loss = at::zeros({});
  at::Tensor alone_loss = at::zeros({});
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t len = static_cast<int64_t>(seqs[i].size());
    const auto [r, offset] = where[i];
    at::Tensor alone = m->Forward(at::tensor(seqs[i], at::kLong).unsqueeze(0), Positions(1, len), at::Tensor(), nullptr)[0];
    EXPECT_LT(MaxDiff(packed[r].narrow(0, offset, len), alone), 1e-5) << "sequence " << i;
    const at::Tensor w = weights[r].narrow(0, offset, len);
    packed_loss = packed_loss + (packed[r].narrow(0, offset, len) * w).sum();
    alone_loss = alone_loss + (alone * w).sum();
  }
  const std::vector<at::Tensor> g_packed = torch::autograd::grad({packed_loss}, params);
  const std::vector<at::Tensor> g_alone = torch::autograd::grad({alone_loss}, params);
  for (size_t p = 0; p < params.size(); ++p)
    EXPECT_LT(MaxDiff(g_packed[p], g_alone[p]), 1e-4 * std::max(1.0, g_alone[p].abs().max().item<double>()))
        << "parameter " << p;
  EXPECT_FALSE(packed.isnan().any().item<bool>()) << "padding positions stay finite";
  EXPECT_THROW(m->ForwardPacked(ids, positions, segments.narrow(1, 0, 4)), c10::Error);
}

TEST(Qwen3Test, IncrementalCacheEqualsFullForward) {
  Qwen3Model m = TinyModel(true, 2);
  at::Tensor ids = at::randint(23, {2, 9}, at::kLong);
  at::Tensor full = m->Forward(ids, Positions(2, 9), at::Tensor(), nullptr);
  KVCache cache = m->NewCache(2, 9, /*block=*/4);
  at::NoGradGuard no_grad;
  at::Tensor first = m->Forward(ids.narrow(1, 0, 5), Positions(2, 5), at::Tensor(), &cache);
  EXPECT_EQ(cache.length, 5);
  EXPECT_EQ(cache.capacity(), 8) << "two blocks of 4 hold 5 columns; no more";
  EXPECT_LT(MaxDiff(first, full.narrow(1, 0, 5)), 1e-5);
  for (int64_t t = 5; t < 9; ++t) {
    at::Tensor step = m->Forward(ids.narrow(1, t, 1), at::full({2, 1}, t, at::kLong), at::Tensor(), &cache);
    EXPECT_LT(MaxDiff(step.select(1, 0), full.select(1, t)), 1e-5) << "step " << t;
  }
  EXPECT_EQ(cache.length, 9);
  EXPECT_EQ(cache.capacity(), 12);
  EXPECT_THROW(m->Forward(ids.narrow(1, 0, 1), Positions(2, 1), at::Tensor(), &cache), c10::Error)
      << "writing past the cache capacity must fail loudly";
}

// A cache whose limit is below a block holds one block of exactly its limit: the engine's cache
// of a few tokens per slot must not take 256 columns per slot (the generation benchmark of 256
// short rows lost 40% of its speed to zeroing them).
TEST(Qwen3Test, AShortCacheHoldsOneBlockOfItsLimit) {
  Qwen3Model m = TinyModel(true, 2);
  KVCache cache = m->NewCache(3, 9);
  cache.Reserve(1);
  EXPECT_EQ(cache.capacity(), 9);
  EXPECT_EQ(cache.k(0).size(), 1u);
  EXPECT_EQ(cache.k(0)[0].size(2), 9);
  EXPECT_THROW(cache.Reserve(10), c10::Error);
}

// Rows of different lengths in one cache (a length per row), decoding side by side: each
// row's logits equal its own full forward.
TEST(Qwen3Test, PerRowCacheLengthsEqualFullForwardPerRow) {
  Qwen3Model m = TinyModel(true, 2);
  at::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(23, {3, 9}, at::kLong);
  const std::vector<int64_t> filled = {2, 6, 0};  // tokens already cached per row
  KVCache cache = m->NewCache(3, 10, /*block=*/4);  // rows cross blocks as they grow
  cache.row_lengths = {0, 0, 0};
  cache.Reserve(6);
  for (int64_t r = 0; r < 3; ++r) {
    if (filled[r] == 0) continue;
    KVCache row = cache.Rows(r, 1);
    m->Forward(ids[r].narrow(0, 0, filled[r]).unsqueeze(0), Positions(1, filled[r]), at::Tensor(), &row);
    cache.row_lengths[static_cast<size_t>(r)] = filled[r];
  }
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<int64_t> next, pos;
    for (int64_t r = 0; r < 3; ++r) {
      next.push_back(ids[r][filled[r] + step].item<int64_t>());
      pos.push_back(filled[r] + step);
    }
    const at::Tensor logits = m->Forward(at::tensor(next, at::kLong).unsqueeze(1), at::tensor(pos, at::kLong).unsqueeze(1),
                                         at::Tensor(), &cache);
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t len = filled[r] + step + 1;
      const at::Tensor full = m->Forward(ids[r].narrow(0, 0, len).unsqueeze(0), Positions(1, len), at::Tensor(), nullptr);
      EXPECT_LT(MaxDiff(logits[r][0], full[0][len - 1]), 1e-5) << "row " << r << " step " << step;
    }
  }
  EXPECT_EQ(cache.row_lengths, (std::vector<int64_t>{5, 9, 3}));
  EXPECT_THROW(m->Forward(at::zeros({3, 2}, at::kLong), at::zeros({3, 2}, at::kLong), at::Tensor(), &cache), c10::Error)
      << "row 1 would pass the capacity";
}

TEST(Qwen3Test, LoadStateDictRejectsMissingMisshapenAndExtraTensors) {
  Qwen3Model m = TinyModel(false, 3);
  const at::Tensor before = m->StateDict().at("model.norm.weight").clone();
  auto weights = TinyModel(false, 4)->StateDict();

  auto missing = weights;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  Status st = m->LoadStateDict(missing, "w.safetensors");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("w.safetensors"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << st.message();

  auto misshapen = weights;
  misshapen["model.layers.0.self_attn.k_proj.weight"] = at::zeros({16, 32});
  st = m->LoadStateDict(misshapen, "w.safetensors");
  EXPECT_NE(st.message().find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[16, 32]"), std::string::npos) << st.message();

  auto extra = weights;
  extra["model.layers.2.mlp.up_proj.weight"] = at::zeros({48, 32});
  st = m->LoadStateDict(extra, "w.safetensors");
  EXPECT_NE(st.message().find("unexpected tensor model.layers.2.mlp.up_proj.weight"), std::string::npos)
      << st.message();
  EXPECT_TRUE(at::equal(m->StateDict().at("model.norm.weight"), before)) << "failed loads must not change weights";

  auto ints = weights;
  ints["model.norm.weight"] = at::zeros({32}, at::kLong);
  EXPECT_FALSE(m->LoadStateDict(ints, "w").ok());

  // Converts dtypes; a tied model ignores an lm_head.weight in the file.
  auto bf16 = weights;
  for (auto& [name, t] : bf16) t = t.to(at::kBFloat16);
  ASSERT_TRUE(m->LoadStateDict(bf16, "w").ok());
  EXPECT_TRUE(at::equal(m->StateDict().at("model.norm.weight"), bf16.at("model.norm.weight").to(at::kFloat)));
  Qwen3Model tied(TinyConfig(true));
  auto with_head = TinyModel(true, 4)->StateDict();
  with_head["lm_head.weight"] = at::zeros({23, 32});
  EXPECT_TRUE(tied->LoadStateDict(with_head, "w").ok());
}

TEST(Qwen3Test, InitWeightsIsDeterministicPerSeed) {
  Qwen3Model a(TinyConfig(false)), b(TinyConfig(false));
  a->InitWeights(11);
  b->InitWeights(11);
  for (const auto& [name, t] : a->StateDict()) EXPECT_TRUE(at::equal(t, b->StateDict().at(name))) << name;
  b->InitWeights(12);
  EXPECT_FALSE(at::equal(a->StateDict().at("lm_head.weight"), b->StateDict().at("lm_head.weight")));
  EXPECT_TRUE(at::equal(a->StateDict().at("model.layers.0.self_attn.q_norm.weight"), at::ones({16})));
  const double sd = a->StateDict().at("model.embed_tokens.weight").std().item<double>();
  EXPECT_NEAR(sd, 0.02, 0.005);
}

// --- ModelConfig (config.json) ---

TEST(ModelConfigTest, ReadsReferenceConfigAndIgnoresUnknownFields) {
  Result<ModelConfig> c =
      ModelConfig::FromJsonText(ReadFile(kData + "qwen3_tied/config.json").value(), "tied/config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->eos_token_id, -1);
}

TEST(ModelConfigTest, MissingRequiredFieldNamesFileAndField) {
  nlohmann::json j = TinyConfig(false).ToJson();
  j.erase("intermediate_size");
  Result<ModelConfig> c = ModelConfig::FromJson(j, "ck/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("ck/config.json"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("intermediate_size"), std::string::npos) << c.status().message();
  j = TinyConfig(false).ToJson();
  j["hidden_size"] = "32";
  c = ModelConfig::FromJson(j, "ck/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos) << c.status().message();
  EXPECT_FALSE(ModelConfig::FromJsonText("{", "x").ok());
}

TEST(ModelConfigTest, AppliesHuggingFaceDefaults) {
  nlohmann::json j = {{"vocab_size", 10},       {"hidden_size", 256},       {"intermediate_size", 64},
                      {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"eos_token_id", {7, 8}}};
  Result<ModelConfig> c = ModelConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->head_dim, 128);  // Qwen3Config default, not 256 / 4
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_id, 7);
}

TEST(ModelConfigTest, RejectsInconsistentOrUnsupportedConfigs) {
  auto bad = [](const char* field, const nlohmann::json& value) {
    nlohmann::json j = TinyConfig(false).ToJson();
    j[field] = value;
    Result<ModelConfig> c = ModelConfig::FromJson(j, "c.json");
    EXPECT_FALSE(c.ok()) << field;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status().message();
    }
  };
  bad("num_key_value_heads", 3);
  bad("head_dim", 15);
  bad("attention_bias", "yes");
  bad("rope_scaling", {{"rope_type", "yarn"}});
  bad("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}});
  bad("model_type", "gpt2");
  bad("hidden_act", "gelu");
  bad("vocab_size", 0);
  auto bad_moe = [](const char* field, const nlohmann::json& value) {
    nlohmann::json j = TinyMoeConfig().ToJson();
    j[field] = value;
    Result<ModelConfig> c = ModelConfig::FromJson(j, "moe.json");
    EXPECT_FALSE(c.ok()) << field;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status().message();
    }
  };
  bad_moe("num_experts_per_tok", 5);
  bad_moe("num_experts_per_tok", 0);
  bad_moe("num_experts", 0);
  bad_moe("moe_intermediate_size", 0);
  bad_moe("decoder_sparse_step", 0);
  bad_moe("mlp_only_layers", {2});
  bad_moe("mlp_only_layers", "1");
}

// is_sparse on a config not yet validated divided by decoder_sparse_step (SIGFPE at 0).
TEST(ModelConfigTest, IsSparseWithAZeroSparseStepIsFalseNotADivisionByZero) {
  ModelConfig c = TinyMoeConfig();
  c.decoder_sparse_step = 0;
  EXPECT_FALSE(c.is_sparse(0));
  EXPECT_FALSE(c.Validate().ok());
}

TEST(ModelConfigTest, MoeDefaultsAreQwen3MoeConfigs) {
  nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"vocab_size", 10}, {"hidden_size", 64},
                      {"intermediate_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                      {"decoder_sparse_step", 2}, {"mlp_only_layers", {3}}};
  Result<ModelConfig> c = ModelConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "qwen3_moe");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_TRUE(c->qk_norm());
  // Layer i is sparse iff (i + 1) % 2 == 0 and i is not in mlp_only_layers.
  EXPECT_FALSE(c->is_sparse(0));
  EXPECT_TRUE(c->is_sparse(1));
  EXPECT_FALSE(c->is_sparse(2));
  EXPECT_FALSE(c->is_sparse(3));
}

TEST(ModelConfigTest, JsonRoundTripAndParameterCount) {
  const ModelConfig c = TinyConfig(true);
  Result<ModelConfig> back = ModelConfig::FromJson(c.ToJson(), "rt");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), c.ToJson());
  // 23*32 embed + 2 layers * (attn 32*64 + 2*32*32 + 64*32 + 2*16, mlp 3*32*48, norms 2*32) + 32.
  EXPECT_EQ(c.NumParameters(), 23 * 32 + 2 * (4096 + 2048 + 32 + 4608 + 64) + 32);
}

// BindStateDict makes each parameter a view of the snapshot's bytes (no copy: the verifier's
// model held a whole fp32 copy of every version it checked), gives the logits a copied load
// gives, and refuses what LoadStateDict refuses, leaving the model as it was.
TEST(Qwen3BindTest, ParametersViewTheBytesAndTheForwardMatchesACopy) {
  for (bool tied : {false, true}) {
    Qwen3Model source = TinyModel(tied, 7);
    Result<std::string> bytes = SerializeSafetensors(source->StorageStateDict());
    ASSERT_TRUE(bytes.ok());
    Result<SafetensorsFile> view = ViewSafetensors(bytes.value(), "snapshot");
    ASSERT_TRUE(view.ok()) << view.status().message();
    Qwen3Model bound(TinyConfig(tied));
    ASSERT_TRUE(bound->BindStateDict(view->tensors, "snapshot").ok());
    const auto* begin = reinterpret_cast<const char*>(bytes->data());
    for (const auto& p : bound->parameters()) {
      const auto* at = static_cast<const char*>(p.data_ptr());
      EXPECT_TRUE(at >= begin && at < begin + bytes->size()) << "a parameter was copied (tied " << tied << ")";
    }
    const at::Tensor ids = at::randint(23, {2, 5}, at::kLong);
    at::NoGradGuard no_grad;
    EXPECT_EQ(MaxDiff(bound->Forward(ids, Positions(2, 5), at::Tensor(), nullptr),
                      source->Forward(ids, Positions(2, 5), at::Tensor(), nullptr)),
              0);

    std::map<std::string, at::Tensor> bad = view->tensors;
    bad.begin()->second = at::zeros({3}, at::kFloat);
    const at::Tensor before = bound->parameters()[0].clone();
    Status st = bound->BindStateDict(bad, "bad snapshot");
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("bad snapshot: tensor " + bad.begin()->first + " has shape [3]"), std::string::npos)
        << st.message();
    EXPECT_TRUE(bound->parameters()[0].equal(before));
  }
}

}  // namespace
}  // namespace echelon::model
