// Prometheus text exposition (format 0.0.4): a registry of described series, and the
// learner's HTTP server for it at GET /metrics (and GET /health), on a port of its own.
//
//   MetricsRegistry reg;
//   reg.Describe("echelon_policy_version", MetricType::kGauge, "policy version after the last update");
//   reg.Set("echelon_policy_version", 12);
//   reg.Describe("echelon_refused_total", MetricType::kCounter, "refused submissions, by reason");
//   reg.Set("echelon_refused_total", 3, {{"reason", "bad_logprob"}});   // a running total
//   reg.Add("echelon_serve_requests_total", 1, {{"endpoint", "/v1/completions"}});
//   std::string text = reg.Render();      // # HELP / # TYPE / samples, names sorted
//
//   MetricsHttpServer http;               // serves http.registry()
//   ECHELON_RETURN_IF_ERROR(http.Start("0.0.0.0", 9400));
//
// Names follow Prometheus' conventions: base units (`_seconds`, `_bytes`), counters end in
// `_total`. A series set without Describe is a gauge whose help says only its name.
//
// Thread contract: every method takes one mutex; safe from any thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "echelon/common/listen_thread.h"
#include "echelon/common/status.h"

namespace httplib {
class Server;
}

namespace echelon::obs {

enum class MetricType { kGauge, kCounter };

class MetricsRegistry {
 public:
  using Labels = std::map<std::string, std::string>;
  void Describe(const std::string& name, MetricType type, const std::string& help);
  void Set(const std::string& name, double value, const Labels& labels = {});
  void Add(const std::string& name, double delta, const Labels& labels = {});
  std::string Render() const;

 private:
  struct Family {
    MetricType type = MetricType::kGauge;
    std::string help;
    std::map<std::string, double> series;  // rendered labels -> value
  };
  mutable std::mutex mu_;  // guards families_
  std::map<std::string, Family> families_;
};

// The content type of Render()'s text.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

class MetricsHttpServer {
 public:
  MetricsHttpServer();
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Port 0 picks a free port (see port()).
  Status Start(const std::string& host, int port);
  int port() const { return port_; }
  void Stop();

  MetricsRegistry& registry() { return registry_; }
  std::string Render() const { return registry_.Render(); }

 private:
  MetricsRegistry registry_;
  std::unique_ptr<httplib::Server> server_;
  ListenThread<httplib::Server> listen_;
  int port_ = 0;
};

}  // namespace echelon::obs
