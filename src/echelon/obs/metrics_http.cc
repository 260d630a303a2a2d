#include "echelon/obs/metrics_http.h"

#include <httplib.h>

#include <cmath>
#include <sstream>

namespace echelon::obs {
namespace {

// Label values escape backslash, double quote and newline; help text backslash and newline.
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || (quote && c == '"')) out += '\\';
    out += c;
  }
  return out;
}

std::string RenderLabels(const MetricsRegistry::Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (const auto& [k, v] : labels) {
    if (out.size() > 1) out += ",";
    out += k + "=\"" + Escape(v, /*quote=*/true) + "\"";
  }
  return out + "}";
}

}  // namespace

void MetricsRegistry::Describe(const std::string& name, MetricType type, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = families_[name];
  f.type = type;
  f.help = help;
}

void MetricsRegistry::Set(const std::string& name, double value, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  families_[name].series[RenderLabels(labels)] = value;
}

void MetricsRegistry::Add(const std::string& name, double delta, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  families_[name].series[RenderLabels(labels)] += delta;
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out.precision(17);
  for (const auto& [name, f] : families_) {
    if (f.series.empty()) continue;
    out << "# HELP " << name << " " << Escape(f.help.empty() ? name : f.help, /*quote=*/false) << "\n";
    out << "# TYPE " << name << (f.type == MetricType::kCounter ? " counter\n" : " gauge\n");
    for (const auto& [labels, v] : f.series) {
      out << name << labels << " ";
      if (std::isnan(v)) out << "NaN";
      else if (std::isinf(v)) out << (v > 0 ? "+Inf" : "-Inf");
      else out << v;
      out << "\n";
    }
  }
  return out.str();
}

MetricsHttpServer::MetricsHttpServer() : server_(std::make_unique<httplib::Server>()) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

Status MetricsHttpServer::Start(const std::string& host, int port) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry_.Render(), kPrometheusContentType);
  });
  server_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) return Internal("cannot listen for metrics on " + host + ":" + std::to_string(port));
  listen_.Start(server_.get());
  return Status::Ok();
}

void MetricsHttpServer::Stop() { listen_.Stop(); }

}  // namespace echelon::obs
