#include "echelon/obs/metrics_http.h"

#include <httplib.h>
#include <gtest/gtest.h>

namespace echelon::obs {
namespace {

TEST(MetricsHttpTest, ServesPrometheusTextWithLabels) {
  MetricsHttpServer http;
  ASSERT_TRUE(http.Start("127.0.0.1", 0).ok());
  http.Set("echelon_policy_version", 12);
  http.Set("echelon_refusals_total", 3, {{"reason", "bad\"logprob"}});
  http.Set("echelon_refusals_total", 1, {{"reason", "unknown_group"}});
  httplib::Client client("127.0.0.1", http.port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body,
            "# TYPE echelon_policy_version gauge\n"
            "echelon_policy_version 12\n"
            "# TYPE echelon_refusals_total gauge\n"
            "echelon_refusals_total{reason=\"bad\\\"logprob\"} 3\n"
            "echelon_refusals_total{reason=\"unknown_group\"} 1\n");
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

}  // namespace
}  // namespace echelon::obs
