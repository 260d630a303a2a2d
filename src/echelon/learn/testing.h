// Helpers shared by the learner's unit tests (never by the library).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <vector>

#include "echelon/learn/learner.h"
#include "echelon/model/generate.h"
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

}  // namespace echelon::learn
