#include "echelon/obs/metrics_log.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "echelon/common/fs.h"

namespace echelon::obs {

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

Status MetricsLog::MirrorToTensorBoard(const std::string& dir, std::optional<int64_t> purge_from) {
  auto tb = std::make_unique<TensorBoardWriter>();
  ECHELON_RETURN_IF_ERROR(tb->Open(dir));
  if (purge_from) ECHELON_RETURN_IF_ERROR(tb->WriteSessionStart(*purge_from, UnixSeconds()));
  std::lock_guard<std::mutex> lock(mu_);
  tensorboard_ = std::move(tb);
  return Status::Ok();
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
  if (tensorboard_ == nullptr) return Status::Ok();
  const Scalars scalars = FlattenMetricsLine(line);
  if (scalars.empty()) return Status::Ok();
  return tensorboard_->WriteScalars(MetricsLineStep(line), UnixSeconds(), scalars);
}

Status MetricsLog::MirrorText(int64_t step, const std::string& tag, std::string_view markdown) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tensorboard_ == nullptr) return Status::Ok();
  return tensorboard_->WriteText(step, UnixSeconds(), tag, markdown);
}

uint64_t MetricsLog::bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr || std::fseek(file_, 0, SEEK_END) != 0) return 0;
  const long pos = std::ftell(file_);
  return pos < 0 ? 0 : static_cast<uint64_t>(pos);
}

Result<int64_t> MetricsLog::RollBack(const std::string& path, uint64_t length, const std::string& discarded_path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (text.size() < length)
    return DataLoss(path + " has " + std::to_string(text.size()) + " bytes but the checkpoint recorded " +
                    std::to_string(length) + "; it was truncated or replaced since");
  if (text.size() == length) return 0;
  const std::string tail = text.substr(length);
  std::FILE* out = std::fopen(discarded_path.c_str(), "a");
  if (out == nullptr) return Internal("cannot open " + discarded_path + ": " + std::strerror(errno));
  const bool wrote = std::fwrite(tail.data(), 1, tail.size(), out) == tail.size() &&
                     (tail.back() == '\n' || std::fputc('\n', out) != EOF) && std::fflush(out) == 0 &&
                     ::fsync(::fileno(out)) == 0;
  if (std::fclose(out) != 0 || !wrote) return Internal("write to " + discarded_path + " failed");
  if (::truncate(path.c_str(), static_cast<off_t>(length)) != 0)
    return Internal("cannot truncate " + path + ": " + std::strerror(errno));
  return static_cast<int64_t>(std::count(tail.begin(), tail.end(), '\n') + (tail.back() == '\n' ? 0 : 1));
}

Result<int64_t> ReadMetricsLines(std::istream& in, const std::string& path, const MetricsLineVisitor& visit) {
  std::string text;
  int64_t line_no = 0;
  while (std::getline(in, text)) {
    ++line_no;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json o;
    try {
      o = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      return InvalidArgument(where + ": not a JSON object (" + std::string(e.what()) + ")");
    }
    if (!o.is_object()) return InvalidArgument(where + ": expected a JSON object, got " + o.dump().substr(0, 60));
    auto ev = o.find("event");
    if (ev != o.end() && !ev->is_string()) return InvalidArgument(where + ": field 'event' must be a string");
    ECHELON_RETURN_IF_ERROR(visit(o, where, line_no));
  }
  if (in.bad()) return DataLoss(path + ": read error after line " + std::to_string(line_no));
  return line_no;
}

}  // namespace echelon::obs
