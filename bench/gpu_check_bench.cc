// The checks scripts/gpu-check.sh runs on a machine with an NVIDIA GPU (each one JSON line):
//   logits   a tiny Qwen3 in bf16 on DEVICE against fp32 on the CPU, within bf16 tolerance
//   update   one learner update on DEVICE (bf16, fp32 master weights): finite, the weights move
//   generate generation tokens/s on DEVICE for a batch of 64 x 64 new tokens (Qwen3-shaped,
//            8 layers, hidden 512)
// Usage: gpu_check_bench [DEVICE]   (default cuda; any LibTorch device name works, e.g. cpu)
// Exit status 1 when a check fails.
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "echelon/learn/learner.h"
#include "echelon/model/generate.h"

namespace {

using namespace echelon;

model::ModelConfig Config(int64_t layers, int64_t hidden) {
  model::ModelConfig c;
  c.vocab_size = 1024;
  c.hidden_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = hidden / 64;
  c.num_key_value_heads = hidden / 128;
  c.head_dim = 64;
  c.intermediate_size = 3 * hidden;
  c.tie_word_embeddings = true;
  c.rope_theta = 10000;
  c.max_position_embeddings = 512;
  return c;
}

bool Report(const std::string& check, bool ok, nlohmann::json details) {
  details["check"] = check;
  details["ok"] = ok;
  std::cout << details.dump() << std::endl;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device = argc > 1 ? argv[1] : "cuda";
  if (Status st = model::CheckDevice(device); !st.ok()) {
    std::cerr << st.message() << std::endl;
    return 1;
  }
  const at::Device dev(device);
  bool ok = true;
  {  // logits: bf16 on the device against fp32 on the CPU
    model::Qwen3Model cpu(Config(2, 256));
    cpu->InitWeights(1);
    model::Qwen3Model gpu(cpu->config());
    (void)gpu->LoadStateDict(cpu->StateDict(), "copy");
    gpu->to(dev, at::kBFloat16);
    const at::Tensor ids = at::randint(3, 1024, {4, 32}, at::kLong);
    const at::Tensor pos = at::arange(32, at::kLong).unsqueeze(0).expand({4, 32});
    at::NoGradGuard no_grad;
    const at::Tensor a = at::log_softmax(cpu->Forward(ids, pos, at::Tensor(), nullptr), -1);
    const at::Tensor b = at::log_softmax(
        gpu->Forward(ids.to(dev), pos.to(dev), at::Tensor(), nullptr).to(at::kCPU, at::kFloat), -1);
    const double diff = (a - b).abs().max().item<double>();
    ok &= Report("logits", diff < 5e-2, {{"device", device}, {"max_logprob_diff", diff}, {"tolerance", 5e-2}});
  }
  {  // one learner update on the device
    model::Qwen3Model m(Config(2, 256));
    m->InitWeights(2);
    const at::Tensor before = m->StateDict().at("model.layers.0.mlp.up_proj.weight").clone();
    learn::LearnerOptions o;
    o.device = device;
    o.precision = learn::Precision::kBf16;
    learn::Learner learner(m, o);
    std::vector<learn::LearnerGroup> groups(4);
    for (auto& g : groups)
      for (int i = 0; i < 4; ++i) {
        data::Episode e;
        e.turns.push_back({{1, 5, 9, 7}, {11, 13, 2}, {-6.9f, -6.9f, -6.9f}, ""});
        e.turns.back().tokens[0] += i;
        e.reward = i % 2;
        g.episodes.push_back(e);
      }
    const auto t0 = std::chrono::steady_clock::now();
    Result<learn::StepStats> s = learner.Step(groups);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const at::Tensor after = learner.model()->StateDict().at("model.layers.0.mlp.up_proj.weight").to(at::kCPU);
    const bool moved = s.ok() && std::isfinite(s->loss) && !at::equal(before, after);
    ok &= Report("update", moved, {{"device", device}, {"seconds", secs}, {"ok_status", s.ok()},
                                   {"master_dtype_fp32", learner.model()->dtype() == at::kFloat}});
  }
  {  // generation throughput on the device
    model::Qwen3Model m(Config(8, 512));
    m->InitWeights(3);
    m->to(dev);
    std::vector<std::vector<int64_t>> prompts(64, std::vector<int64_t>(32, 5));
    model::SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_new_tokens = 64;
    sp.eos_token_id = -1;
    (void)model::Generate(m, prompts, sp);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<model::Completion> out = model::Generate(m, prompts, sp);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t tokens = 0;
    for (const auto& c : out) tokens += static_cast<int64_t>(c.tokens.size());
    ok &= Report("generate", tokens == 64 * 64, {{"device", device}, {"tokens_per_s", tokens / secs}, {"tokens", tokens}});
  }
  return ok ? 0 : 1;
}
