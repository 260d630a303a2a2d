// MetricsHttpServer: the learner's metrics in Prometheus text format at GET /metrics (and
// GET /health), on a port of their own, for dashboards and alerting.
//
//   MetricsHttpServer http;
//   ECHELON_RETURN_IF_ERROR(http.Start("0.0.0.0", 9400));
//   http.Set("echelon_policy_version", 12);            // gauges, updated every step
//   http.Set("echelon_refusals_total", 3, {{"reason", "bad_logprob"}});
//
// Thread contract: Set() and the serving thread share one mutex; safe from any thread.
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

  using Labels = std::map<std::string, std::string>;
  void Set(const std::string& name, double value, const Labels& labels = {});
  // The exposition text served at /metrics.
  std::string Render() const;

 private:
  std::unique_ptr<httplib::Server> server_;
  ListenThread<httplib::Server> listen_;
  int port_ = 0;
  mutable std::mutex mu_;  // guards values_
  std::map<std::string, std::map<std::string, double>> values_;  // name -> rendered labels -> value
};

}  // namespace echelon::obs
