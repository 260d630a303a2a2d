#include "echelon/obs/metrics_log.h"

#include <cerrno>
#include <cstring>

namespace echelon::obs {

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

Status MetricsLog::Open(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) return Internal("cannot open " + path + " for appending: " + std::strerror(errno));
  path_ = path;
  return Status::Ok();
}

Status MetricsLog::Write(const nlohmann::json& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return FailedPrecondition("metrics log is not open");
  const std::string text = line.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    return Internal("write to " + path_ + " failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace echelon::obs
