// Router replay's bytes against what they buy: an actor computing in bf16 and a learner in fp32
// hold the same weights, yet their routers choose differently at some (position, layer) pairs;
// an actor sends the routes whose top-k margin is below a threshold (rl.router_replay_margin).
// For each threshold this prints the share of routes sent, the share of the routing
// disagreements those cover, and the bytes per completion token the routes take on the wire
// (net/codec's encoding of data::Turn::routes), beside full replay (every route).
//
//   route_replay_bench [--model DIR] [--router-scale X] [--samples N] [--tokens T] [--seed S]
//
// --model: a Hugging Face Qwen3-MoE directory; without it a random one (8 experts, top-2,
// 4 sparse layers of hidden 64; init-model's layout at a smaller width) whose router weights
// are multiplied by --router-scale (1: as initialised, nearly uniform; larger: sharper choices,
// as a trained router makes). The actor (the model in bf16) samples N completions of T tokens
// from random prompts; both models then run the sequences teacher-forced and record every
// route (model::RouteTape). Prints one JSON line per threshold:
//   {"margin", "sent_frac", "disagreements_covered", "bytes_per_token", "full_bytes_per_token",
//    "disagree_frac", "routes_per_token"}
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/model/generate.h"
#include "echelon/model/hf_model.h"
#include "echelon/net/codec.h"

namespace {

using namespace echelon;

model::ModelConfig RandomMoe() {
  model::ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 4096;
  c.eos_token_id = -1;
  return c;
}

constexpr double kEvery = 1e9;  // a margin no route reaches: full replay

// Every route of `seq`'s fed positions under `m`, teacher-forced.
model::RouteTape Record(model::Qwen3Model& m, const std::vector<int64_t>& seq) {
  model::RouteTape tape;
  tape.record = true;
  m->SetRouteTape(&tape);
  const int64_t fed = static_cast<int64_t>(seq.size()) - 1;
  m->Forward(at::tensor(std::vector<int64_t>(seq.begin(), seq.end() - 1), at::kLong).unsqueeze(0),
             at::arange(fed, at::kLong).unsqueeze(0), at::Tensor(), nullptr);
  m->SetRouteTape(nullptr);
  return tape;
}

// The wire bytes of `routes` in a turn (the routes field alone).
size_t WireBytes(const Routes& routes) {
  data::Turn t;
  t.routes = routes;
  v1::Turn wire;
  net::EncodeTurn(t, &wire);
  return wire.has_routes() ? wire.routes().ByteSizeLong() + 2 : 0;  // + the field's tag and length
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double scale = 1.0;
  int64_t samples = 16, tokens = 256;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) dir = argv[++i];
    else if (a == "--router-scale" && i + 1 < argc) scale = std::atof(argv[++i]);
    else if (a == "--samples" && i + 1 < argc) samples = std::atoll(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::cerr << "usage: route_replay_bench [--model DIR] [--router-scale X] [--samples N] [--tokens T] [--seed S]\n";
      return 2;
    }
  }
  at::NoGradGuard no_grad;
  model::Qwen3Model learner(nullptr);
  if (!dir.empty()) {
    Result<model::TextModel> loaded = model::LoadModelDir(dir);
    if (!loaded.ok()) {
      std::cerr << loaded.status().message() << "\n";
      return 1;
    }
    learner = loaded->model;
  } else {
    learner = model::Qwen3Model(RandomMoe());
    learner->InitWeights(seed);
    for (auto& [name, t] : learner->StateDict())
      if (name.find("mlp.gate.weight") != std::string::npos) t.mul_(scale);
  }
  const model::ModelConfig& cfg = learner->config();
  if (!cfg.moe()) {
    std::cerr << "route_replay_bench: " << (dir.empty() ? "the model" : dir) << " is not a mixture of experts\n";
    return 1;
  }
  learner->to(at::kFloat);
  model::Qwen3Model actor(cfg);
  (void)actor->LoadStateDict(learner->StateDict(), "actor");
  actor->to(at::kBFloat16);

  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(3, cfg.vocab_size - 1);
  model::SamplingParams sp;
  sp.max_new_tokens = tokens;
  sp.ignore_eos = true;
  sp.seed = seed;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < samples; ++i) {
    std::vector<int64_t> p;
    for (int j = 0; j < 32; ++j) p.push_back(token(rng));
    prompts.push_back(p);
  }
  const std::vector<model::Completion> out = model::Generate(actor, prompts, sp);

  // Every route of every fed position: the actor's margin, whether the two routers disagree.
  struct Route {
    int32_t position;
    int16_t layer;
    float margin;
    bool disagree;
    int64_t experts[16];
  };
  std::vector<std::vector<Route>> routes(prompts.size());
  int64_t completion_tokens = 0, all = 0, disagreements = 0;
  const size_t k = static_cast<size_t>(cfg.num_experts_per_tok);
  for (size_t r = 0; r < prompts.size(); ++r) {
    std::vector<int64_t> seq = prompts[r];
    seq.insert(seq.end(), out[r].tokens.begin(), out[r].tokens.end());
    completion_tokens += static_cast<int64_t>(out[r].tokens.size());
    const model::RouteTape a = Record(actor, seq), l = Record(learner, seq);
    for (int64_t p = 0; p + 1 < static_cast<int64_t>(seq.size()); ++p)
      for (size_t layer = 0; layer < a.chosen.size(); ++layer) {
        if (!a.chosen[layer].defined()) continue;
        Route x{static_cast<int32_t>(p), static_cast<int16_t>(layer), a.margin[layer][p].item<float>(), false, {}};
        const at::Tensor ca = std::get<0>(a.chosen[layer][p].sort()), cl = std::get<0>(l.chosen[layer][p].sort());
        x.disagree = !ca.equal(cl);
        for (size_t e = 0; e < k; ++e) x.experts[e] = a.chosen[layer][p][static_cast<int64_t>(e)].item<int64_t>();
        routes[r].push_back(x);
        ++all;
        disagreements += x.disagree ? 1 : 0;
      }
  }
  const auto bytes_at = [&](double margin, int64_t* sent, int64_t* covered) {
    size_t bytes = 0;
    *sent = *covered = 0;
    for (const std::vector<Route>& row : routes) {
      Routes kept;
      for (const Route& x : row)
        if (x.margin < margin) {
          kept.Add(x.position, x.layer, x.experts, k);
          ++*sent;
          *covered += x.disagree ? 1 : 0;
        }
      bytes += WireBytes(kept);
    }
    return static_cast<double>(bytes) / static_cast<double>(completion_tokens);
  };
  int64_t sent = 0, covered = 0;
  const double full = bytes_at(kEvery, &sent, &covered);
  for (double margin : {0.01, 0.03, 0.1, 0.3, 1.0, 3.0, kEvery}) {
    const double bytes = bytes_at(margin, &sent, &covered);
    std::cout << nlohmann::json{{"margin", margin},
                                {"router_scale", dir.empty() ? scale : 0.0},
                                {"sent_frac", static_cast<double>(sent) / static_cast<double>(all)},
                                {"disagreements_covered",
                                 disagreements > 0 ? static_cast<double>(covered) / disagreements : 1.0},
                                {"bytes_per_token", bytes},
                                {"full_bytes_per_token", full},
                                {"disagree_frac", static_cast<double>(disagreements) / static_cast<double>(all)},
                                {"routes_per_token", static_cast<double>(all) / static_cast<double>(completion_tokens)}}
                     .dump()
              << std::endl;
  }
  return 0;
}
