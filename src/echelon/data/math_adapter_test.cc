#include "echelon/data/math_adapter.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "echelon/common/fs.h"
#include "echelon/data/math_jsonl.h"

namespace echelon::data {
namespace {

std::unique_ptr<TaskAdapter> MustCreate(const AdapterOptions& options) {
  Result<std::unique_ptr<TaskAdapter>> a = CreateMathAdapter(options);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return a.ok() ? std::move(a).value() : nullptr;
}

std::string ErrorOf(const AdapterOptions& options) {
  Result<std::unique_ptr<TaskAdapter>> a = CreateMathAdapter(options);
  EXPECT_FALSE(a.ok());
  return a.ok() ? "" : a.status().message();
}

// Recomputes a prompt's answer independently of MathProblem.
std::string Solve(const std::string& text) {
  const size_t op = text.find_first_of("+-");
  const long a = std::stol(text.substr(0, op));
  const long b = std::stol(text.substr(op + 1, text.size() - op - 2));
  return std::to_string(text[op] == '+' ? a + b : a - b);
}

// Returns scripted completions and records how it was called.
class ScriptedPolicy : public Policy {
 public:
  explicit ScriptedPolicy(std::vector<std::string> answers) : answers_(std::move(answers)) {}
  Result<std::vector<Turn>> Sample(const std::vector<PolicyPrompt>& prompts, uint64_t seed) override {
    ++calls;
    seen_prompts.clear();
    for (const PolicyPrompt& p : prompts) seen_prompts.push_back(p.user);
    seen_seed = seed;
    std::vector<Turn> turns;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Turn t;
      t.tokens = {static_cast<int64_t>(i)};
      t.logprobs = {-0.5f};
      t.text = answers_[i % answers_.size()];
      turns.push_back(t);
    }
    return turns;
  }
  int calls = 0;
  std::vector<std::string> seen_prompts;
  uint64_t seen_seed = 0;

 private:
  std::vector<std::string> answers_;
};

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("math_adapter_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = (path_ / name).string();
    EXPECT_TRUE(WriteFileAtomic(p, text).ok());
    return p;
  }

 private:
  std::filesystem::path path_;
};

TEST(MathAdapter, DefaultsGiveFiveHundredDistinctCorrectHeldOutProblems) {
  auto task = MustCreate({});
  ASSERT_TRUE(task);
  EXPECT_EQ(task->name(), "math");
  EXPECT_EQ(task->Alphabet(), "0123456789+-=");
  const std::vector<Prompt>& eval = task->HeldOut();
  ASSERT_EQ(eval.size(), 500u);
  std::set<std::string> texts;
  for (size_t i = 0; i < eval.size(); ++i) {
    EXPECT_EQ(eval[i].id, i);
    EXPECT_EQ(eval[i].reference, Solve(eval[i].text)) << eval[i].text;
    texts.insert(eval[i].text);
  }
  EXPECT_EQ(texts.size(), 500u);
}

TEST(MathAdapter, PromptsUseOnlyTheAlphabetAndOperandsWithinRange) {
  auto task = MustCreate({{"max_operand", "20"}, {"eval_size", "50"}});
  ASSERT_TRUE(task);
  const std::string alphabet = task->Alphabet();
  bool saw_plus = false, saw_negative = false;
  for (uint64_t id = 0; id < 2000; ++id) {
    Prompt p = task->TrainPrompt(id);
    EXPECT_EQ(p.id, id);
    ASSERT_EQ(p.text.back(), '=');
    std::optional<MathProblem> m = ParseMathQuestion(p.text.substr(0, p.text.size() - 1));
    ASSERT_TRUE(m) << p.text;
    EXPECT_LE(m->a, 20);
    EXPECT_LE(m->b, 20);
    EXPECT_EQ(p.reference, Solve(p.text));
    for (char c : p.text + p.reference) EXPECT_NE(alphabet.find(c), std::string::npos) << c;
    saw_plus |= m->op == '+';
    saw_negative |= p.reference[0] == '-';
  }
  EXPECT_TRUE(saw_plus);
  EXPECT_TRUE(saw_negative);
}

TEST(MathAdapter, TrainPromptIsDeterministicInSeedAndGroupId) {
  auto a = MustCreate({{"seed", "7"}});
  auto b = MustCreate({{"seed", "7"}});
  auto c = MustCreate({{"seed", "8"}});
  ASSERT_TRUE(a && b && c);
  int differ = 0;
  for (uint64_t id = 0; id < 1000; ++id) {
    EXPECT_EQ(a->TrainPrompt(id).text, b->TrainPrompt(id).text);
    EXPECT_EQ(a->TrainPrompt(id).text, a->TrainPrompt(id).text);
    differ += a->TrainPrompt(id).text != c->TrainPrompt(id).text;
  }
  EXPECT_GT(differ, 900);  // 20,000 problems: two seeds rarely agree
  EXPECT_NE(a->HeldOut()[0].text + a->HeldOut()[1].text, c->HeldOut()[0].text + c->HeldOut()[1].text);
}

TEST(MathAdapter, TrainingNeverDrawsAHeldOutProblem) {
  // max_operand 9: 200 problems, 100 held out, so a naive draw would collide half the time.
  auto task = MustCreate({{"max_operand", "9"}, {"eval_size", "100"}, {"seed", "3"}});
  ASSERT_TRUE(task);
  std::set<std::string> held;
  for (const Prompt& p : task->HeldOut()) held.insert(p.text);
  ASSERT_EQ(held.size(), 100u);
  std::set<std::string> trained;
  for (uint64_t id = 0; id < 20000; ++id) {
    const std::string text = task->TrainPrompt(id).text;
    ASSERT_EQ(held.count(text), 0u) << "group " << id << " trains on held-out " << text;
    trained.insert(text);
  }
  EXPECT_EQ(trained.size(), 100u);  // and every other problem is trained on
}

TEST(MathAdapter, RewardIsExactMatchOnly) {
  auto task = MustCreate({});
  ASSERT_TRUE(task);
  const Prompt add = MathProblem{37, '+', 48}.ToPrompt(0);
  const Prompt sub = MathProblem{37, '-', 48}.ToPrompt(1);
  EXPECT_EQ(add.text, "37+48=");
  EXPECT_EQ(sub.reference, "-11");
  EXPECT_EQ(task->Reward(add, "85")->reward, 1.0);
  EXPECT_EQ(task->Reward(add, "085")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, " 85")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, "85 ")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, "86")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, "")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, "+85")->reward, 0.0);
  EXPECT_EQ(task->Reward(sub, "-11")->reward, 1.0);
  EXPECT_EQ(task->Reward(sub, "11")->reward, 0.0);
  EXPECT_EQ(task->Reward(sub, "-011")->reward, 0.0);
  EXPECT_EQ(task->Demonstration(sub), "-11");
}

TEST(MathAdapter, RunGroupSamplesOnceAndRewardsEachCompletion) {
  auto task = MustCreate({});
  ASSERT_TRUE(task);
  const Prompt p = MathProblem{37, '+', 48}.ToPrompt(0);
  ScriptedPolicy policy({"85", "085", " 85", "86", "85"});
  std::vector<Episode> group = task->RunGroup(p, 5, policy, /*seed=*/1234).value();
  EXPECT_EQ(policy.calls, 1);
  EXPECT_EQ(policy.seen_seed, 1234u);
  EXPECT_EQ(policy.seen_prompts, std::vector<std::string>(5, "37+48="));
  ASSERT_EQ(group.size(), 5u);
  const double rewards[] = {1, 0, 0, 0, 1};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(group[i].reward, rewards[i]) << i;
    EXPECT_EQ(group[i].success, rewards[i] == 1.0) << i;
    ASSERT_EQ(group[i].turns.size(), 1u);
    EXPECT_EQ(group[i].turns[0].tokens, std::vector<int64_t>{i});  // the turn is kept
  }
  EXPECT_TRUE(task->RunGroup(p, 0, policy, 1).value().empty());
  EXPECT_EQ(policy.calls, 1);
}

TEST(MathAdapter, LastNumberAnswersCountTheLastIntegerOfTheCompletion) {
  auto task = MustCreate({{"answer", "last_number"}});
  ASSERT_TRUE(task);
  const Prompt add = MathProblem{37, '+', 48}.ToPrompt(0);
  const Prompt sub = MathProblem{37, '-', 48}.ToPrompt(1);
  const Prompt zero = MathProblem{5, '-', 5}.ToPrompt(2);
  EXPECT_EQ(task->Reward(add, "85")->reward, 1.0);
  EXPECT_EQ(task->Reward(add, "37 + 48 = 85.")->reward, 1.0);
  EXPECT_EQ(task->Reward(add, "The answer is 085")->reward, 1.0);
  EXPECT_EQ(task->Reward(add, "85, not 86")->reward, 0.0) << "the last number counts";
  EXPECT_EQ(task->Reward(add, "8 5")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, "no number")->reward, 0.0);
  EXPECT_EQ(task->Reward(add, "")->reward, 0.0);
  EXPECT_EQ(task->Reward(sub, "It is -11")->reward, 1.0);
  EXPECT_EQ(task->Reward(sub, "It is - 11")->reward, 0.0) << "a sign must touch its digits";
  EXPECT_EQ(task->Reward(sub, "11")->reward, 0.0);
  EXPECT_EQ(task->Reward(zero, "-0")->reward, 1.0);
  EXPECT_EQ(task->Reward(zero, "0")->reward, 1.0);
  const std::string err = ErrorOf({{"answer", "fuzzy"}});
  EXPECT_NE(err.find("answer: expected exact or last_number, got \"fuzzy\""), std::string::npos) << err;
}

TEST(MathAdapterOptions, UnknownOptionIsRejectedWithTheKnownOnes) {
  const std::string err = ErrorOf({{"max_operands", "9"}});
  EXPECT_NE(err.find("\"max_operands\""), std::string::npos) << err;
  EXPECT_NE(err.find("answer, eval_file, eval_size, max_operand, seed, train_file"), std::string::npos)
      << err;
}

TEST(MathAdapterOptions, BadValuesNameTheOptionAndTheExpectedRange) {
  struct Case { std::string key, value, expect; };
  const Case cases[] = {
      {"max_operand", "abc", "max_operand: expected an integer in 1..999999999"},
      {"max_operand", "0", "max_operand: expected an integer in 1..999999999"},
      {"max_operand", "-5", "got \"-5\""},
      {"max_operand", "1000000000", "max_operand"},
      {"seed", "x", "seed: expected an integer in 0..18446744073709551615"},
      {"seed", "18446744073709551616", "seed"},
      {"eval_size", "0", "eval_size: expected an integer in 1..10000"},
      {"eval_size", "10001", "half of the 20000 problems"},
      {"eval_size", "", "eval_size"},
  };
  for (const Case& c : cases) {
    const std::string err = ErrorOf({{c.key, c.value}});
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.key << "=" << c.value << ": " << err;
  }
  EXPECT_TRUE(CreateMathAdapter({{"eval_size", "10000"}}).ok());
  EXPECT_TRUE(CreateMathAdapter({{"seed", "18446744073709551615"}}).ok());
}

TEST(MathJsonl, WriteThenReadRoundTrips) {
  TempDir dir;
  const std::vector<Prompt> prompts = {MathProblem{37, '+', 48}.ToPrompt(0),
                                       MathProblem{3, '-', 40}.ToPrompt(1)};
  const std::string path = dir.Write("p.jsonl", "");
  ASSERT_TRUE(WriteMathJsonl(path, prompts).ok());
  EXPECT_EQ(ReadFile(path).value(),
            "{\"answer\":\"85\",\"question\":\"37+48\"}\n{\"answer\":\"-37\",\"question\":\"3-40\"}\n");
  Result<std::vector<Prompt>> back = ReadMathJsonl(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ(back.value()[1].text, "3-40=");
  EXPECT_EQ(back.value()[1].reference, "-37");
  EXPECT_EQ(back.value()[1].id, 2u);  // 1-based line number
}

TEST(MathJsonl, MalformedLinesNameFileLineAndExpectation) {
  TempDir dir;
  const std::string good = R"({"question": "1+2", "answer": "3"})";
  struct Case { std::string line, expect; };
  const Case cases[] = {
      {R"({"question": "1+2")", "not valid JSON"},
      {R"(["1+2", "3"])", "not a JSON object"},
      {R"({"question": "1+2"})", "missing field \"answer\""},
      {R"({"answer": "3"})", "missing field \"question\""},
      {R"({"question": "1+2", "answer": 3})", "field \"answer\" must be a string"},
      {R"({"question": 12, "answer": "3"})", "field \"question\" must be a string"},
      {R"({"question": "1*2", "answer": "2"})", "is not A+B or A-B"},
      {R"({"question": "1 + 2", "answer": "3"})", "is not A+B or A-B"},
      {R"({"question": "a+b", "answer": "3"})", "is not A+B or A-B"},
      {R"({"question": "-1+2", "answer": "1"})", "is not A+B or A-B"},
      {R"({"question": "1+2", "answer": "three"})", "not an integer"},
      {R"({"question": "1+2", "answer": "4"})", "is wrong"},
      {R"({"question": "1+2", "answer": "03"})", "\"3\""},
  };
  for (const Case& c : cases) {
    const std::string path = dir.Write("bad.jsonl", good + "\n\n" + c.line + "\n" + good + "\n");
    Result<std::vector<Prompt>> r = ReadMathJsonl(path);
    ASSERT_FALSE(r.ok()) << c.line;
    const std::string& err = r.status().message();
    EXPECT_NE(err.find(path + ":3: "), std::string::npos) << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
  }
}

TEST(MathJsonl, EmptyOrMissingFileIsAnError) {
  TempDir dir;
  for (const std::string text : {"", "\n  \n"}) {
    const std::string path = dir.Write("empty.jsonl", text);
    Result<std::vector<Prompt>> r = ReadMathJsonl(path);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(path + ": no problems"), std::string::npos)
        << r.status().message();
  }
  EXPECT_FALSE(ReadMathJsonl(dir.Write("x", "") + ".missing").ok());
}

std::string Lines(const std::vector<std::string>& questions) {
  std::string out;
  for (const std::string& q : questions) {
    out += "{\"question\": \"" + q + "\", \"answer\": \"" + Solve(q + "=") + "\"}\n";
  }
  return out;
}

TEST(MathAdapterJsonl, CyclesTrainLinesInASeededShuffleAndHoldsOutTheEvalFile) {
  TempDir dir;
  const std::vector<std::string> train = {"1+1", "2+2", "3+3", "4-9", "5+5", "6+6", "7-7", "8+8"};
  const std::string train_path = dir.Write("train.jsonl", Lines(train));
  const std::string eval_path = dir.Write("eval.jsonl", Lines({"10+20", "30-45"}));
  auto task = MustCreate({{"train_file", train_path}, {"eval_file", eval_path}, {"seed", "1"}});
  ASSERT_TRUE(task);
  ASSERT_EQ(task->HeldOut().size(), 2u);
  EXPECT_EQ(task->HeldOut()[1].text, "30-45=");
  EXPECT_EQ(task->HeldOut()[1].reference, "-15");
  EXPECT_EQ(task->HeldOut()[1].id, 1u);
  std::set<std::string> epoch;
  std::vector<std::string> order;
  for (uint64_t id = 0; id < 8; ++id) {
    Prompt p = task->TrainPrompt(id);
    EXPECT_EQ(p.id, id);
    EXPECT_EQ(p.reference, Solve(p.text));
    EXPECT_EQ(task->TrainPrompt(id + 8).text, p.text);  // cycles
    epoch.insert(p.text.substr(0, p.text.size() - 1));
    order.push_back(p.text);
  }
  EXPECT_EQ(epoch, std::set<std::string>(train.begin(), train.end()));  // a permutation
  int other_orders = 0;
  for (const char* seed : {"2", "3", "4"}) {
    auto other = MustCreate({{"train_file", train_path}, {"eval_file", eval_path}, {"seed", seed}});
    ASSERT_TRUE(other);
    std::vector<std::string> o;
    for (uint64_t id = 0; id < 8; ++id) o.push_back(other->TrainPrompt(id).text);
    other_orders += o != order;
  }
  EXPECT_GT(other_orders, 0);
}

TEST(MathAdapterJsonl, ErrorsNameTheOptionFileAndLine) {
  TempDir dir;
  const std::string eval = dir.Write("eval.jsonl", Lines({"10+20"}));
  const std::string train = dir.Write("train.jsonl", Lines({"1+1", "10+20"}));
  std::string err = ErrorOf({{"train_file", train}, {"eval_file", eval}});
  EXPECT_NE(err.find(train + ":2: question \"10+20\" is also in eval_file"), std::string::npos)
      << err;
  err = ErrorOf({{"train_file", train}});
  EXPECT_NE(err.find("train_file needs eval_file"), std::string::npos) << err;
  err = ErrorOf({{"eval_file", eval}, {"eval_size", "10"}});
  EXPECT_NE(err.find("eval_size and eval_file are exclusive"), std::string::npos) << err;
  const std::string bad = dir.Write("bad.jsonl", Lines({"1+1"}) + "{\"question\": \"2+2\"}\n");
  err = ErrorOf({{"eval_file", bad}});
  EXPECT_NE(err.find("math task eval_file: " + bad + ":2: missing field \"answer\""),
            std::string::npos)
      << err;
}

TEST(MathAdapterJsonl, GeneratedTrainingAvoidsEvalFileProblems) {
  TempDir dir;
  // max_operand 3: 32 problems; hold out 12 of them (written non-canonically for some).
  const std::string eval = dir.Write(
      "eval.jsonl", Lines({"0+0", "1+2", "3-3", "2-1", "03+1", "0-3", "1+1", "2+3", "3+0",
                           "1-2", "2-2", "3+3", "50+50"}));
  auto task = MustCreate({{"eval_file", eval}, {"max_operand", "3"}});
  ASSERT_TRUE(task);
  EXPECT_EQ(task->HeldOut().size(), 13u);
  std::set<std::string> trained;
  for (uint64_t id = 0; id < 5000; ++id) {
    const std::string q = task->TrainPrompt(id).text;
    for (const Prompt& h : task->HeldOut()) ASSERT_NE(q, h.text);
    ASSERT_NE(q, "3+1=");  // the canonical form of "03+1"
    trained.insert(q);
  }
  EXPECT_EQ(trained.size(), 32u - 12u);
}

}  // namespace
}  // namespace echelon::data
