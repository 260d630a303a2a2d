// The learner with LoRA adapters (model/model_config.h LoraConfig): it moves the adapters
// alone and learns, two ranks give one rank's adapters, and its snapshots hold the adapters
// alone, which a policy loads over the base to the learner's very weights.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "echelon/common/sha256.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/testing.h"
#include "echelon/model/snapshot_weights.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::learn {
namespace {

model::Qwen3Model Adapted(const model::ModelConfig& c, int64_t rank) {
  model::Qwen3Model base(c);
  base->InitWeights(5);
  {
    // Logits of a trained model's range: under the 0.02-scale init the frozen tied head spans
    // about one nat, which caps what any adapter below it can move.
    at::NoGradGuard no_grad;
    base->StateDict().at("model.embed_tokens.weight").mul_(5.0);
  }
  model::LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 16;
  lora.targets = model::kLoraTargets;
  Result<model::Qwen3Model> m = model::WithLora(base, lora, 6);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.value();
}

// The probability the policy gives a rewarded first token (SampleGroups rewards even ones),
// averaged over SampleGroups' prompts.
double RewardedFirstTokenProbability(model::Qwen3Model& m) {
  at::NoGradGuard no_grad;
  double sum = 0;
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 7, 3}, {1, 9}, {1, 4, 4, 4, 4, 6}};
  for (const std::vector<int64_t>& p : prompts) {
    const int64_t n = static_cast<int64_t>(p.size());
    const at::Tensor logits = m->Forward(at::tensor(p, at::kLong).unsqueeze(0), at::arange(n, at::kLong).unsqueeze(0),
                                         at::Tensor(), nullptr);
    const at::Tensor probs = at::softmax(logits[0][n - 1].to(at::kFloat), -1);
    sum += probs.index_select(0, at::arange(0, probs.size(0), 2, at::kLong)).sum().item<double>();
  }
  return sum / static_cast<double>(prompts.size());
}

// Twenty updates with LoRA: every base tensor is bit for bit what it was, the adapters moved,
// AdamW holds state for the adapters alone, and the policy learned the preference (the
// rewarded first tokens' probability rose by more than 0.1; it goes from 0.41 to 0.8).
TEST(LoraLearner, TrainsTheAdaptersAloneAndLearns) {
  for (const model::ModelConfig& c : {TinyConfig(), TinyMoeConfig()}) {
    model::Qwen3Model init = Adapted(c, 4);
    const std::map<std::string, at::Tensor> before = Copy(init)->StateDict();
    LearnerOptions o;
    o.lr = 1e-2;
    Learner learner(Copy(init), o);
    const double start = RewardedFirstTokenProbability(learner.model());
    for (int step = 0; step < 20; ++step) {
      std::vector<LearnerGroup> groups = SampleGroups(learner.model(), 1.0, 8);
      Result<StepStats> s = learner.Step(groups);
      ASSERT_TRUE(s.ok()) << s.status().message();
    }
    const double end = RewardedFirstTokenProbability(learner.model());
    EXPECT_GT(end, start + 0.1) << c.model_type << ": " << start << " -> " << end;
    int moved = 0;
    for (const auto& [name, t] : learner.model()->StateDict()) {
      if (model::IsLoraTensor(name)) {
        moved += at::equal(t, before.at(name)) ? 0 : 1;
      } else {
        EXPECT_TRUE(at::equal(t, before.at(name))) << name << " is frozen";
      }
    }
    EXPECT_EQ(moved, static_cast<int>(init->AdapterStateDict().size())) << "every adapter moved";
    const std::map<std::string, at::Tensor> state = learner.OptimizerState();
    EXPECT_EQ(state.size(), 3 * init->AdapterStateDict().size());
    for (const auto& [name, t] : state) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  }
}

// Activation checkpointing recomputes each layer in the backward pass and hands back the
// gradients of the parameters that train: the adapters' updates are the plain learner's.
TEST(LoraLearner, CheckpointingGivesThePlainAdapters) {
  for (const model::ModelConfig& c : {TinyConfig(), TinyMoeConfig()}) {
    model::Qwen3Model init = Adapted(c, 4);
    const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
    LearnerOptions o;
    o.lr = 1e-2;
    Learner plain(Copy(init), o);
    o.activation_checkpointing = true;
    Learner checkpointed(Copy(init), o);
    for (int step = 0; step < 5; ++step) {
      Result<StepStats> a = plain.Step(groups), b = checkpointed.Step(groups);
      ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
      EXPECT_NEAR(a->loss, b->loss, 1e-6) << "step " << step;
      EXPECT_NEAR(a->grad_norm, b->grad_norm, 1e-5) << "step " << step;
    }
    EXPECT_LT(MaxWeightDiff(plain.model(), checkpointed.model()), 1e-5) << c.model_type;
    EXPECT_GT(MaxWeightDiff(plain.model(), init), 1e-3);
  }
}

// Log-probs of `completion`'s tokens after `prompt` under `m`.
at::Tensor CompletionLogProbs(model::Qwen3Model& m, const std::vector<int64_t>& prompt,
                              const std::vector<int64_t>& completion) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> ids = prompt;
  ids.insert(ids.end(), completion.begin(), completion.end());
  const int64_t n = static_cast<int64_t>(ids.size()), p = static_cast<int64_t>(prompt.size());
  const at::Tensor logits = m->Forward(at::tensor(ids, at::kLong).unsqueeze(0), at::arange(n, at::kLong).unsqueeze(0),
                                       at::Tensor(), nullptr)[0];
  const at::Tensor logp = at::log_softmax(logits.narrow(0, p - 1, n - p).to(at::kFloat), -1);
  return logp.gather(1, at::tensor(completion, at::kLong).unsqueeze(1)).squeeze(1);
}

// A LoRA run's KL reference is its own base with the adapters off, not a copy: the KL at the
// first update is zero (B starts at zero), and after three updates it is the token mean of
// exp(d) - d - 1, d = log pi_base - log pi, computed here by a model of the base tensors alone.
TEST(LoraLearner, TheKlReferenceIsTheBaseWithItsAdaptersOff) {
  for (const model::ModelConfig& c : {TinyConfig(), TinyMoeConfig()}) {
    model::Qwen3Model init = Adapted(c, 4);
    model::ModelConfig plain = c;
    plain.lora = {};
    model::Qwen3Model base(plain);
    std::map<std::string, at::Tensor> base_weights;
    for (const auto& [name, t] : init->StateDict())
      if (!model::IsLoraTensor(name)) base_weights[name] = t;
    ASSERT_TRUE(base->LoadStateDict(base_weights, "base").ok());
    const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
    LearnerOptions o;
    o.lr = 1e-2;
    o.loss.kl_coef = 0.1;
    Learner learner(Copy(init), o);
    EXPECT_TRUE(learner.ReferenceState().empty()) << "no reference copy";
    Result<StepStats> first = learner.Step(groups);
    ASSERT_TRUE(first.ok()) << first.status().message();
    EXPECT_EQ(first->kl, 0.0);
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(learner.Step(groups).ok());
    double sum = 0;
    int64_t tokens = 0;
    for (const LearnerGroup& g : groups)
      for (const data::Episode& e : g.episodes) {
        const data::Turn& t = e.turns[0];
        const at::Tensor d = CompletionLogProbs(base, t.prompt_ids, t.tokens) -
                             CompletionLogProbs(learner.model(), t.prompt_ids, t.tokens);
        sum += (at::exp(d) - d - 1.0).sum().item<double>();
        tokens += d.numel();
      }
    const double expected = sum / static_cast<double>(tokens);
    Result<StepStats> fourth = learner.Step(groups);
    ASSERT_TRUE(fourth.ok()) << fourth.status().message();
    EXPECT_GT(expected, 1e-6) << "the adapters moved the policy away from its base";
    EXPECT_NEAR(fourth->kl, expected, 1e-4 * expected) << c.model_type;
  }
}

// A bf16 LoRA learner cast the whole model to bf16, adapters included, and the adapters back to
// fp32: they lost their values at set-up (a resume from a checkpoint was not exact), and on a
// GPU the whole model went to the device in fp32 first. Now the base alone is cast: the
// adapters are what the learner was given, to the bit.
TEST(LoraLearner, ABf16LearnerKeepsItsAdaptersValuesAtSetUp) {
  model::Qwen3Model init = Adapted(TinyConfig(), 4);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, t] : init->AdapterStateDict()) t.add_(1e-4);  // B too: values bf16 cannot hold
  }
  const std::map<std::string, at::Tensor> given = Copy(init)->AdapterStateDict();
  LearnerOptions o;
  o.precision = Precision::kBf16;
  Learner learner(Copy(init), o);
  for (const auto& [name, t] : learner.model()->StateDict()) {
    if (!model::IsLoraTensor(name)) {
      EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name << ": the frozen base in the compute dtype";
      continue;
    }
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(at::equal(t, given.at(name))) << name;
  }
}

// Two data-parallel ranks (the AdamW state sharded too) give one rank's adapters.
TEST(LoraLearner, TwoRanksGiveOneRanksAdapters) {
  model::Qwen3Model init = Adapted(TinyConfig(), 4);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  LearnerOptions o;
  o.lr = 1e-2;
  o.micro_batch_tokens = 20;
  Learner one(Copy(init), o);
  for (int step = 0; step < 5; ++step) ASSERT_TRUE(one.Step(groups).ok());
  o.shard = Shard::kOptimizer;
  LocalRanks ranks(2);
  Learner rank0(Copy(init), o, ranks.ranks->group());
  ASSERT_TRUE(ranks.ranks->Setup(rank0, {}).ok());
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(ranks.ranks->SendStep(groups, o.lr).ok());
    Result<StepStats> s = rank0.Step(groups);
    ASSERT_TRUE(s.ok()) << s.status().message();
  }
  Result<std::map<std::string, at::Tensor>> gathered = ranks.ranks->GatherOptimizerState(rank0);
  ASSERT_TRUE(gathered.ok()) << gathered.status().message();
  EXPECT_EQ(gathered->size(), one.OptimizerState().size());
  ASSERT_TRUE(ranks.Finish().ok());
  EXPECT_LT(MaxWeightDiff(one.model(), rank0.model()), 1e-5);
  EXPECT_GT(MaxWeightDiff(one.model(), init), 1e-3);
}

// A LoRA learner's snapshot holds exactly the adapter tensors (a fraction of the whole
// model's bytes) and names its base; a policy loads the base once, then each version's
// adapters, and holds the learner's weights to the bit. An adapter over another base, or
// before any base, is refused and leaves the policy as it was.
TEST(LoraLearner, SnapshotsHoldTheAdaptersAloneOverTheirBase) {
  model::ModelConfig c = TinyConfig();
  c.vocab_size = 64;
  c.tie_word_embeddings = false;
  model::Qwen3Model init = Adapted(c, 2);
  LearnerOptions o;
  o.lr = 1e-2;
  Learner learner(Copy(init), o);
  Result<std::shared_ptr<const std::string>> base = MakeBase(learner.model());
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(learner.Step(SampleGroups(learner.model(), 1.0, 4)).ok());
  Result<contract::Snapshot> snap = MakeSnapshot(learner.model(), learner.version(), base.value());
  ASSERT_TRUE(snap.ok()) << snap.status().message();
  EXPECT_EQ(snap->base, base.value());
  Result<model::SafetensorsFile> f = model::ParseSafetensors(*snap->weights, "snapshot");
  ASSERT_TRUE(f.ok());
  std::set<std::string> names, adapters;
  for (const auto& [name, t] : f->tensors) names.insert(name);
  for (const auto& [name, t] : init->AdapterStateDict()) adapters.insert(name);
  EXPECT_EQ(names, adapters);
  EXPECT_EQ(model::AdapterBase(f.value()), Sha256Hex(*base.value()));
  EXPECT_EQ(model::AdapterBaseOf(*snap->weights), Sha256Hex(*base.value()));
  EXPECT_LT(snap->weights->size() * 8, base.value()->size()) << snap->weights->size() << " of " << base.value()->size();

  model::SamplingParams sp;
  rollout::ModelPolicy policy(model::Qwen3Model(c), model::Vocabulary::Characters("0123456789+-="), sp);
  // c carries no adapters: the policy's model is built from the run spec's config, which does.
  rollout::ModelPolicy adapted(model::Qwen3Model(init->config()), model::Vocabulary::Characters("0123456789+-="), sp);
  const Status early = adapted.LoadSnapshot(*snap->weights, 1);
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition) << early.message();
  EXPECT_NE(early.message().find("no base"), std::string::npos) << early.message();
  ASSERT_TRUE(adapted.LoadBase(*base.value()).ok());
  EXPECT_EQ(adapted.version(), -1);
  ASSERT_TRUE(adapted.LoadSnapshot(*snap->weights, 1).ok());
  EXPECT_EQ(adapted.version(), 1);
  EXPECT_EQ(MaxWeightDiff(adapted.model(), learner.model()), 0.0);
  // An adapter over another base.
  Result<std::string> other = model::SerializeAdapter(learner.model(), std::string(64, 'a'));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(adapted.LoadSnapshot(other.value(), 2).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(adapted.version(), 1);
  // A model without adapters takes no adapter snapshot.
  ASSERT_TRUE(policy.LoadBase(*base.value()).code() != StatusCode::kOk);
}

}  // namespace
}  // namespace echelon::learn
