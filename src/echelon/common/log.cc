#include "echelon/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace echelon {

void InitLogging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("echelon");
  logger->set_pattern("%^[%H:%M:%S.%e %L]%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

LogBudget::LogBudget(int lines, double period_seconds, const Clock* clock)
    : lines_(lines), period_(period_seconds), clock_(clock != nullptr ? clock : &real_) {}

bool LogBudget::Allow(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_->Now();
  auto [it, fresh] = windows_.try_emplace(key, Window{now, 0, 0});
  Window& w = it->second;
  if (!fresh && now - w.start >= period_) {
    if (w.left_out > 0)
      spdlog::warn("{} more lines about {} were left out in {:.0f} s (at most {} a period are written)", w.left_out,
                   key, now - w.start, lines_);
    w = Window{now, 0, 0};
  }
  if (w.written < lines_) {
    ++w.written;
    return true;
  }
  ++w.left_out;
  ++left_out_;
  return false;
}

int64_t LogBudget::left_out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return left_out_;
}

}  // namespace echelon
