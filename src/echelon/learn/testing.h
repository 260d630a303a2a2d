// Helpers shared by the learner's unit tests (never by the library).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <memory>
#include <sstream>
#include <vector>

#include "echelon/learn/learner.h"
#include "echelon/learn/learner_ranks.h"
#include "echelon/model/generate.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/testing.h"

namespace echelon::learn {

inline model::ModelConfig TinyConfig() {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 64;
  c.tie_word_embeddings = true;
  c.rope_theta = 10000;
  c.max_position_embeddings = 64;
  return c;
}

// TinyConfig as a Qwen3-MoE: layer 0 dense, layer 1 four experts, top-2.
inline model::ModelConfig TinyMoeConfig() { return model::AsTinyMoe(TinyConfig(), 16, 0); }

// One group per prompt, sampled by the generator from the learner's own weights (S = 0).
inline std::vector<LearnerGroup> SampleGroups(model::Qwen3Model& m, double temperature, int group_size) {
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 7, 3}, {1, 9}, {1, 4, 4, 4, 4, 6}};
  std::vector<LearnerGroup> groups;
  for (size_t p = 0; p < prompts.size(); ++p) {
    model::SamplingParams sp;
    sp.temperature = temperature;
    sp.max_new_tokens = 5;
    sp.seed = 100 + p;
    std::vector<std::vector<int64_t>> batch(group_size, prompts[p]);
    std::vector<model::Completion> out;
    {
      at::NoGradGuard no_grad;
      out = model::Generate(m, batch, sp);
    }
    LearnerGroup g;
    for (int i = 0; i < group_size; ++i) {
      data::Episode e;
      e.turns.push_back({prompts[p], out[i].tokens, out[i].logprobs, ""});
      e.reward = out[i].tokens.front() % 2 == 0 ? 1.0 : 0.0;  // an arbitrary learnable preference
      g.episodes.push_back(e);
    }
    groups.push_back(g);
  }
  return groups;
}

// Router replay: groups of 4 samples of two prompts drawn by `actor` (a mixture of experts) with
// every route recorded, rewards alternating 0 and 1; *entries (when given) counts the routes.
inline std::vector<LearnerGroup> RoutedGroups(model::Qwen3Model& actor, int64_t* entries = nullptr) {
  std::vector<LearnerGroup> groups;
  for (const std::vector<int64_t>& prompt : {std::vector<int64_t>{1, 5, 7, 3}, std::vector<int64_t>{1, 9, 2}}) {
    model::SamplingParams sp;
    sp.max_new_tokens = 6;
    sp.seed = 40 + prompt.size();
    sp.route_margin = 1e9;  // every route
    std::vector<model::Completion> out;
    {
      at::NoGradGuard no_grad;
      out = model::Generate(actor, std::vector<std::vector<int64_t>>(4, prompt), sp);
    }
    LearnerGroup g;
    for (size_t i = 0; i < out.size(); ++i) {
      data::Episode e;
      e.turns.push_back({prompt, out[i].tokens, out[i].logprobs, ""});
      e.turns.back().routes = out[i].routes;
      if (entries != nullptr) *entries += static_cast<int64_t>(out[i].routes.size());
      e.reward = static_cast<double>(i % 2);
      g.episodes.push_back(e);
    }
    groups.push_back(g);
  }
  return groups;
}

// `m` with its sparse layer 1's router replaced by another's, 20 x sharper: the same weights
// routed otherwise (another engine's arithmetic, exaggerated).
inline void RerouteLayerOne(model::Qwen3Model& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  model::Qwen3Model other(m->config());
  other->InitWeights(seed);
  m->StateDict().at("model.layers.1.mlp.gate.weight").copy_(other->StateDict().at("model.layers.1.mlp.gate.weight") * 20.0);
}

// A copy of `m`'s weights in a new module.
inline model::Qwen3Model Copy(const model::Qwen3Model& m) {
  model::Qwen3Model c(m->config());
  EXPECT_TRUE(c->LoadStateDict(m->StateDict(), "copy").ok());
  return c;
}

// Largest |a - b| over every parameter of two models.
inline double MaxWeightDiff(const model::Qwen3Model& a, const model::Qwen3Model& b) {
  double worst = 0;
  const auto sa = a->StateDict(), sb = b->StateDict();
  for (const auto& [name, t] : sa) worst = std::max(worst, (t - sb.at(name)).abs().max().item<double>());
  return worst;
}

// ||a - b|| / ||a - init|| over every weight: how far two learners' updates from `init` differ,
// relative to the update's own size.
inline double RelativeUpdateDiff(const model::Qwen3Model& a, const model::Qwen3Model& b,
                                 const model::Qwen3Model& init) {
  double diff = 0, update = 0;
  const auto sa = a->StateDict(), sb = b->StateDict(), si = init->StateDict();
  for (const auto& [name, t] : sa) {
    diff += (t - sb.at(name)).to(at::kDouble).pow(2).sum().item<double>();
    update += (t - si.at(name)).to(at::kDouble).pow(2).sum().item<double>();
  }
  return update > 0 ? std::sqrt(diff / update) : std::sqrt(diff);
}

// Rank 0's weights, whole: its own or, with sharded parameters, gathered from every rank (tests
// only: a run never holds them whole). Every worker must still be there.
inline model::Qwen3Model WholeWeights(LearnerRanks& ranks, Learner& rank0) {
  if (!rank0.parameters_sharded()) return rank0.model();
  Result<std::shared_ptr<const std::string>> bytes = ranks.WeightsBytes(rank0, at::kFloat);
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  if (!bytes.ok()) return model::Qwen3Model(nullptr);
  Result<model::SafetensorsFile> file = model::ParseSafetensors(*bytes.value(), "gathered weights");
  EXPECT_TRUE(file.ok()) << file.status().message();
  model::Qwen3Model m(rank0.model()->config());
  const Status loaded = m->LoadStateDict(file->tensors, "gathered weights");
  EXPECT_TRUE(loaded.ok()) << loaded.message();
  return m;
}

// Rank 0 here, ranks 1..world-1 as worker threads running RunRankWorker.
struct LocalRanks {
  explicit LocalRanks(int world) {
    RankGroupOptions r0;
    r0.world = world;
    r0.timeout_seconds = 60;
    r0.on_listening = [this, world](int port) {
      for (int r = 1; r < world; ++r)
        workers.push_back(std::async(std::launch::async, [port, r, world] {
          RankGroupOptions o;
          o.rank = r;
          o.world = world;
          o.master_port = port;
          o.timeout_seconds = 60;
          Result<std::unique_ptr<RankGroup>> g = RankGroup::Connect(o);
          if (!g.ok()) return g.status();
          std::stringstream log;
          return RunRankWorker(*g.value(), log);
        }));
      return Status::Ok();
    };
    Result<std::unique_ptr<RankGroup>> g = RankGroup::Connect(r0);
    EXPECT_TRUE(g.ok()) << g.status().message();
    ranks = std::make_unique<LearnerRanks>(std::move(g).value());
  }
  Status Finish() {
    ranks->Stop();
    for (auto& w : workers) ECHELON_RETURN_IF_ERROR(w.get());
    return Status::Ok();
  }
  std::unique_ptr<LearnerRanks> ranks;
  std::vector<std::future<Status>> workers;
};

}  // namespace echelon::learn
