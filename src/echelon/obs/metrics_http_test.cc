#include "echelon/obs/metrics_http.h"

#include <httplib.h>
#include <gtest/gtest.h>

#include "echelon/obs/prometheus_catalog.h"

namespace echelon::obs {
namespace {

TEST(MetricsHttpTest, ServesPrometheusTextWithHelpTypeAndLabels) {
  MetricsHttpServer http;
  ASSERT_TRUE(http.Start("127.0.0.1", 0).ok());
  MetricsRegistry& reg = http.registry();
  reg.Describe("echelon_policy_version", MetricType::kGauge, "policy version\nafter \\ the update");
  reg.Set("echelon_policy_version", 12);
  reg.Describe("echelon_refused_total", MetricType::kCounter, "refused submissions");
  reg.Set("echelon_refused_total", 3, {{"reason", "bad\"logprob"}});
  reg.Add("echelon_refused_total", 1, {{"reason", "unknown_group"}});
  reg.Add("echelon_refused_total", 1, {{"reason", "unknown_group"}});
  reg.Set("echelon_undescribed", 0.5);
  httplib::Client client("127.0.0.1", http.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), kPrometheusContentType);
  EXPECT_EQ(res->body,
            "# HELP echelon_policy_version policy version\\nafter \\\\ the update\n"
            "# TYPE echelon_policy_version gauge\n"
            "echelon_policy_version 12\n"
            "# HELP echelon_refused_total refused submissions\n"
            "# TYPE echelon_refused_total counter\n"
            "echelon_refused_total{reason=\"bad\\\"logprob\"} 3\n"
            "echelon_refused_total{reason=\"unknown_group\"} 2\n"
            "# HELP echelon_undescribed echelon_undescribed\n"
            "# TYPE echelon_undescribed gauge\n"
            "echelon_undescribed 0.5\n");
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok\n");
  http.Stop();
}

// Stop right after Start: stopping before the accept loop ran was lost, and Stop waited for
// that loop forever.
TEST(MetricsHttpTest, StopRightAfterStartReturns) {
  for (int i = 0; i < 200; ++i) {
    MetricsHttpServer http;
    ASSERT_TRUE(http.Start("127.0.0.1", 0).ok());
    http.Stop();
  }
}

TEST(PrometheusCatalogTest, TotalsAreCountersInBaseUnitsAndUnknownKeysAreGauges) {
  MetricsRegistry reg;
  PublishStepLine(nlohmann::json::parse(R"({"step": 4, "wall_s": 2.5, "groups_issued": 40, "learner_rss_mb": 2,
      "refused": {"too_long": 3}, "reward_metrics": {"format-ok": 0.5}, "my.metric": 7, "event": "x",
      "consumed_groups": [1, 2]})"),
                  reg);
  const std::string text = reg.Render();
  EXPECT_NE(text.find("# TYPE echelon_groups_issued_total counter\nechelon"), std::string::npos) << text;
  EXPECT_NE(text.find("echelon_groups_issued_total 40\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE echelon_run_wall_seconds gauge\nechelon"), std::string::npos);
  EXPECT_NE(text.find("echelon_learner_resident_memory_bytes 2097152\n"), std::string::npos);
  EXPECT_NE(text.find("echelon_refused_total{reason=\"too_long\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("echelon_reward_metric{name=\"format-ok\"} 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("# HELP echelon_my_metric metrics.jsonl field my.metric\n# TYPE echelon_my_metric gauge\n"
                      "echelon_my_metric 7\n"),
            std::string::npos);
  EXPECT_EQ(text.find("event"), std::string::npos);
  EXPECT_EQ(text.find("consumed"), std::string::npos);
}

// actor_stats is an object of objects: each worker's count of flagged statistics is what a
// dashboard alerts on (it used to publish a metric name with no samples).
TEST(PrometheusCatalogTest, EachWorkersFlaggedStatisticsAreAGauge) {
  MetricsRegistry reg;
  PublishStepLine(nlohmann::json::parse(R"({"step": 9, "actor_stats": {
      "honest-0": {"groups": 40, "reward_mean": 0.5},
      "mallory": {"groups": 40, "reward_mean": 1.0, "outlier": ["reward_mean", "length_mean"]}}})"),
                  reg);
  const std::string text = reg.Render();
  EXPECT_NE(text.find("echelon_actor_outlier_statistics{actor=\"honest-0\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("echelon_actor_outlier_statistics{actor=\"mallory\"} 2\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace echelon::obs
