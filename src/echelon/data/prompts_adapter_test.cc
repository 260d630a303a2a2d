#include "echelon/data/prompts_adapter.h"

#include <gtest/gtest.h>

#include <set>

#include "echelon/common/testing.h"

namespace echelon::data {
namespace {

class PromptsAdapterTest : public TempDirTest {
 protected:
  // n rows in verl's layout: "What is i+1?" -> i+1.
  std::string Rows(int n) {
    std::string out;
    for (int i = 0; i < n; ++i)
      out += R"({"data_source": "toy", "prompt": [{"role": "user", "content": "What is )" + std::to_string(i) +
             R"(+1?"}], "reward_model": {"style": "rule", "ground_truth": ")" + std::to_string(i + 1) +
             R"("}, "extra_info": {"index": )" + std::to_string(i) + "}}\n";
    return out;
  }
  std::string Error(const AdapterOptions& o) {
    Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter(o);
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  }
};

TEST_F(PromptsAdapterTest, ReadsVerlRowsAndHoldsOutASeededFraction) {
  const std::string train = Write("train.jsonl", Rows(40));
  Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter({{"train_file", train}, {"eval_fraction", "0.25"}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  const TaskAdapter& task = *t.value();
  EXPECT_TRUE(task.ReadyToTrain().ok());
  ASSERT_EQ(task.HeldOut().size(), 10u);
  std::set<std::string> held;
  for (const Prompt& p : task.HeldOut()) held.insert(p.text);
  // Training prompts cycle through the other 30 rows, never a held-out one.
  std::set<std::string> trained;
  for (uint64_t g = 0; g < 30; ++g) {
    const Prompt p = task.TrainPrompt(g);
    EXPECT_EQ(p.id, g);
    EXPECT_EQ(held.count(p.text), 0u) << p.text;
    trained.insert(p.text);
    EXPECT_EQ(task.TrainPrompt(g + 30).text, p.text);
  }
  EXPECT_EQ(trained.size(), 30u);
  const Prompt p = task.TrainPrompt(3);
  const std::string i = p.text.substr(8, p.text.find('+') - 8);
  EXPECT_EQ(p.reference, std::to_string(std::stoi(i) + 1));
  EXPECT_EQ(task.Reward(p, "It is \\boxed{" + p.reference + "}")->reward, 1.0);
  EXPECT_EQ(task.Reward(p, "It is \\boxed{0}")->reward, 0.0);
  // Another seed holds out other rows.
  Result<std::unique_ptr<TaskAdapter>> t2 =
      CreatePromptsAdapter({{"train_file", train}, {"eval_fraction", "0.25"}, {"seed", "1"}});
  ASSERT_TRUE(t2.ok());
  std::set<std::string> held2;
  for (const Prompt& q : t2.value()->HeldOut()) held2.insert(q.text);
  EXPECT_NE(held, held2);
}

TEST_F(PromptsAdapterTest, ExportedHeldOutRowsReadBackAsTheEvalFile) {
  const std::string train = Write("train.jsonl", Rows(20));
  Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter({{"train_file", train}});
  ASSERT_TRUE(t.ok());
  const std::string exported = (dir_ / "heldout.jsonl").string();
  ASSERT_TRUE(t.value()->ExportHeldOut(exported).ok());
  Result<std::unique_ptr<TaskAdapter>> e = CreatePromptsAdapter({{"eval_file", exported}});
  ASSERT_TRUE(e.ok()) << e.status().message();
  ASSERT_EQ(e.value()->HeldOut().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(e.value()->HeldOut()[i].text, t.value()->HeldOut()[i].text);
    EXPECT_EQ(e.value()->HeldOut()[i].reference, t.value()->HeldOut()[i].reference);
  }
  // Held-out rows only: not enough to train.
  EXPECT_NE(e.value()->ReadyToTrain().message().find("set task.train_file"), std::string::npos);
}

TEST_F(PromptsAdapterTest, PlainStringPromptsAndAnswerField) {
  const std::string f = Write("plain.jsonl", "{\"prompt\": \"2+2=\", \"answer\": 4}\n\n{\"prompt\": \"3+3=\", \"answer\": \"6\"}\n");
  Result<std::vector<PromptRow>> rows = ReadPromptRows(f);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ(rows.value()[0].prompt.text, "2+2=");
  EXPECT_EQ(rows.value()[0].prompt.reference, "4");
  EXPECT_EQ(rows.value()[1].prompt.id, 3u);  // its line
}

TEST_F(PromptsAdapterTest, ASystemMessageTravelsWithThePrompt) {
  const std::string f = Write("chat.jsonl", R"({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2=?"}], "answer": 4})"
                                            "\n");
  Result<std::vector<PromptRow>> rows = ReadPromptRows(f);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  EXPECT_EQ(rows.value()[0].prompt.system, "Be brief.");
  EXPECT_EQ(rows.value()[0].prompt.text, "2+2=?");
  const PolicyPrompt p = PolicyPrompt::Of(rows.value()[0].prompt);
  EXPECT_EQ(p.system, "Be brief.");
  EXPECT_EQ(p.user, "2+2=?");
  // A character tokenizer's alphabet covers the system message too.
  Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter({{"eval_file", f}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_NE(t.value()->Alphabet().find('B'), std::string::npos);
  EXPECT_NE(t.value()->Alphabet().find('\n'), std::string::npos);  // the line between them
}

TEST_F(PromptsAdapterTest, BadRowsNameFileLineAndField) {
  struct Case {
    std::string row;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"answer": "1"})", "missing field \"prompt\""},
      {R"({"prompt": 5, "answer": "1"})", "field \"prompt\": must be a string or a list of chat messages"},
      {R"({"prompt": "", "answer": "1"})", "field \"prompt\": empty"},
      {R"({"prompt": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}], "answer": "1"})",
       "holds 3 messages; supported are one user message, or a system message then a user message"},
      {R"({"prompt": [], "answer": "1"})", "holds 0 messages"},
      {R"({"prompt": [{"role": "user", "content": "be brief"}, {"role": "user", "content": "hi"}], "answer": "1"})",
       "field \"prompt[0].role\": \"user\", expected \"system\""},
      {R"({"prompt": [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}], "answer": "1"})",
       "field \"prompt[0].content\": empty"},
      {R"({"prompt": [{"role": "assistant", "content": "hi"}], "answer": "1"})", "field \"prompt[0].role\": \"assistant\""},
      {R"({"prompt": [{"content": "hi"}], "answer": "1"})", "field \"prompt[0]\": must be {\"role\""},
      {R"({"prompt": "hi"})", "missing field \"reward_model.ground_truth\" (or \"answer\")"},
      {R"({"prompt": "hi", "reward_model": {"style": "rule"}})", "field \"reward_model\": must be an object with"},
      {R"({"prompt": "hi", "reward_model": {"ground_truth": ["1", "2"]}})",
       "field \"reward_model.ground_truth\": must be a string or a number"},
      {R"({"prompt": "hi", "answer": "  "})", "field \"answer\": the ground truth is empty"},
      {R"({"prompt": "hi", "answer": "1", "data_source": 7})", "field \"data_source\": must be a string"},
  };
  for (const Case& c : cases) {
    const std::string f = Write("bad.jsonl", Rows(2) + c.row + "\n");
    const std::string m = Error({{"train_file", f}});
    EXPECT_NE(m.find(f + ":3: "), std::string::npos) << m;
    EXPECT_NE(m.find(c.message), std::string::npos) << m;
  }
}

// A row of a Parquet file that is not a prompt is named by its row number, with the message its
// JSONL twin's line gets (verl.jsonl's row 5 has a null ground truth).
TEST_F(PromptsAdapterTest, ABadParquetRowIsNamedAsItsJsonlLineIs) {
  const std::string dir = std::string(ECHELON_TEST_DATA) + "/parquet/";
  const std::string jsonl = Error({{"train_file", dir + "verl.jsonl"}});
  const std::string prefix = dir + "verl.jsonl:5: ";
  ASSERT_EQ(jsonl.find(prefix), 0u) << jsonl;
  for (const char* name : {"verl_snappy", "verl_zstd", "verl_gzip_delta", "verl_hyparquet"}) {
    const std::string m = Error({{"train_file", dir + name + ".parquet"}});
    EXPECT_EQ(m, dir + name + ".parquet: row 5: " + jsonl.substr(prefix.size())) << name;
  }
}

TEST_F(PromptsAdapterTest, BadFilesAndOptionsSayWhat) {
  EXPECT_NE(Error({{"train_file", Write("empty.jsonl", "\n\n")}}).find("empty.jsonl: no rows"), std::string::npos);
  const std::string parquet = Write("data.parquet", "PAR1....");
  const std::string m = Error({{"train_file", parquet}});
  EXPECT_EQ(m.rfind(parquet + ": ", 0), 0u) << m;
  EXPECT_NE(m.find("Parquet"), std::string::npos) << m;
  EXPECT_NE(Error({{"train_file", Write("disguised.jsonl", "PAR1....")}}).find("Parquet"), std::string::npos);
  EXPECT_NE(Error({{"train_file", (dir_ / "missing.jsonl").string()}}).find("missing.jsonl"), std::string::npos);
  const std::string train = Write("train.jsonl", Rows(4));
  EXPECT_NE(Error({{"train_file", train}, {"eval_fraction", "0.7"}}).find("expected a number in (0, 0.5]"),
            std::string::npos);
  EXPECT_NE(Error({{"train_file", train}, {"eval_fraction", "abc"}}).find("eval_fraction"), std::string::npos);
  EXPECT_NE(Error({{"train_file", Write("one.jsonl", Rows(1))}}).find("leaves none to train on"), std::string::npos);
  EXPECT_NE(Error({{"train_file", train}, {"reward", "maths"}}).find("unknown verifier"), std::string::npos);
  EXPECT_NE(Error({{"train_file", train}, {"answer", "exact"}}).find("unknown option \"answer\""), std::string::npos);
  EXPECT_NE(Error({{"train_file", train}, {"eval_file", train}, {"eval_fraction", "0.1"}}).find("exclusive"),
            std::string::npos);
}

// The user's Python function gets the row's data_source, ground truth and extra_info; a
// dict's other keys come back as metrics; weighted with the built-in verifiers.
TEST_F(PromptsAdapterTest, PythonRewardGetsTheRowAndReportsMetrics) {
  const std::string train = Write("train.jsonl", Rows(10));
  const std::string py = Write("r.py", R"PY(
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "toy", data_source
    right = solution_str.strip() == ground_truth
    return {"score": 1.0 if right else 0.0, "index": extra_info["index"], "length": len(solution_str)}
)PY");
  Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter(
      {{"train_file", train}, {"python_file", py}, {"reward", "python + 0.5*exact"}, {"eval_fraction", "0.2"}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  const TaskAdapter& task = *t.value();
  EXPECT_TRUE(task.ReadyToTrain().ok());
  EXPECT_FALSE(task.ActorsCanScore());
  const Prompt p = task.TrainPrompt(0);
  const std::string index = p.text.substr(8, p.text.find('+') - 8);
  Result<Scored> right = task.Reward(p, p.reference);
  ASSERT_TRUE(right.ok()) << right.status().message();
  EXPECT_EQ(right->reward, 1.5);
  EXPECT_EQ(right->metrics, (std::map<std::string, double>{{"index", std::stod(index)},
                                                            {"length", static_cast<double>(p.reference.size())}}));
  EXPECT_EQ(task.Reward(p, "nope")->reward, 0.0);
}

TEST_F(PromptsAdapterTest, PythonRewardErrorsStopOrScoreZeroAsConfigured) {
  const std::string train = Write("train.jsonl", Rows(10));
  const std::string py = Write("r.py", "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    return 1 / int(solution_str == ground_truth)\n");
  Result<std::unique_ptr<TaskAdapter>> fail =
      CreatePromptsAdapter({{"train_file", train}, {"python_file", py}, {"reward", "python"}});
  ASSERT_TRUE(fail.ok()) << fail.status().message();
  const Prompt p = fail.value()->TrainPrompt(0);
  Result<Scored> e = fail.value()->Reward(p, "wrong");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find(py + ":2: ZeroDivisionError"), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("solution_str \"wrong\""), std::string::npos) << e.status().message();
  Result<std::unique_ptr<TaskAdapter>> zero = CreatePromptsAdapter(
      {{"train_file", train}, {"python_file", py}, {"reward", "python"}, {"reward_on_error", "zero"}});
  ASSERT_TRUE(zero.ok()) << zero.status().message();
  Result<Scored> z = zero.value()->Reward(p, "wrong");
  ASSERT_TRUE(z.ok()) << z.status().message();
  EXPECT_EQ(z->reward, 0.0);
  EXPECT_EQ(z->metrics.at("python_errors"), 1.0);
  EXPECT_EQ(zero.value()->Reward(p, p.reference)->metrics.at("python_errors"), 0.0);
}

// A group whose texts spend task.reward_group_seconds is refused (ResourceExhausted) even under
// reward_on_error: zero, where a slow text used to score 0 and cost its worker nothing.
TEST_F(PromptsAdapterTest, AGroupPastTheRewardBudgetIsRefusedWhateverRewardOnErrorSays) {
  const std::string train = Write("train.jsonl", Rows(10));
  const std::string py = Write("slow.py", "import time\n"
                                          "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                          "    time.sleep(0.6 if solution_str == 'slow' else 0)\n"
                                          "    return 1.0\n");
  Result<std::unique_ptr<TaskAdapter>> t =
      CreatePromptsAdapter({{"train_file", train}, {"python_file", py}, {"reward", "python"},
                            {"reward_on_error", "zero"}, {"reward_group_seconds", "1"}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  const Prompt p = t.value()->TrainPrompt(0);
  Result<std::vector<Scored>> slow = t.value()->RewardGroup(p, {"slow", "slow", "slow", "slow"});
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), StatusCode::kResourceExhausted) << slow.status().message();
  Result<std::vector<Scored>> quick = t.value()->RewardGroup(p, {"a", "b", "c", "d"});
  ASSERT_TRUE(quick.ok()) << quick.status().message();
  EXPECT_EQ(quick->size(), 4u);
  EXPECT_NE(Error({{"train_file", train}, {"python_file", py}, {"reward", "python"}, {"reward_group_seconds", "-1"}})
                .find("reward_group_seconds"),
            std::string::npos);
}

TEST_F(PromptsAdapterTest, PythonOptionsSayWhatIsMissing) {
  const std::string train = Write("train.jsonl", Rows(10));
  const std::string py = Write("r.py", "def compute_score(**kw):\n    return 0\n");
  EXPECT_NE(Error({{"train_file", train}, {"python_file", py}}).find("task.reward does not use it"), std::string::npos);
  EXPECT_NE(Error({{"train_file", train}, {"python_file", py}, {"reward", "python"}, {"reward_on_error", "skip"}})
                .find("reward_on_error: expected fail or zero"),
            std::string::npos);
  EXPECT_NE(Error({{"train_file", train}, {"python_file", py}, {"reward", "python"}, {"python_function", "score"}})
                .find("defines no function score"),
            std::string::npos);
  // Without python_file (an actor's adapter) the python term scores 0 and training is refused.
  Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter({{"train_file", train}, {"reward", "python"}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_NE(t.value()->ReadyToTrain().message().find("set task.python_file"), std::string::npos);
}

// An actor's adapter (no files: prompts come with the work) scores and plays, and says it
// cannot train.
TEST_F(PromptsAdapterTest, WithoutFilesItScoresButCannotTrain) {
  Result<std::unique_ptr<TaskAdapter>> t = CreatePromptsAdapter({{"reward", "exact"}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t.value()->Reward(Prompt{0, "q", "42"}, "42")->reward, 1.0);
  EXPECT_FALSE(t.value()->ReadyToTrain().ok());
}

}  // namespace
}  // namespace echelon::data
