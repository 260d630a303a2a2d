// The decoder at reasoning lengths against the independent PyTorch reference
// (tests/data/model/qwen3_long, see tests/data/model/README.md): logits of a 4,096-token input,
// and a 16,384-token greedy completion through the generation engine's block KV cache.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "echelon/common/fs.h"
#include "echelon/model/generate.h"
#include "echelon/model/hf_model.h"
#include "echelon/model/token_logprobs.h"

namespace echelon::model {
namespace {

const std::string kDir = std::string(ECHELON_TEST_DATA) + "/model/qwen3_long";

TextModel Load() {
  Result<TextModel> m = LoadModelDir(kDir);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

TEST(LongSequenceTest, LogitsOfA4096TokenInputEqualTheReference) {
  TextModel m = Load();
  const nlohmann::json golden = nlohmann::json::parse(ReadFile(kDir + "/golden_4096.json").value());
  const auto ids = golden["ids"].get<std::vector<int64_t>>();
  const auto positions = golden["positions"].get<std::vector<int64_t>>();
  const auto rows = golden["logits"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(ids.size(), 4096u);
  at::NoGradGuard no_grad;
  const at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
  const at::Tensor pos = at::arange(4096, at::kLong).unsqueeze(0);
  const at::Tensor logits = m.model->Forward(input, pos, at::Tensor(), nullptr)[0];
  const at::Tensor at_positions = logits.index_select(0, at::tensor(positions, at::kLong));
  at::Tensor expected = at::empty_like(at_positions);
  for (size_t i = 0; i < rows.size(); ++i) expected[static_cast<int64_t>(i)].copy_(at::tensor(rows[i], at::kFloat));
  EXPECT_LT((at_positions - expected).abs().max().item<double>(), 1e-4);
  EXPECT_GT(expected.abs().max().item<double>(), 1.0) << "golden logits should not be trivially small";
  // The learner's path: hidden states and chunked log-probs give the same log-probabilities.
  const at::Tensor targets = at::tensor(std::vector<int64_t>(ids.begin() + 1, ids.end()), at::kLong);
  const at::Tensor chunked = TokenLogProbs(m.model->Hidden(input, pos, at::Tensor())[0].narrow(0, 0, 4095),
                                           m.model->head(), targets, 1.0, nullptr, /*chunk=*/500);
  EXPECT_LT((chunked - LogitsTokenLogProbs(logits.narrow(0, 0, 4095), targets, 1.0)).abs().max().item<double>(), 1e-5);
}

TEST(LongSequenceTest, A16kTokenGreedyCompletionEqualsTheReference) {
  TextModel m = Load();
  const nlohmann::json golden = nlohmann::json::parse(ReadFile(kDir + "/golden_greedy.json").value());
  const auto prompt = golden["prompt"].get<std::vector<int64_t>>();
  const auto want = golden["tokens"].get<std::vector<int64_t>>();
  ASSERT_EQ(want.size(), 16384u);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_new_tokens = 16384;
  sp.ignore_eos = true;  // the reference generates a fixed number of tokens
  sp.eos_token_id = -1;
  const std::vector<Completion> out = Generate(m.model, {prompt}, sp);
  ASSERT_EQ(out[0].tokens.size(), want.size());
  size_t first_difference = want.size();
  for (size_t i = 0; i < want.size() && first_difference == want.size(); ++i)
    if (out[0].tokens[i] != want[i]) first_difference = i;
  EXPECT_EQ(first_difference, want.size()) << "the completions part at token " << first_difference
                                           << " (the reference's smallest top-2 logit margin is "
                                           << golden["min_margin"].get<double>() << ")";
}

}  // namespace
}  // namespace echelon::model
