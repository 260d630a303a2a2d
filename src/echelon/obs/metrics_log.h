// MetricsLog: appends one JSON object per line to a file (metrics.jsonl) and flushes each
// line, so a crash loses at most the line being written and readers can tail the file.
// With MirrorToTensorBoard() every line's numbers also go to a TensorBoard event file.
//
// Thread contract: Write() is safe to call from several threads (one mutex).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <istream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/obs/tensorboard.h"

namespace echelon::obs {

class MetricsLog {
 public:
  MetricsLog() = default;
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  Status Open(const std::string& path);
  Status Write(const nlohmann::json& line);
  // From now on Write() also puts each line's numbers (FlattenMetricsLine) into a new
  // TensorBoard event file in `dir` (obs/tensorboard.h), at the line's MetricsLineStep, as it
  // writes the line. A resumed run passes the step it redoes from (`purge_from`): TensorBoard
  // then drops the points of earlier files at and after it, as the resume cut metrics.jsonl.
  Status MirrorToTensorBoard(const std::string& dir, std::optional<int64_t> purge_from = std::nullopt);
  // A text summary at `step` in the mirrored event file (nothing is written to the log itself;
  // nothing at all unless mirrored).
  Status MirrorText(int64_t step, const std::string& tag, std::string_view markdown);
  // Bytes in the file so far (a line boundary: lines are written whole and flushed).
  uint64_t bytes();

  // Cuts `path` back to its first `length` bytes (a resumed run redoes the steps after it);
  // the cut lines are appended to `discarded_path`, never lost. Returns how many lines moved.
  static Result<int64_t> RollBack(const std::string& path, uint64_t length, const std::string& discarded_path);

 private:
  std::mutex mu_;  // guards file_
  std::FILE* file_ = nullptr;
  std::string path_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // null unless mirrored
};

// Reads metrics.jsonl: calls `visit(object, where, line_no)` for every non-blank line
// (`where` is "path:N"), in order, and stops at the first error: a line that is not a JSON
// object (named with its line), an "event" field that is not a string, an error `visit`
// returns, or a read error. Returns the number of lines read.
using MetricsLineVisitor = std::function<Status(const nlohmann::json& line, const std::string& where, int64_t line_no)>;
Result<int64_t> ReadMetricsLines(std::istream& in, const std::string& path, const MetricsLineVisitor& visit);

}  // namespace echelon::obs
