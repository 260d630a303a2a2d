#include "echelon/learn/warmstart.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>

namespace echelon::learn {

Result<double> Warmstart(model::Qwen3Model& model, const model::Vocabulary& vocab, const data::TaskAdapter& task,
                         const WarmstartOptions& options, const WarmstartProgress& progress) {
  if (vocab.stop_ids().empty()) return FailedPrecondition("warm-start needs a stop token (eos_token_id) to end answers");
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.lr).weight_decay(0.0));
  // Warm-start draws from a prompt range far from RL's group ids (which start at 0).
  const uint64_t base = (uint64_t{1} << 40) + options.seed * options.steps * options.batch_size;
  double last_loss = 0;
  model->train();
  for (int64_t step = 0; step < options.steps; ++step) {
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> prompt_lens;
    for (int64_t i = 0; i < options.batch_size; ++i) {
      data::Prompt p = task.TrainPrompt(base + step * options.batch_size + i);
      ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> ids, vocab.EncodePrompt(p.system, p.text));
      const std::string demonstration = task.Demonstration(p);
      if (demonstration.empty())
        return FailedPrecondition("the " + task.name() + " task has no demonstrations to warm-start from; set warmstart.steps: 0");
      ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> answer, vocab.Encode(demonstration));
      prompt_lens.push_back(ids.size());
      ids.insert(ids.end(), answer.begin(), answer.end());
      ids.push_back(vocab.stop_ids().front());
      seqs.push_back(std::move(ids));
    }
    int64_t max_len = 0;
    for (const auto& s : seqs) max_len = std::max<int64_t>(max_len, s.size() - 1);
    const int64_t n = seqs.size();
    at::Tensor input = at::zeros({n, max_len}, at::kLong);
    at::Tensor target = at::full({n, max_len}, -100, at::kLong);  // -100: ignored by the loss
    auto in = input.accessor<int64_t, 2>();
    auto tg = target.accessor<int64_t, 2>();
    for (int64_t r = 0; r < n; ++r) {
      for (size_t j = 0; j + 1 < seqs[r].size(); ++j) {
        in[r][j] = seqs[r][j];
        if (static_cast<int64_t>(j) >= prompt_lens[r] - 1) tg[r][j] = seqs[r][j + 1];
      }
    }
    input = input.to(model->device());
    target = target.to(model->device());
    const at::Tensor positions = at::arange(max_len, input.options()).unsqueeze(0).expand_as(input);
    const at::Tensor logits = model->Forward(input, positions, at::Tensor(), nullptr).to(at::kFloat);
    const at::Tensor loss = at::cross_entropy_loss(logits.reshape({n * max_len, -1}), target.reshape({-1}),
                                                   {}, at::Reduction::Mean, -100);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    last_loss = loss.item<double>();
    if (progress) progress(step, last_loss);
  }
  return last_loss;
}

}  // namespace echelon::learn
