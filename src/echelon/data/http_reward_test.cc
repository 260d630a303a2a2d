#include "echelon/data/http_reward.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "echelon/common/listen_thread.h"

namespace echelon::data {
namespace {

using nlohmann::json;

// A scoring service on a random loopback port; `handler` answers POST /score.
class Service {
 public:
  explicit Service(std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    server_.Post("/score", [this, handler](const httplib::Request& q, httplib::Response& r) {
      ++requests;
      handler(q, r);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    listen_.Start(&server_);
  }
  ~Service() { listen_.Stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/score"; }
  std::atomic<int> requests{0};

 private:
  httplib::Server server_;
  int port_ = 0;
  ListenThread<httplib::Server> listen_;
};

std::vector<RewardSample> Samples() {
  return {{"gsm8k", "#### 72", "72", R"({"index": 3})"}, {"gsm8k", "#### 71", "72", "null"}};
}

TEST(HttpReward, PostsTheGroupAndReadsScoresAndMetrics) {
  json seen;
  Service s([&](const httplib::Request& q, httplib::Response& r) {
    seen = json::parse(q.body);
    r.set_content(R"({"scores": [{"score": 1.0, "passed": 3}, 0]})", "application/json");
  });
  auto http = HttpReward::Create(s.url(), 5).value();
  Result<std::vector<ExternalScore>> got = http->Score(Samples());
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(got.value()[0].score, 1.0);
  EXPECT_EQ(got.value()[0].extras, (std::map<std::string, double>{{"passed", 3.0}}));
  EXPECT_EQ(got.value()[1].score, 0.0);
  EXPECT_EQ(seen["samples"][0], (json{{"data_source", "gsm8k"}, {"solution_str", "#### 72"}, {"ground_truth", "72"},
                                      {"extra_info", {{"index", 3}}}}));
  EXPECT_TRUE(seen["samples"][1]["extra_info"].is_null());
}

TEST(HttpReward, ServerErrorsAreRetried) {
  Service s([&](const httplib::Request&, httplib::Response& r) {
    if (s.requests < 3) {
      r.status = 503;
      return;
    }
    r.set_content(R"({"scores": [0.5, 0.25]})", "application/json");
  });
  auto http = HttpReward::Create(s.url(), 5).value();
  Result<std::vector<ExternalScore>> got = http->Score(Samples());
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got.value()[1].score, 0.25);
  EXPECT_EQ(s.requests.load(), 3);
}

TEST(HttpReward, BadAnswersNameTheUrlAndWhatCameBack) {
  std::string answer;
  int status = 200;
  Service s([&](const httplib::Request&, httplib::Response& r) {
    r.status = status;
    r.set_content(answer, "application/json");
  });
  auto http = HttpReward::Create(s.url(), 5).value();
  auto message = [&](const std::string& a, int st = 200) {
    answer = a;
    status = st;
    Result<std::vector<ExternalScore>> got = http->Score(Samples());
    EXPECT_FALSE(got.ok()) << a;
    return got.ok() ? std::string() : got.status().message();
  };
  EXPECT_NE(message(R"({"scores": [1]})").find("expected {\"scores\": [...]} with 2 entries, got {\"scores\":[1]}"),
            std::string::npos);
  EXPECT_NE(message("not json").find("the answer is not JSON: not json"), std::string::npos);
  EXPECT_NE(message(R"({"scores": [1, "x"]})").find("scores[1] is \"x\", not a finite number"), std::string::npos);
  EXPECT_NE(message(R"({"scores": [1, {"score": 1, "why": "x"}]})").find("scores[1].why is \"x\""), std::string::npos);
  const int before = s.requests;
  const std::string m = message(R"({"detail": "bad request"})", 422);
  EXPECT_NE(m.find("reward service POST " + s.url() + ": HTTP 422 {\"detail\": \"bad request\"}"), std::string::npos) << m;
  EXPECT_EQ(s.requests - before, 1) << "a 4xx is not retried";
}

TEST(HttpReward, ADownServiceIsAClearErrorNotAHang) {
  std::string url;
  {
    Service gone([](const httplib::Request&, httplib::Response&) {});
    url = gone.url();
  }  // stopped: its port refuses connections
  auto http = HttpReward::Create(url, 2).value();
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<ExternalScore>> got = http->Score(Samples());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(got.status().message().find("reward service POST " + url), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("after 3 attempts"), std::string::npos) << got.status().message();
  EXPECT_LT(took, 10.0);
}

TEST(HttpReward, ASlowServiceHitsTheTimeLimit) {
  Service s([](const httplib::Request&, httplib::Response& r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    r.set_content(R"({"scores": [1, 1]})", "application/json");
  });
  auto http = HttpReward::Create(s.url(), 1).value();
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<ExternalScore>> got = http->Score(Samples());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("after 3 attempts"), std::string::npos) << got.status().message();
  EXPECT_LT(took, 8.0);  // three 1 s attempts and 1.5 s of back-off
}

// A text that makes the service slow took three attempts of the whole time limit and the
// back-off between them. With a group budget the request and its retries end with the budget,
// as ResourceExhausted (the worker's doing: reward_slow), not as a broken service.
TEST(HttpReward, AGroupBudgetBoundsTheRequestWithItsRetries) {
  Service s([](const httplib::Request&, httplib::Response& r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    r.set_content(R"({"scores": [1, 1]})", "application/json");
  });
  auto http = HttpReward::Create(s.url(), 2).value();
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<ExternalScore>> got = http->Score(Samples(), /*budget_seconds=*/1.5);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted) << got.status().message();
  EXPECT_NE(got.status().message().find("budget"), std::string::npos) << got.status().message();
  EXPECT_LT(took, 2.5) << "unbounded: three 2 s attempts and 1.5 s of back-off";
  EXPECT_EQ(s.requests.load(), 1);
}

TEST(HttpReward, MalformedUrlsAreRefused) {
  EXPECT_NE(HttpReward::Create("https://x/score", 1).status().message().find("expected http://HOST:PORT/PATH"),
            std::string::npos);
  EXPECT_NE(HttpReward::Create("http:///score", 1).status().message().find("no host"), std::string::npos);
}

}  // namespace
}  // namespace echelon::data
