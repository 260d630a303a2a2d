// HostedEpisodes plays poker for an actor that only sees each turn's prompt: the group it
// submits is the one the actor would have played with the deal in hand, and completions are
// read as a hostile worker would write them.
#include "echelon/learn/hosted_episodes.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "echelon/contract/group_seed.h"
#include "echelon/data/adapter.h"
#include "echelon/learn/behaviour_verifier.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/learn/testing.h"
#include "echelon/rollout/model_policy.h"

namespace echelon::learn {
namespace {

constexpr int kGroupSize = 4;
constexpr int64_t kMaxNewTokens = 8;

// The actor's side: one completion per prompt, "c" (check or call) or what `answer` says, with
// the prompt ids the learner will encode too.
class ScriptedPolicy : public data::Policy {
 public:
  ScriptedPolicy(const model::Vocabulary* vocab, std::function<std::string(uint64_t)> answer)
      : vocab_(vocab), answer_(std::move(answer)) {}
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override {
    std::vector<data::Turn> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      data::Turn t;
      ECHELON_ASSIGN_OR_RETURN(t.prompt_ids, vocab_->EncodePrompt(prompts[i].system, prompts[i].user));
      ECHELON_ASSIGN_OR_RETURN(t.tokens, vocab_->Encode(answer_(seed + i)));
      t.tokens.push_back(vocab_->stop_ids().front());
      t.logprobs.assign(t.tokens.size(), -0.5f);
      t.text = vocab_->DecodeCompletion(t.tokens);
      out.push_back(std::move(t));
    }
    return out;
  }

 private:
  const model::Vocabulary* vocab_;
  std::function<std::string(uint64_t)> answer_;
};

std::string CallOrRaise(uint64_t r) { return r % 3 == 0 ? "r" : "c"; }

struct Fixture {
  Fixture()
      : dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/60}, &clock),
        task(data::CreateAdapter("poker", {{"seed", "3"}}).value()),
        vocab(model::Vocabulary::Characters(task->Alphabet())),
        intake(&dispatcher, task.get(), &vocab, {vocab.id_end(), kGroupSize, kMaxNewTokens}),
        host(&intake, HostedEpisodesOptions{/*turn_timeout_seconds=*/2, /*environment_wait_seconds=*/2}) {
    intake.Publish({0, std::make_shared<const std::string>()});
  }
  // Plays `work` as an actor would through the host, with `policy`.
  Result<contract::SubmitOutcome> PlayThrough(const std::string& actor, const sched::WorkItem& work,
                                             data::Policy& policy) {
    std::vector<data::Turn> turns;
    while (true) {
      ECHELON_ASSIGN_OR_RETURN(contract::PlayStep step, host.Play(actor, work, 0, std::move(turns), 0.1));
      if (step.outcome) return *step.outcome;
      ++round_trips;
      ECHELON_ASSIGN_OR_RETURN(turns, policy.Sample(step.prompts, step.seed));
    }
  }
  SimulatedClock clock;
  sched::Dispatcher dispatcher;
  std::unique_ptr<data::TaskAdapter> task;
  model::Vocabulary vocab;
  TrajectoryIntake intake;
  HostedEpisodes host;
  int round_trips = 0;
};

TEST(HostedEpisodesTest, PlaysTheGroupTheActorWouldHavePlayedWithTheDealInHand) {
  Fixture f;
  contract::Assignment a = f.intake.Acquire("w#1").value();
  ASSERT_TRUE(f.host.Host("w#1", a));
  ScriptedPolicy policy(&f.vocab, CallOrRaise);
  Result<contract::SubmitOutcome> out = f.PlayThrough("w#1", a.work, policy);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_TRUE(out->accepted) << out->reason;
  EXPECT_EQ(f.host.open_groups(), 0u);
  std::vector<contract::GroupRollout> got = f.intake.Drain(0.0);
  ASSERT_EQ(got.size(), 1u);
  // The same hands, turns and chips as the task playing it here with the same policy and seed.
  ScriptedPolicy same(&f.vocab, CallOrRaise);
  const std::vector<data::Episode> local =
      f.task->RunGroup(a.prompt, kGroupSize, same, a.seed).value();
  ASSERT_EQ(got[0].episodes.size(), local.size());
  size_t turns = 0;
  for (size_t i = 0; i < local.size(); ++i) {
    EXPECT_EQ(got[0].episodes[i].reward, local[i].reward) << i;
    ASSERT_EQ(got[0].episodes[i].turns.size(), local[i].turns.size()) << i;
    for (size_t k = 0; k < local[i].turns.size(); ++k) {
      EXPECT_EQ(got[0].episodes[i].turns[k].prompt_ids, local[i].turns[k].prompt_ids);
      EXPECT_EQ(got[0].episodes[i].turns[k].tokens, local[i].turns[k].tokens);
    }
    turns += local[i].turns.size();
  }
  EXPECT_GT(turns, static_cast<size_t>(kGroupSize)) << "no hand took a second turn";
  EXPECT_GE(f.round_trips, 2);
}

TEST(HostedEpisodesTest, SingleTurnWorkIsNotHosted) {
  SimulatedClock clock;
  sched::Dispatcher dispatcher({1, 2, 60}, &clock);
  std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("math", {{"eval_size", "10"}}).value();
  const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
  TrajectoryIntake intake(&dispatcher, task.get(), &vocab, {vocab.id_end(), 2, 8});
  intake.Publish({0, std::make_shared<const std::string>()});
  HostedEpisodes host(&intake, {});
  EXPECT_FALSE(host.Host("w#1", intake.Acquire("w#1").value()));
  EXPECT_EQ(host.open_groups(), 0u);
}

TEST(HostedEpisodesTest, CompletionsAreReadAsAHostileWorkerWritesThem) {
  Fixture f;
  contract::Assignment a = f.intake.Acquire("w#1").value();
  ASSERT_TRUE(f.host.Host("w#1", a));
  // Another actor cannot play it, nor can the first call carry completions.
  EXPECT_EQ(f.host.Play("w#2", a.work, 0, {}, 0).status().code(), StatusCode::kInvalidArgument);
  sched::WorkItem unknown = a.work;
  unknown.lease_id += 1000;
  EXPECT_EQ(f.host.Play("w#1", unknown, 0, {}, 0).status().code(), StatusCode::kNotFound);
  ScriptedPolicy policy(&f.vocab, CallOrRaise);
  Result<contract::PlayStep> first = f.host.Play("w#1", a.work, 0, {}, 0);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_EQ(first->prompts.size(), static_cast<size_t>(kGroupSize));
  for (const data::PolicyPrompt& p : first->prompts) {
    // The prompt is the player's view: the deal's seed (the whole table) is not in it.
    EXPECT_EQ(p.user.find(a.prompt.reference), std::string::npos);
  }
  // A lost reply: calling again without completions gets the same prompts.
  Result<contract::PlayStep> again = f.host.Play("w#1", a.work, 0, {}, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->prompts.size(), first->prompts.size());
  EXPECT_EQ(again->seed, first->seed);
  std::vector<data::Turn> turns = policy.Sample(first->prompts, first->seed).value();
  std::vector<data::Turn> short_by_one(turns.begin(), turns.end() - 1);
  EXPECT_EQ(f.host.Play("w#1", a.work, 0, short_by_one, 0).status().code(), StatusCode::kInvalidArgument);
  std::vector<data::Turn> too_long = turns;
  too_long[0].tokens.assign(kMaxNewTokens + 1, too_long[0].tokens[0]);
  too_long[0].logprobs.assign(kMaxNewTokens + 1, -0.5f);
  EXPECT_EQ(f.host.Play("w#1", a.work, 0, too_long, 0).status().code(), StatusCode::kInvalidArgument);
  std::vector<data::Turn> foreign_id = turns;
  foreign_id[0].tokens[0] = -5;
  EXPECT_EQ(f.host.Play("w#1", a.work, 0, foreign_id, 0).status().code(), StatusCode::kInvalidArgument);
  std::vector<data::Turn> unpaired = turns;
  unpaired[1].logprobs.pop_back();
  EXPECT_EQ(f.host.Play("w#1", a.work, 0, unpaired, 0).status().code(), StatusCode::kInvalidArgument);
  // The worker's text is never taken: the learner decodes the tokens.
  turns[0].text = "a lie";
  Result<contract::PlayStep> next = f.host.Play("w#1", a.work, 0, turns, 0);
  ASSERT_TRUE(next.ok()) << next.status().message();
  // A worker that goes silent: its group is given up after the turn timeout (2 s).
  if (!next->outcome) {
    Result<contract::PlayStep> late = [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return f.host.Play("w#1", a.work, 0, policy.Sample(next->prompts, next->seed).value(), 0);
    }();
    ASSERT_TRUE(late.ok()) << late.status().message();
    ASSERT_TRUE(late->outcome.has_value());
    EXPECT_EQ(late->outcome->reason, "play_timeout");
    EXPECT_FALSE(late->outcome->accepted);
  }
}

// The actor's side with echelon's engine, seeded as an actor samples; with `forge_first`, the
// first completion of the first call is replaced by a different one of its own writing, with
// its true log-probs (teacher-forced): everything but the draw is right.
class SeededPolicy : public data::Policy {
 public:
  SeededPolicy(model::Qwen3Model m, const model::Vocabulary& vocab, model::SamplingParams sp, bool forge_first)
      : model_(m), inner_(m, vocab, sp), temperature_(sp.temperature), forge_(forge_first), vocab_(vocab) {}
  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override {
    ECHELON_ASSIGN_OR_RETURN(std::vector<data::Turn> turns, inner_.Sample(prompts, seed));
    if (forge_ && !turns.empty()) {
      forge_ = false;
      data::Turn& t = turns[0];
      std::vector<int64_t> mine = vocab_.Encode(t.tokens.size() > 1 && t.text.rfind("c", 0) == 0 ? "f" : "c").value();
      mine.push_back(vocab_.stop_ids().front());
      t.tokens = mine;
      t.logprobs = model::ScoreCompletion(model_, t.prompt_ids, t.tokens, temperature_);
      t.versions.clear();
      t.text = vocab_.DecodeCompletion(t.tokens);
    }
    return turns;
  }

 private:
  model::Qwen3Model model_;
  rollout::ModelPolicy inner_;
  double temperature_;
  bool forge_;
  const model::Vocabulary& vocab_;
};

// A multi-turn group the learner plays for an actor went unchecked for draws: the actor chose
// each turn's tokens (a cherry-pick or a teacher-forced answer with its true log-probs passed).
// The learner knows each turn's Sample call (its seed and row), so a verified hosted group's
// tokens must be their seeded draws: an honest seeded actor's group passes with every token
// checked, one turn of the actor's own writing is refused as sample_not_drawn.
TEST(HostedEpisodesTest, AVerifiedHostedGroupsTurnsMustBeTheirSeededDraws) {
  for (const bool forge : {false, true}) {
    SimulatedClock clock;
    sched::Dispatcher dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/60}, &clock);
    std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("poker", {{"seed", "3"}}).value();
    const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
    model::ModelConfig config = TinyConfig();
    config.vocab_size = vocab.id_end();
    config.max_position_embeddings = 512;
    model::Qwen3Model m(config);
    m->InitWeights(5);
    model::SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_new_tokens = kMaxNewTokens;
    sp.eos_token_id = vocab.stop_ids().front();
    sp.stop_token_ids = vocab.stop_ids();
    VerifyOptions vo;
    vo.fraction = 1.0;
    vo.tolerance = 1e-3;
    vo.sampling = sp;
    vo.turn_draws = true;
    BehaviourVerifier verifier(config, vo);
    TrajectoryIntake intake(&dispatcher, task.get(), &vocab, {vocab.id_end(), kGroupSize, kMaxNewTokens});
    intake.SetVerifier(&verifier);
    intake.Publish(MakeSnapshot(m, 0).value());
    HostedEpisodes host(&intake, HostedEpisodesOptions{2, 2});
    contract::Assignment a = intake.Acquire("w#1").value();
    ASSERT_TRUE(host.Host("w#1", a));
    SeededPolicy policy(m, vocab, sp, forge);
    std::vector<data::Turn> turns;
    std::optional<contract::SubmitOutcome> outcome;
    while (!outcome) {
      Result<contract::PlayStep> step = host.Play("w#1", a.work, 0, std::move(turns), 0.1);
      ASSERT_TRUE(step.ok()) << step.status().message();
      if (step->outcome) outcome = step->outcome;
      else turns = policy.Sample(step->prompts, step->seed).value();
    }
    if (forge) {
      EXPECT_FALSE(outcome->accepted);
      EXPECT_EQ(outcome->reason, "sample_not_drawn");
    } else {
      EXPECT_TRUE(outcome->accepted) << outcome->reason;
      EXPECT_GE(verifier.stats().draws_checked, kGroupSize) << "every turn's tokens checked";
      EXPECT_EQ(verifier.stats().near_ties, 0);
    }
  }
}

}  // namespace
}  // namespace echelon::learn
