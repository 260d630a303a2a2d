#include "echelon/data/http_env.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <mutex>
#include <set>

#include "echelon/common/listen_thread.h"
#include "echelon/common/testing.h"

namespace echelon::data {
namespace {

using nlohmann::json;

// A guessing game on a random loopback port: the secret digit is seed % 10, three guesses;
// a right guess scores 1 and ends the episode, a wrong one 0.1 if it is a digit, else 0.
// `mangle` may rewrite any answer (to test what the adapter refuses).
class GuessEnv {
 public:
  GuessEnv() {
    server_.Post("/reset", [this](const httplib::Request& q, httplib::Response& r) {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t seed = json::parse(q.body).at("seed").get<uint64_t>();
      const int id = next_++;
      sessions_[id] = {static_cast<int>(seed % 10), 0};
      ++resets;
      Answer(r, "/reset", {{"session", std::to_string(id)}, {"observation", "Guess 0-9:"}});
    });
    server_.Post("/step", [this](const httplib::Request& q, httplib::Response& r) {
      std::lock_guard<std::mutex> lock(mu_);
      const json body = json::parse(q.body);
      Session& s = sessions_.at(std::stoi(body.at("session").get<std::string>()));
      const std::string action = body.at("action").get<std::string>();
      ++s.guesses;
      const bool digit = !action.empty() && action[0] >= '0' && action[0] <= '9';
      const bool right = digit && action[0] - '0' == s.secret;
      const bool done = right || s.guesses == 3;
      json a = {{"reward", right ? 1.0 : digit ? 0.1 : 0.0}, {"done", done}};
      if (!done) a["observation"] = std::string(digit && action[0] - '0' < s.secret ? "Higher:" : "Lower:");
      if (done) a["metrics"] = {{"guesses", s.guesses}};
      Answer(r, "/step", a);
    });
    server_.Post("/close", [this](const httplib::Request&, httplib::Response& r) {
      ++closes;
      r.set_content("{}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    listen_.Start(&server_);
  }
  ~GuessEnv() { listen_.Stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::function<void(const std::string& endpoint, json* answer)> mangle;
  std::atomic<int> resets{0};
  std::atomic<int> closes{0};

 private:
  struct Session {
    int secret = 0;
    int guesses = 0;
  };
  void Answer(httplib::Response& r, const std::string& endpoint, json a) {
    if (mangle) mangle(endpoint, &a);
    r.set_content(a.dump(), "application/json");
  }

  std::mutex mu_;
  std::map<int, Session> sessions_;
  int next_ = 0;
  httplib::Server server_;
  int port_ = 0;
  ListenThread<httplib::Server> listen_;
};

// Answers each prompt with the next scripted action of its position in the batch, and records
// every batch of prompts.
class ScriptedPolicy : public Policy {
 public:
  explicit ScriptedPolicy(std::function<std::string(size_t call, size_t i)> answer) : answer_(std::move(answer)) {}
  Result<std::vector<Turn>> Sample(const std::vector<PolicyPrompt>& prompts, uint64_t) override {
    std::vector<Turn> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Turn t;
      t.text = answer_(batches.size(), i);
      t.tokens = {1};
      t.logprobs = {-0.5f};
      out.push_back(t);
    }
    batches.emplace_back();
    for (const PolicyPrompt& p : prompts) batches.back().push_back(p.user);
    return out;
  }
  std::vector<std::vector<std::string>> batches;

 private:
  std::function<std::string(size_t, size_t)> answer_;
};

std::unique_ptr<TaskAdapter> Make(const AdapterOptions& options) {
  Result<std::unique_ptr<TaskAdapter>> a = CreateAdapter("http-env", options);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return a.ok() ? std::move(a).value() : nullptr;
}

TEST(HttpEnv, PlaysTheGroupTurnByTurnAndSumsStepRewards) {
  GuessEnv env;
  auto task = Make({{"server", env.url()}, {"seed", "10"}});
  const Prompt p = task->TrainPrompt(7);  // seed 17: the secret is 7
  EXPECT_EQ(p.reference, "17");
  // Episode 0 guesses 7 at once; episode 1 says x, 3, 7; episode 2 never guesses right.
  ScriptedPolicy policy([](size_t call, size_t i) -> std::string {
    if (call == 0) return i == 0 ? "7" : i == 1 ? "x" : "1";
    if (call == 1) return i == 0 ? "3" : "2";
    return i == 0 ? "7" : "0";
  });
  Result<std::vector<Episode>> got = task->RunGroup(p, 3, policy, 1);
  ASSERT_TRUE(got.ok()) << got.status().message();
  const std::vector<Episode>& e = got.value();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].turns.size(), 1u);
  EXPECT_DOUBLE_EQ(e[0].reward, 1.0);
  EXPECT_TRUE(e[0].success);
  EXPECT_EQ(e[1].turns.size(), 3u);
  EXPECT_DOUBLE_EQ(e[1].reward, 0.0 + 0.1 + 1.0);
  EXPECT_EQ(e[2].turns.size(), 3u);
  EXPECT_DOUBLE_EQ(e[2].reward, 0.3);
  EXPECT_FALSE(e[2].success);
  EXPECT_EQ(e[1].metrics, (std::map<std::string, double>{{"guesses", 3}}));
  // One policy call per turn for the episodes still going, each seeing its own observation.
  ASSERT_EQ(policy.batches.size(), 3u);
  EXPECT_EQ(policy.batches[0], (std::vector<std::string>{"Guess 0-9:", "Guess 0-9:", "Guess 0-9:"}));
  EXPECT_EQ(policy.batches[1], (std::vector<std::string>{"Lower:", "Higher:"}));  // "x" is no digit: "Lower:"
  EXPECT_EQ(policy.batches[2].size(), 2u);
  EXPECT_EQ(env.closes.load(), 0);
}

TEST(HttpEnv, ReplayGivesTheEnvironmentsRewardAndObservationsNotTheActors) {
  GuessEnv env;
  auto task = Make({{"server", env.url()}});
  const Prompt p = task->TrainPrompt(4);
  Result<std::optional<Replay>> replay = task->ReplayEpisode(p, {"1", "9", "4"});
  ASSERT_TRUE(replay.ok()) << replay.status().message();
  ASSERT_TRUE(replay->has_value());
  EXPECT_DOUBLE_EQ(replay.value()->scored.reward, 1.2);
  EXPECT_EQ(replay.value()->scored.metrics, (std::map<std::string, double>{{"guesses", 3}}));
  ASSERT_EQ(replay.value()->prompts.size(), 3u);
  EXPECT_EQ(replay.value()->prompts[0].user, "Guess 0-9:");
  EXPECT_EQ(replay.value()->prompts[1].user, "Higher:");
  EXPECT_EQ(replay.value()->prompts[2].user, "Lower:");
  // Actions after the end are not taken: two prompts fewer than actions; a one-turn episode
  // scores the same way.
  replay = task->ReplayEpisode(p, {"4", "4", "4"});
  EXPECT_DOUBLE_EQ(replay.value()->scored.reward, 1.0);
  EXPECT_EQ(replay.value()->prompts.size(), 1u);
  EXPECT_DOUBLE_EQ(task->Reward(p, "4").value().reward, 1.0);
  EXPECT_DOUBLE_EQ(task->Reward(p, "x").value().reward, 0.0);
  // No action at all: an episode cut before its first step is closed and scores 0.
  replay = task->ReplayEpisode(p, {});
  EXPECT_DOUBLE_EQ(replay.value()->scored.reward, 0.0);
  EXPECT_TRUE(replay.value()->prompts.empty());
  EXPECT_EQ(env.closes.load(), 2);  // "x" (one guess of three) and the empty one
}

TEST(HttpEnv, MaxTurnsCutsAndClosesTheEpisode) {
  GuessEnv env;
  auto task = Make({{"server", env.url()}, {"max_turns", "2"}});
  ScriptedPolicy policy([](size_t, size_t) { return "x"; });
  Result<std::vector<Episode>> got = task->RunGroup(task->TrainPrompt(3), 2, policy, 0);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got.value()[0].turns.size(), 2u);
  EXPECT_EQ(env.closes.load(), 2);
  // The replay stops at max_turns too: a third action is not taken.
  EXPECT_EQ(task->ReplayEpisode(task->TrainPrompt(3), {"x", "x", "3"}).value()->prompts.size(), 2u);
}

TEST(HttpEnv, BadAnswersNameTheEndpointAndWhatCameBack) {
  GuessEnv env;
  auto task = Make({{"server", env.url()}});
  ScriptedPolicy policy([](size_t, size_t) { return "x"; });
  const auto error = [&](std::function<void(const std::string&, json*)> mangle) {
    env.mangle = std::move(mangle);
    Result<std::vector<Episode>> got = task->RunGroup(task->TrainPrompt(0), 1, policy, 0);
    EXPECT_FALSE(got.ok());
    return got.ok() ? std::string() : got.status().message();
  };
  std::string m = error([](const std::string& e, json* a) {
    if (e == "/step") (*a)["reward"] = "high";
  });
  EXPECT_NE(m.find("environment POST " + env.url() + "/step: expected \"reward\" (a finite number) in the answer, got {"),
            std::string::npos) << m;
  m = error([](const std::string& e, json* a) {
    if (e == "/reset") a->erase("observation");
  });
  EXPECT_NE(m.find("/reset: expected \"observation\" (a string)"), std::string::npos) << m;
  m = error([](const std::string& e, json* a) {
    if (e == "/step") (*a)["done"] = 1;
  });
  EXPECT_NE(m.find("\"done\" (true or false)"), std::string::npos) << m;
  m = error([](const std::string& e, json* a) {
    if (e == "/step") (*a)["metrics"] = {{"x", "y"}};
  });
  EXPECT_NE(m.find("\"metrics\".x (a finite number)"), std::string::npos) << m;
}

TEST(HttpEnv, ADownEnvironmentIsOneErrorNotAHang) {
  int port = 0;
  {
    GuessEnv gone;
    port = std::stoi(gone.url().substr(gone.url().rfind(':') + 1));
  }
  auto task = Make({{"server", "http://127.0.0.1:" + std::to_string(port)}, {"timeout", "2"}});
  ScriptedPolicy policy([](size_t, size_t) { return "1"; });
  Result<std::vector<Episode>> got = task->RunGroup(task->TrainPrompt(0), 2, policy, 0);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("environment POST http://127.0.0.1:" + std::to_string(port) + "/reset"),
            std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("after 3 attempts"), std::string::npos) << got.status().message();
}

class HttpEnvFiles : public TempDirTest {};

TEST_F(HttpEnvFiles, HeldOutSeedsAreDisjointAndExportRoundTrips) {
  GuessEnv env;
  auto task = Make({{"server", env.url()}, {"eval_size", "3"}, {"seed", "5"}});
  ASSERT_EQ(task->HeldOut().size(), 3u);
  EXPECT_EQ(task->HeldOut()[2].reference, std::to_string((uint64_t{1} << 50) + 5 + 2));
  EXPECT_TRUE(task->EvalPlaysEpisodes());
  EXPECT_EQ(task->Demonstration(task->TrainPrompt(0)), "");  // the warm-start refuses the task
  const std::string file = (dir_ / "heldout.jsonl").string();
  ASSERT_TRUE(task->ExportHeldOut(file).ok());
  auto again = Make({{"server", env.url()}, {"eval_file", file}});
  ASSERT_EQ(again->HeldOut().size(), 3u);
  EXPECT_EQ(again->HeldOut()[1].reference, task->HeldOut()[1].reference);
  Write("heldout.jsonl", "{\"seed\": 1}\n{\"seed\": -4}\n");
  Result<std::unique_ptr<TaskAdapter>> bad = CreateAdapter("http-env", {{"eval_file", file}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(file + ":2: expected {\"seed\": N}"), std::string::npos) << bad.status().message();
}

// A training episode's seed comes from the learner's secret, below the held-out seeds; without
// a secret, from the run seed.
TEST(HttpEnv, TrainingSeedsComeFromTheSecret) {
  auto plain = Make({{"seed", "5"}});
  auto a = Make({{"seed", "5"}, {"secret", std::string(64, 'a')}});
  auto b = Make({{"seed", "6"}, {"secret", std::string(64, 'b')}});
  auto a_again = Make({{"seed", "7"}, {"secret", std::string(64, 'a')}});
  EXPECT_EQ(plain->TrainPrompt(3).reference, "8");
  std::set<std::string> seen;
  for (uint64_t g = 0; g < 50; ++g) {
    const std::string s = a->TrainPrompt(g).reference;
    EXPECT_EQ(s, a_again->TrainPrompt(g).reference);
    EXPECT_NE(s, b->TrainPrompt(g).reference);
    EXPECT_LT(std::stoull(s), uint64_t{1} << 50) << s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_EQ(a->HeldOut()[0].reference, plain->HeldOut()[0].reference);
}

TEST(HttpEnv, OptionsAreChecked) {
  EXPECT_NE(CreateAdapter("http-env", {{"sever", "x"}}).status().message().find("unknown option \"sever\""),
            std::string::npos);
  EXPECT_NE(CreateAdapter("http-env", {{"server", "ftp://x"}}).status().message().find("expected http://HOST:PORT"),
            std::string::npos);
  EXPECT_NE(CreateAdapter("http-env", {{"max_turns", "0"}}).status().message().find("max_turns"), std::string::npos);
  // An adapter without a server (as `echelon train --help` builds one) cannot train.
  auto task = Make({});
  EXPECT_NE(task->ReadyToTrain().message().find("set task.server"), std::string::npos);
}

}  // namespace
}  // namespace echelon::data
