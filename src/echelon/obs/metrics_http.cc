#include "echelon/obs/metrics_http.h"

#include <httplib.h>

#include <cmath>
#include <sstream>

namespace echelon::obs {
namespace {

std::string RenderLabels(const MetricsHttpServer::Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (const auto& [k, v] : labels) {
    if (out.size() > 1) out += ",";
    out += k + "=\"";
    for (char c : v) {
      if (c == '"' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    out += "\"";
  }
  return out + "}";
}

}  // namespace

MetricsHttpServer::MetricsHttpServer() : server_(std::make_unique<httplib::Server>()) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

Status MetricsHttpServer::Start(const std::string& host, int port) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Render(), "text/plain; version=0.0.4");
  });
  server_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) return Internal("cannot listen for metrics on " + host + ":" + std::to_string(port));
  listen_.Start(server_.get());
  return Status::Ok();
}

void MetricsHttpServer::Stop() { listen_.Stop(); }

void MetricsHttpServer::Set(const std::string& name, double value, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  values_[name][RenderLabels(labels)] = value;
}

std::string MetricsHttpServer::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out.precision(17);
  for (const auto& [name, series] : values_) {
    out << "# TYPE " << name << " gauge\n";
    for (const auto& [labels, v] : series) {
      out << name << labels << " ";
      if (std::isnan(v)) out << "NaN";
      else if (std::isinf(v)) out << (v > 0 ? "+Inf" : "-Inf");
      else out << v;
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace echelon::obs
