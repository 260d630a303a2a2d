#include "echelon/data/poker/poker_adapter.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "echelon/data/poker/duplicate_eval.h"
#include "echelon/data/poker/observation.h"

namespace echelon::data::poker {
namespace {

// A policy whose answer is a function of the prompt text and the call's seed; it records
// every batch so tests can check batching and the prompts' characters.
class FakePolicy : public Policy {
 public:
  explicit FakePolicy(std::function<std::string(const std::string&, uint64_t)> answer) : answer_(std::move(answer)) {}
  Result<std::vector<Turn>> Sample(const std::vector<PolicyPrompt>& prompts, uint64_t seed) override {
    batches.push_back(prompts.size());
    std::vector<Turn> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Turn t;
      t.text = answer_(prompts[i].user, HashCombine(seed, i));
      t.prompt_ids = {1};
      seen.push_back(prompts[i].user);
      out.push_back(t);
    }
    return out;
  }
  std::vector<size_t> batches;
  std::vector<std::string> seen;

 private:
  std::function<std::string(const std::string&, uint64_t)> answer_;
};

std::string AlwaysCall(const std::string&, uint64_t) { return "c"; }
std::string RandomLetter(const std::string&, uint64_t r) { return std::string(1, "fcr"[r % 3]); }

std::unique_ptr<TaskAdapter> Make(const AdapterOptions& options) {
  Result<std::unique_ptr<TaskAdapter>> task = CreateAdapter("poker", options);
  EXPECT_TRUE(task.ok()) << task.status().message();
  return std::move(task).value();
}

TEST(PokerAdapter, ReplayGivesEveryHandsChipsAndPromptsNotTheActors) {
  std::unique_ptr<TaskAdapter> task = Make({{"opponent", "tag"}, {"seed", "5"}});
  for (uint64_t group = 0; group < 20; ++group) {
    const Prompt p = task->TrainPrompt(group);
    FakePolicy policy(RandomLetter);
    Result<std::vector<Episode>> played = task->RunGroup(p, 4, policy, group);
    ASSERT_TRUE(played.ok()) << played.status().message();
    size_t seen = 0;
    for (const Episode& e : played.value()) {
      std::vector<std::string> actions;
      for (const Turn& t : e.turns) actions.push_back(t.text);
      Result<std::optional<Replay>> r = task->ReplayEpisode(p, actions);
      ASSERT_TRUE(r.ok() && r->has_value());
      EXPECT_DOUBLE_EQ(r.value()->scored.reward, e.reward) << "group " << group;
      EXPECT_EQ(r.value()->success, e.success);
      ASSERT_EQ(r.value()->prompts.size(), e.turns.size());
      seen += e.turns.size();
      // A claim of one action more than the hand took is visible: no prompt for it.
      actions.push_back("c");
      EXPECT_EQ(task->ReplayEpisode(p, actions).value()->prompts.size(), e.turns.size());
    }
    // The prompts the policy saw, each one replayed (lockstep order differs; compare as sets).
    std::multiset<std::string> want(policy.seen.begin(), policy.seen.end()), got;
    for (const Episode& e : played.value()) {
      std::vector<std::string> actions;
      for (const Turn& t : e.turns) actions.push_back(t.text);
      const std::optional<Replay> r = task->ReplayEpisode(p, actions).value();
      for (const PolicyPrompt& q : r->prompts) got.insert(q.user);
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(seen, policy.seen.size());
  }
}

TEST(PokerAdapter, RegisteredAndOptionsValidated) {
  std::unique_ptr<TaskAdapter> task = Make({{"eval_hands", "7"}, {"opponent", "tag"}, {"seed", "3"}});
  EXPECT_EQ(task->name(), "poker");
  EXPECT_EQ(task->HeldOut().size(), 7u);
  struct Bad {
    AdapterOptions options;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{{"opponent", "shark"}}, "poker task option opponent: unknown poker opponent \"shark\""},
      {{{"opponent", ""}}, "poker task option opponent: empty"},
      {{{"illegal_action", "raise"}}, "poker task option illegal_action: expected \"fold\""},
      {{{"eval_hands", "0"}}, "poker task option eval_hands: expected an integer in 1..100000, got \"0\""},
      {{{"seed", "-1"}}, "poker task option seed: expected an integer"},
      {{{"hands", "10"}}, "poker task: unknown option \"hands\""},
      {{{"secret", "12ab"}}, "poker task option secret: a run secret is 64 hex characters"},
  };
  for (const Bad& b : bad) {
    Result<std::unique_ptr<TaskAdapter>> r = CreateAdapter("poker", b.options);
    ASSERT_FALSE(r.ok()) << b.message;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(b.message), std::string::npos) << r.status().message();
  }
}

// A training deal comes from the learner's secret, so a worker that knows the seed (or guesses
// it) cannot know a group's hands; the held-out hands stay the seed's, the same in every run.
TEST(PokerAdapter, TrainingDealsComeFromTheSecretHeldOutOnesFromTheSeed) {
  const std::string a(64, 'a'), b(64, 'b');
  std::unique_ptr<TaskAdapter> seed_only = Make({{"seed", "3"}});
  std::unique_ptr<TaskAdapter> secret_a = Make({{"seed", "3"}, {"secret", a}});
  std::unique_ptr<TaskAdapter> secret_a_other_seed = Make({{"seed", "4"}, {"secret", a}});
  std::unique_ptr<TaskAdapter> secret_b = Make({{"seed", "3"}, {"secret", b}});
  int differ_ab = 0, differ_seed = 0;
  for (uint64_t g = 0; g < 20; ++g) {
    EXPECT_EQ(secret_a->TrainPrompt(g).reference, secret_a_other_seed->TrainPrompt(g).reference) << g;
    differ_ab += secret_a->TrainPrompt(g).reference != secret_b->TrainPrompt(g).reference;
    differ_seed += secret_a->TrainPrompt(g).reference != seed_only->TrainPrompt(g).reference;
  }
  EXPECT_EQ(differ_ab, 20);
  EXPECT_EQ(differ_seed, 20);
  for (size_t i = 0; i < seed_only->HeldOut().size(); ++i) {
    EXPECT_EQ(secret_a->HeldOut()[i].reference, seed_only->HeldOut()[i].reference) << i;
    EXPECT_EQ(secret_b->HeldOut()[i].reference, seed_only->HeldOut()[i].reference) << i;
  }
}

TEST(PokerAdapter, PromptFormat) {
  Deal d;
  d.hole[0] = {ParseCard("Qc").value(), ParseCard("Jc").value()};
  d.hole[1] = {ParseCard("Ah").value(), ParseCard("Kd").value()};
  d.board = {ParseCard("Ts").value(), ParseCard("9c").value(), ParseCard("2h").value(), ParseCard("3d").value(),
             ParseCard("4s").value()};
  HandState h(d);
  EXPECT_EQ(PromptText(h, 0), "S6QcJc - 3 ->");
  ASSERT_TRUE(h.Apply(Action::kRaise).ok());
  EXPECT_EQ(PromptText(h, 1), "B6AhKd - 6 R>");
  ASSERT_TRUE(h.Apply(Action::kCall).ok());
  EXPECT_EQ(PromptText(h, 1), "B4AhKd Ts9c2h 8 Rc/>");
  ASSERT_TRUE(h.Apply(Action::kRaise).ok());
  EXPECT_EQ(PromptText(h, 0), "S6QcJc Ts9c2h 10 rC/R>");
  EXPECT_EQ(ParseAnswer("r"), Action::kRaise);
  EXPECT_EQ(ParseAnswer("f"), Action::kFold);
  EXPECT_EQ(ParseAnswer("c"), Action::kCall);
  EXPECT_FALSE(ParseAnswer("").has_value());
  EXPECT_FALSE(ParseAnswer("cc").has_value());
  EXPECT_FALSE(ParseAnswer("C").has_value());
  EXPECT_FALSE(ParseAnswer("call").has_value());
}

// The strength digit reads the player's own cards and the visible board, nothing hidden: the
// opponent's cards and the board cards still to come do not change the prompt; it orders
// hands the way equity does.
TEST(PokerAdapter, StrengthDigitUsesVisibleCardsOnly) {
  auto deal = [](const char* a, const char* b, const char* c, const char* d, std::array<const char*, 5> board) {
    Deal out;
    out.hole[0] = {ParseCard(a).value(), ParseCard(b).value()};
    out.hole[1] = {ParseCard(c).value(), ParseCard(d).value()};
    for (int i = 0; i < 5; ++i) out.board[i] = ParseCard(board[i]).value();
    return out;
  };
  HandState x(deal("Qc", "Jc", "Ah", "Kd", {"Ts", "9c", "2h", "3d", "4s"}));
  HandState y(deal("Qc", "Jc", "7s", "7h", {"Ts", "9c", "2h", "Ad", "Kh"}));  // other hidden cards
  EXPECT_EQ(PromptText(x, 0), PromptText(y, 0));
  for (HandState* h : {&x, &y}) {  // both players check preflop: the flop is the same
    ASSERT_TRUE(h->Apply(Action::kCall).ok());
    ASSERT_TRUE(h->Apply(Action::kCall).ok());
  }
  EXPECT_EQ(PromptText(x, 1).substr(0, 2), std::string("B") + static_cast<char>('0' + StrengthDigit(x, 1)));
  EXPECT_EQ(StrengthDigit(x, 0), StrengthDigit(y, 0));  // open-ended straight draw on Ts9c2h

  HandState aces(deal("Ah", "As", "7c", "2d", {"Kd", "8h", "3c", "5s", "Jd"}));
  EXPECT_EQ(StrengthDigit(aces, 0), 8);  // pocket aces: ~0.85 against a random hand
  EXPECT_EQ(StrengthDigit(aces, 1), 3);  // seven-deuce offsuit: ~0.35
  HandState nuts(deal("Ah", "Kh", "2c", "3c", {"Qh", "Jh", "Th", "4s", "5d"}));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(nuts.Apply(Action::kCall).ok());  // to the river
  ASSERT_EQ(nuts.board_cards_visible(), 5);
  EXPECT_EQ(StrengthDigit(nuts, 0), 9);  // royal flush
}

// Every prompt character is in the alphabet, and so is every answer letter; training prompts
// are deterministic and always give the policy a decision.
TEST(PokerAdapter, AlphabetCoversPromptsAndAnswers) {
  std::unique_ptr<TaskAdapter> task = Make({{"opponent", "random,calling-station,tag"}});
  const std::string alphabet = task->Alphabet();
  EXPECT_EQ(std::set<char>(alphabet.begin(), alphabet.end()).size(), alphabet.size());
  for (char c : std::string("fcr")) EXPECT_NE(alphabet.find(c), std::string::npos);
  FakePolicy policy(RandomLetter);
  for (uint64_t g = 0; g < 300; ++g) {
    const Prompt p = task->TrainPrompt(g);
    EXPECT_EQ(p.text, task->TrainPrompt(g).text);
    EXPECT_EQ(p.reference, task->TrainPrompt(g).reference);
    task->RunGroup(p, 4, policy, g).value();
  }
  for (const std::string& prompt : policy.seen)
    for (char c : prompt) ASSERT_NE(alphabet.find(c), std::string::npos) << "'" << c << "' in " << prompt;
}

// A group is one deal played group_size times in lockstep: one Sample call per decision
// depth, the first decision's prompt equals the group prompt, every episode has a decision.
TEST(PokerAdapter, GroupsAreBatchedDuplicateDeals) {
  std::unique_ptr<TaskAdapter> task = Make({{"opponent", "tag"}});
  for (uint64_t g = 0; g < 50; ++g) {
    const Prompt p = task->TrainPrompt(g);
    FakePolicy policy(RandomLetter);
    const std::vector<Episode> group = task->RunGroup(p, 8, policy, 7).value();
    ASSERT_EQ(group.size(), 8u);
    size_t longest = 0;
    for (const Episode& e : group) {
      ASSERT_GE(e.turns.size(), 1u);
      longest = std::max(longest, e.turns.size());
    }
    EXPECT_EQ(policy.batches.size(), longest);
    EXPECT_EQ(policy.batches[0], 8u);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(policy.seen[i], p.text);
  }
  // A deterministic policy gets identical outcomes for every copy (no reward spread).
  FakePolicy caller(AlwaysCall);
  const std::vector<Episode> same = task->RunGroup(task->TrainPrompt(3), 8, caller, 1).value();
  for (const Episode& e : same) EXPECT_EQ(e.reward, same[0].reward);
}

// The learner re-checks one-decision episodes with Reward(prompt, completion): it must agree
// exactly with what RunGroup played.
TEST(PokerAdapter, RewardMatchesOneDecisionEpisodes) {
  std::unique_ptr<TaskAdapter> task = Make({{"opponent", "random,calling-station,tag"}});
  int checked = 0;
  for (uint64_t g = 0; g < 400; ++g) {
    const Prompt p = task->TrainPrompt(g);
    FakePolicy policy(RandomLetter);
    for (const Episode& e : task->RunGroup(p, 8, policy, g).value()) {
      if (e.turns.size() != 1) continue;
      EXPECT_EQ(task->Reward(p, e.turns[0].text)->reward, e.reward) << p.text << " answer " << e.turns[0].text;
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

// Always calling against the calling station: every hand is checked down for 2 chips each,
// so each hand wins, loses or splits exactly 1 big blind, the duplicate mirror cancels
// exactly, and the policy decides once per street.
TEST(PokerAdapter, AlwaysCallMirrorsTheCallingStation) {
  FakePolicy policy(AlwaysCall);
  std::vector<TableSpec> tables;
  for (uint64_t d = 0; d < 500; ++d)
    for (int seat = 0; seat < 2; ++seat) tables.push_back(TableSpec{d, seat, OpponentKind::kCallingStation});
  const std::vector<PlayedHand> played = PlayHands(tables, policy, 0, RunnerOptions()).value();
  for (size_t i = 0; i < played.size(); ++i) {
    EXPECT_TRUE(played[i].chips == 2 || played[i].chips == 0 || played[i].chips == -2) << played[i].chips;
    EXPECT_EQ(played[i].episode.turns.size(), 4u);
    EXPECT_EQ(played[i].illegal, 0);
    if (i % 2 == 1) {
      EXPECT_EQ(played[i].chips, -played[i - 1].chips);  // the same cards, other seat
    }
  }
  DuplicateOptions o;
  o.hands = 1000;
  Result<DuplicateResult> r = EvaluateDuplicate(policy, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->mbb_per_hand, 0.0);
  EXPECT_EQ(r->ci95_lo, 0.0);
  EXPECT_EQ(r->ci95_hi, 0.0);
  EXPECT_EQ(r->hands, 1000);
  EXPECT_EQ(r->deals, 500);
  EXPECT_EQ(r->decisions, 4000);
  EXPECT_FALSE(EvaluateDuplicate(policy, DuplicateOptions{OpponentKind::kTag, 7}).ok());
}

// Zero-sum: what the policy wins the opponent loses, replayed from the same deal and answers.
TEST(PokerAdapter, RewardsAreZeroSumAndInBigBlinds) {
  FakePolicy policy(RandomLetter);
  std::vector<TableSpec> tables;
  for (uint64_t d = 0; d < 2000; ++d) tables.push_back(TableSpec{d, static_cast<int>(d % 2), OpponentKind::kTag});
  const std::vector<PlayedHand> played = PlayHands(tables, policy, 5, RunnerOptions()).value();
  for (size_t i = 0; i < played.size(); ++i) {
    const PlayedHand& h = played[i];
    EXPECT_EQ(h.episode.reward, h.chips / 2.0);
    EXPECT_EQ(h.episode.success, h.chips > 0);
    EXPECT_LE(std::abs(h.chips), 48);
    // Replay the recorded answers to get the opponent's payoff.
    HandState replay(DealFromSeed(tables[i].deal_seed));
    AdvanceOpponent(replay, tables[i]);
    for (const Turn& t : h.episode.turns) {
      ApplyAnswer(replay, t.text, IllegalAction::kFold);
      AdvanceOpponent(replay, tables[i]);
    }
    ASSERT_TRUE(replay.finished());
    EXPECT_EQ(replay.Payoff(1 - tables[i].policy_seat), -h.chips);
  }
}

TEST(PokerAdapter, IllegalAnswerConsequences) {
  FakePolicy garbage([](const std::string&, uint64_t) { return "x"; });
  const std::vector<TableSpec> tables = {{11, 0, OpponentKind::kCallingStation}, {11, 1, OpponentKind::kCallingStation}};
  // fold: the first answer forfeits the hand, losing the blind.
  std::vector<PlayedHand> folded = PlayHands(tables, garbage, 0, RunnerOptions{IllegalAction::kFold, 0}).value();
  EXPECT_EQ(folded[0].chips, -1);
  EXPECT_EQ(folded[1].chips, -2);  // even though the big blind could check for free
  EXPECT_EQ(folded[0].illegal, 1);
  EXPECT_EQ(folded[0].episode.turns.size(), 1u);
  // call: every answer is taken as check/call, so it plays exactly like always-call.
  std::vector<PlayedHand> called = PlayHands(tables, garbage, 0, RunnerOptions{IllegalAction::kCall, 0}).value();
  FakePolicy caller(AlwaysCall);
  std::vector<PlayedHand> reference = PlayHands(tables, caller, 0, RunnerOptions()).value();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(called[i].chips, reference[i].chips);
    EXPECT_EQ(called[i].illegal, 4);
  }
  // A legal-looking letter at the wrong time is illegal too: "f" with a free check.
  FakePolicy folder([](const std::string&, uint64_t) { return "f"; });
  std::vector<PlayedHand> bb = PlayHands({tables[1]}, folder, 0, RunnerOptions{IllegalAction::kCall, 0}).value();
  EXPECT_EQ(bb[0].illegal, 4);
  EXPECT_EQ(bb[0].chips, reference[1].chips);
  // The adapter applies its option.
  std::unique_ptr<TaskAdapter> task = Make({{"illegal_action", "fold"}, {"opponent", "calling-station"}});
  const Prompt p = task->TrainPrompt(0);
  const TableSpec t = TableOfPrompt(p).value();
  EXPECT_EQ(task->Reward(p, "x")->reward, t.policy_seat == 0 ? -0.5 : -1.0);
  for (const Episode& e : task->RunGroup(p, 3, garbage, 0).value()) EXPECT_EQ(e.reward, t.policy_seat == 0 ? -0.5 : -1.0);
}

TEST(PokerAdapter, DemonstrationsAreLegalFirstActions) {
  std::unique_ptr<TaskAdapter> task = Make({});
  std::set<std::string> seen;
  for (uint64_t g = 0; g < 200; ++g) {
    const Prompt p = task->TrainPrompt(g);
    const std::string demo = task->Demonstration(p);
    seen.insert(demo);
    const TableSpec t = TableOfPrompt(p).value();
    HandState h(DealFromSeed(t.deal_seed));
    AdvanceOpponent(h, t);
    ASSERT_TRUE(ParseAnswer(demo).has_value());
    EXPECT_TRUE(h.IsLegal(*ParseAnswer(demo))) << p.text << " " << demo;
  }
  EXPECT_EQ(seen.size(), 3u);
  // Held-out deals are not training deals.
  std::set<std::string> train;
  for (uint64_t g = 0; g < 1000; ++g) train.insert(task->TrainPrompt(g).reference);
  for (const Prompt& p : task->HeldOut()) EXPECT_EQ(train.count(p.reference), 0u);
}

}  // namespace
}  // namespace echelon::data::poker
