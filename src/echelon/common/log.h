// Logging: spdlog to stderr with one pattern for every role. Progress lines that a user
// reads (per-step lines of `echelon train`) go to stdout; diagnostics go through here.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "echelon/common/clock.h"

namespace echelon {

// level: "debug", "info", "warn", "error". Call once from main().
void InitLogging(const std::string& level);

// LogBudget: at most `lines` log lines per `period_seconds` for each key, for lines that a
// caller can provoke at will (a refusal of a worker's submission, a call without a token): past
// the budget a line is counted instead of written, and the first line of the key's next period
// is preceded by one saying how many were left out. Keys must come from a fixed set (refusal
// reasons), never from the caller (an address), or the table itself grows without bound.
//
//   static LogBudget budget;
//   if (budget.Allow(reason)) spdlog::warn("refused group {}: {}", id, reason);
//
// Thread contract: Allow may be called from any thread.
class LogBudget {
 public:
  // 20 lines a minute per reason: enough to see what is being refused and by whom; the rest
  // are counted where refusals are (metrics.jsonl's `refused`, the server's counters).
  static constexpr int kLines = 20;
  static constexpr double kPeriodSeconds = 60;

  explicit LogBudget(int lines = kLines, double period_seconds = kPeriodSeconds, const Clock* clock = nullptr);
  bool Allow(const std::string& key);
  int64_t left_out() const;  // lines not written, in all

 private:
  struct Window {
    double start = 0;
    int written = 0;
    int64_t left_out = 0;
  };
  const int lines_;
  const double period_;
  const Clock* clock_;
  RealClock real_;
  mutable std::mutex mu_;
  std::map<std::string, Window> windows_;
  int64_t left_out_ = 0;
};

}  // namespace echelon
