// Evaluation as work: rounds of evaluation sets handed to actors under their own leases, pinned to
// one snapshot, scored by the learner into mean@k and the unbiased pass@k, never trained on.
#include "echelon/learn/eval_rounds.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <set>

#include "echelon/common/testing.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/model/tokenizer.h"

namespace echelon::learn {
namespace {

// C(n, r) in doubles, by the definition (small n only).
double Choose(int64_t n, int64_t r) {
  if (r < 0 || r > n) return 0;
  double c = 1;
  for (int64_t i = 1; i <= r; ++i) c = c * static_cast<double>(n - r + i) / static_cast<double>(i);
  return c;
}

TEST(PassAtKTest, IsOneMinusTheChanceThatKDrawsWithoutReplacementAllFail) {
  for (int64_t n = 1; n <= 20; ++n)
    for (int64_t c = 0; c <= n; ++c)
      for (int64_t k = 1; k <= n; ++k) {
        const double want = 1.0 - Choose(n - c, k) / Choose(n, k);
        EXPECT_NEAR(PassAtK(n, c, k), want, 1e-12) << n << " " << c << " " << k;
      }
  // Hand-computed: 2 of 4 right, pass@2 = 1 - C(2,2)/C(4,2) = 5/6; pass@1 is c/n.
  EXPECT_NEAR(PassAtK(4, 2, 2), 5.0 / 6.0, 1e-15);
  EXPECT_NEAR(PassAtK(10, 3, 1), 0.3, 1e-15);
  EXPECT_EQ(PassAtK(16, 0, 16), 0.0);
  EXPECT_EQ(PassAtK(16, 1, 16), 1.0);
  // Large n: no overflow (C(1000, 500) is far past a double).
  EXPECT_NEAR(PassAtK(1000, 1, 1), 0.001, 1e-15);
  EXPECT_GT(PassAtK(1000, 1, 999), 0.99);
}

class EvalRoundsTest : public TempDirTest {
 protected:
  // A math evaluation set of `n` problems "i+1" (answer i + 1) written to a file.
  std::shared_ptr<const data::TaskAdapter> MathSet(const std::string& name, int n) {
    std::string text;
    for (int i = 0; i < n; ++i)
      text += "{\"question\": \"" + std::to_string(i) + "+1\", \"answer\": \"" + std::to_string(i + 1) + "\"}\n";
    const std::string path = Write(name + ".jsonl", text);
    return std::shared_ptr<const data::TaskAdapter>(
        data::CreateAdapter("math", {{"seed", "1"}, {"eval_file", path}}).value());
  }
};

contract::Snapshot Snap(int64_t version) {
  return {version, std::make_shared<const std::string>("weights of v" + std::to_string(version)), nullptr};
}

TEST_F(EvalRoundsTest, ARoundGivesEachSetsMeanAndPassAtKOnceEveryItemIsIn) {
  SimulatedClock clock;
  EvalRounds rounds({{"a", MathSet("a", 3), 4, 0.6}, {"b", MathSet("b", 2), 2, 1.0}},
                    {/*lease_seconds=*/10}, &clock);
  EXPECT_FALSE(rounds.Acquire("x").has_value());  // nothing before a round opens
  rounds.Open(Snap(5));
  rounds.Open(Snap(5));  // a second round of one version is ignored
  EXPECT_EQ(rounds.open_rounds(), 1);
  EXPECT_EQ(*rounds.Pinned(5).weights, "weights of v5");
  EXPECT_EQ(rounds.Pinned(4).version, -1);
  // Successes per item, in hand-out order: set a's three prompts (k 4), then b's two (k 2).
  const std::vector<int64_t> successes = {4, 1, 0, 2, 0};
  std::set<uint64_t> ids;
  for (size_t i = 0; i < successes.size(); ++i) {
    std::optional<EvalRounds::Handed> h = rounds.Acquire("x#1");
    ASSERT_TRUE(h.has_value()) << i;
    EXPECT_TRUE(IsEvalGroup(h->id));
    EXPECT_TRUE(ids.insert(h->id).second);
    EXPECT_EQ(h->version, 5);
    EXPECT_EQ(h->set->name, i < 3 ? "a" : "b");
    EXPECT_EQ(h->prompt.reference, std::to_string((i < 3 ? i : i - 3) + 1));  // the learner keeps the answer
    clock.Advance(1);
    rounds.Record(h->id, h->lease_id, "x#1", successes[i]);
  }
  EXPECT_FALSE(rounds.Acquire("x#1").has_value());
  const std::vector<EvalSetResult> r = rounds.TakeFinished();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].name, "a");
  EXPECT_EQ(r[0].version, 5);
  EXPECT_EQ(r[0].prompts, 3);
  EXPECT_EQ(r[0].k, 4);
  EXPECT_NEAR(r[0].mean_at_k, (4 + 1 + 0) / 12.0, 1e-12);
  EXPECT_NEAR(r[0].pass_at_k, 2.0 / 3.0, 1e-12);  // with n = k: any success
  EXPECT_NEAR(r[1].mean_at_k, (2 + 0) / 4.0, 1e-12);
  EXPECT_NEAR(r[1].pass_at_k, 0.5, 1e-12);
  EXPECT_NEAR(r[1].seconds, 5.0, 1e-9);
  EXPECT_EQ(rounds.open_rounds(), 0);
  EXPECT_EQ(rounds.Pinned(5).version, -1);  // its bytes are let go
  EXPECT_TRUE(rounds.TakeFinished().empty());
}

TEST_F(EvalRoundsTest, OnlyTheCurrentHolderCountsAndALapsedLeaseIsHandedAgainFirst) {
  SimulatedClock clock;
  EvalRounds rounds({{"a", MathSet("a", 2), 1, 1.0}}, {/*lease_seconds=*/10}, &clock);
  rounds.Open(Snap(0));
  const EvalRounds::Handed first = rounds.Acquire("slow#1").value();
  EXPECT_FALSE(rounds.Holder(first.id, first.lease_id, "other#1").has_value());  // a foreign claim
  EXPECT_FALSE(rounds.Holder(first.id, first.lease_id + 7, "slow#1").has_value());
  clock.Advance(5);
  rounds.Renew(first.id, first.lease_id, "slow#1");  // progress: 10 s from now
  clock.Advance(9);
  EXPECT_TRUE(rounds.Holder(first.id, first.lease_id, "slow#1").has_value());
  clock.Advance(2);  // past the renewed lease
  const EvalRounds::Handed again = rounds.Acquire("fast#1").value();
  EXPECT_EQ(again.id, first.id);  // the lapsed item before the next one
  EXPECT_NE(again.lease_id, first.lease_id);
  EXPECT_EQ(rounds.reissued(), 1);
  rounds.Record(first.id, first.lease_id, "slow#1", 1);  // too late: ignored
  EXPECT_EQ(rounds.open_rounds(), 1);
  rounds.Record(again.id, again.lease_id, "fast#1", 0);
  const EvalRounds::Handed second = rounds.Acquire("fast#1").value();
  rounds.Requeue(second.id, second.lease_id, "fast#1");  // refused: back to the queue
  const EvalRounds::Handed third = rounds.Acquire("fast#1").value();
  EXPECT_EQ(third.id, second.id);
  rounds.Record(third.id, third.lease_id, "fast#1", 1);
  rounds.Record(third.id, third.lease_id, "fast#1", 1);  // repeated: counted once
  const std::vector<EvalSetResult> r = rounds.TakeFinished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0].mean_at_k, 0.5, 1e-12);
}

// The intake hands evaluation groups only to actors that sample them, pinned and without the
// answer: first to an actor that holds the round's snapshot, to another only once admission has
// no training group for it. It refuses one sampled from another version or handed in by another
// actor, and records a good one without queueing it for an update.
TEST_F(EvalRoundsTest, TheIntakeHandsPinnedGroupsAndNeverTrainsOnThem) {
  SimulatedClock clock;
  sched::Dispatcher dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock);
  std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value();
  const model::CharTokenizer tok = model::CharTokenizer::ForAlphabet(task->Alphabet());
  const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
  TrajectoryIntake hub(&dispatcher, task.get(), &vocab, {vocab.id_end(), /*group_size=*/2, /*max_completion_tokens=*/16});
  EvalRounds rounds({{"a", MathSet("a", 2), 3, 0.5}}, {/*lease_seconds=*/10}, &clock);
  hub.SetEvaluation(&rounds);
  hub.Publish(Snap(0));
  hub.Publish(Snap(1));
  rounds.Open(Snap(0));
  EXPECT_EQ(*hub.Pinned(0).weights, "weights of v0");
  EXPECT_EQ(hub.Pinned(1).version, 1);  // the newest, as it is
  EXPECT_EQ(hub.Pinned(2).version, -1);

  // An actor whose backend does not evaluate gets training work.
  std::optional<contract::Assignment> train = hub.AcquireWith("plain#1", {false, 1, /*evaluates=*/false});
  ASSERT_TRUE(train.has_value());
  EXPECT_EQ(train->eval_version, -1);
  EXPECT_FALSE(IsEvalGroup(train->work.group_id));

  // An evaluating actor on v1 gets training work while admission has some (S = 1, B = 2: four
  // groups), and the round's work once it has none.
  for (int i = 0; i < 3; ++i) {
    std::optional<contract::Assignment> t = hub.AcquireWith("late#1", {false, 1, /*evaluates=*/true});
    ASSERT_TRUE(t.has_value());
    EXPECT_FALSE(IsEvalGroup(t->work.group_id)) << i;
  }
  contract::Assignment late = hub.AcquireWith("late#1", {false, 1, true}).value();
  EXPECT_TRUE(IsEvalGroup(late.work.group_id));
  EXPECT_EQ(late.eval_version, 0);
  hub.Release("late#1", late.work);  // handed back: the next actor gets it

  contract::Assignment a = hub.AcquireWith("e#1", {false, 0, /*evaluates=*/true}).value();
  EXPECT_TRUE(IsEvalGroup(a.work.group_id));
  EXPECT_EQ(a.work.group_id, late.work.group_id);
  EXPECT_EQ(a.eval_version, 0);
  EXPECT_EQ(a.eval_temperature, 0.5);
  EXPECT_EQ(a.group_size, 3);
  EXPECT_TRUE(a.scored_by_learner);
  EXPECT_TRUE(a.prompt.reference.empty());
  EXPECT_FALSE(a.report_prefix);
  const std::string answer = rounds.Holder(a.work.group_id, a.work.lease_id, "e#1")->prompt.reference;

  // Three samples: two right, one wrong.
  const auto group = [&](const contract::Assignment& as, const std::string& actor, int64_t version) {
    contract::GroupRollout g;
    g.group_id = as.work.group_id;
    g.lease_id = as.work.lease_id;
    g.actor = actor;
    g.behavior_version = version;
    for (int i = 0; i < 3; ++i) {
      data::Turn t;
      t.prompt_ids = tok.Encode(as.prompt.text).value();
      t.prompt_ids.insert(t.prompt_ids.begin(), model::CharTokenizer::kBos);
      t.tokens = tok.Encode(i < 2 ? answer : "0").value();
      t.tokens.push_back(model::CharTokenizer::kEos);
      t.logprobs.assign(t.tokens.size(), -0.1f);
      g.episodes.emplace_back().turns.push_back(t);
    }
    return g;
  };
  contract::SubmitOutcome o = hub.Submit(group(a, "other#1", 0));
  EXPECT_EQ(o.reason, "not_lease_holder");
  o = hub.Submit(group(a, "e#1", 1));  // sampled with the newest, not the pinned snapshot
  EXPECT_EQ(o.reason, "wrong_eval_version");
  EXPECT_TRUE(o.forged);
  a = hub.AcquireWith("e#1", {false, 0, true}).value();  // handed again after the refusal
  EXPECT_EQ(a.eval_version, 0);
  o = hub.Submit(group(a, "e#1", 0));
  EXPECT_TRUE(o.accepted) << o.reason;
  // The set's second prompt: none right.
  contract::Assignment b = hub.AcquireWith("e#1", {false, 0, true}).value();
  contract::GroupRollout wrong = group(b, "e#1", 0);
  for (data::Episode& e : wrong.episodes) {
    e.turns[0].tokens = {model::CharTokenizer::kEos};
    e.turns[0].logprobs = {-0.1f};
  }
  EXPECT_TRUE(hub.Submit(wrong).accepted);
  EXPECT_TRUE(hub.Drain(0).empty());  // nothing for an update
  const std::vector<EvalSetResult> r = rounds.TakeFinished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0].mean_at_k, 2.0 / 6.0, 1e-12);
  EXPECT_NEAR(r[0].pass_at_k, 0.5, 1e-12);
  EXPECT_EQ(hub.refusals().at("wrong_eval_version"), 1);
  // With the round done (and admission full) there is nothing to hand out.
  EXPECT_FALSE(hub.AcquireWith("e#1", {false, 0, true}).has_value());
}

// Canaries (TrajectoryIntake::SetCanaries) look like training work: the next group id, the
// run's group size, no answer, no evaluation mark; their groups are scored with the canary
// set's reward into the worker's tally, settled as filtered (their admission slot freed) and
// never queued for an update. About `share` of new groups are canaries, each the same canary
// whenever it is handed out.
TEST_F(EvalRoundsTest, CanariesLookLikeTrainingWorkAndAreTalliedNotTrained) {
  SimulatedClock clock;
  std::unique_ptr<data::TaskAdapter> task = data::CreateAdapter("math", {{"seed", "1"}, {"eval_size", "10"}}).value();
  const model::CharTokenizer tok = model::CharTokenizer::ForAlphabet(task->Alphabet());
  const model::Vocabulary vocab = model::Vocabulary::Characters(task->Alphabet());
  std::shared_ptr<const data::TaskAdapter> set = MathSet("canaries", 3);
  {
    sched::Dispatcher dispatcher({/*max_staleness=*/1, /*batch_groups=*/2, /*lease_seconds=*/10}, &clock);
    TrajectoryIntake hub(&dispatcher, task.get(), &vocab,
                         {vocab.id_end(), /*group_size=*/2, /*max_completion_tokens=*/16, RunSecret::FromSeed(7)});
    hub.SetCanaries(set, /*share=*/1.0);
    hub.Publish(Snap(0));
    for (uint64_t want = 0; want < 4; ++want) {  // the whole admission window (S = 1, B = 2)
      contract::Assignment a = hub.AcquireWith("w#1", {false, 0, true}).value();
      EXPECT_EQ(a.work.group_id, want);
      EXPECT_EQ(a.eval_version, -1);
      EXPECT_EQ(a.group_size, 2);
      EXPECT_TRUE(a.prompt.reference.empty());
      const auto canary = std::find_if(set->HeldOut().begin(), set->HeldOut().end(),
                                       [&](const data::Prompt& p) { return p.text == a.prompt.text; });
      ASSERT_NE(canary, set->HeldOut().end()) << a.prompt.text;
      contract::GroupRollout g;
      g.group_id = a.work.group_id;
      g.lease_id = a.work.lease_id;
      g.actor = "w#1";
      for (int i = 0; i < 2; ++i) {  // the first sample right, the second right on odd groups only
        data::Turn t;
        t.prompt_ids = tok.Encode(a.prompt.text).value();
        t.prompt_ids.insert(t.prompt_ids.begin(), model::CharTokenizer::kBos);
        t.tokens = tok.Encode(i == 0 || want % 2 == 1 ? canary->reference : "0").value();
        t.tokens.push_back(model::CharTokenizer::kEos);
        t.logprobs.assign(t.tokens.size(), -0.1f);
        g.episodes.emplace_back().turns.push_back(t);
      }
      EXPECT_TRUE(hub.Submit(g).accepted);
    }
    EXPECT_TRUE(hub.Drain(0).empty());
    const CanaryTally t = hub.canaries().at("w");
    EXPECT_EQ(t.groups, 4);
    EXPECT_EQ(t.samples, 8);
    EXPECT_EQ(t.successes, 6);
    EXPECT_EQ(dispatcher.counts().filtered, 4u);
    EXPECT_TRUE(hub.AcquireWith("w#1", {false, 0, true}).has_value());  // their slots are free again
  }
  // A quarter of 400 new groups, each the same prompt every time it is handed out.
  sched::Dispatcher dispatcher(
      {/*max_staleness=*/1, /*batch_groups=*/200, /*lease_seconds=*/10, /*max_leases_per_worker=*/0}, &clock);
  TrajectoryIntake hub(&dispatcher, task.get(), &vocab,
                       {vocab.id_end(), /*group_size=*/2, /*max_completion_tokens=*/16, RunSecret::FromSeed(7)});
  hub.SetCanaries(set, /*share=*/0.25);
  hub.Publish(Snap(0));
  int canaries = 0;
  std::map<uint64_t, std::string> text;
  for (int i = 0; i < 400; ++i) {
    contract::Assignment a = hub.AcquireWith("w#1", {false, 0, true}).value();
    text[a.work.group_id] = a.prompt.text;
    canaries += a.prompt.text != task->TrainPrompt(a.work.group_id).text ? 1 : 0;
  }
  EXPECT_GT(canaries, 60);
  EXPECT_LT(canaries, 140);
  clock.Advance(11);  // every lease ends: each group is handed out again as it was
  for (int i = 0; i < 20; ++i) {
    contract::Assignment a = hub.AcquireWith("v#1", {false, 0, true}).value();
    EXPECT_EQ(a.prompt.text, text.at(a.work.group_id));
  }
}

}  // namespace
}  // namespace echelon::learn
