// TensorBoardWriter: writes scalars to a TensorBoard event file, so `tensorboard --logdir`
// (and importers of event files, such as `wandb sync`) show a run. An event file is a TFRecord
// file (uint64 length, masked CRC32C of the length, data, masked CRC32C of the data) of
// protobuf `Event` messages, encoded here by hand (no protobuf library): the first record
// carries file_version "brain.Event:2", each later one a step, a wall time and a Summary of
// {tag, simple_value} pairs (or one text value, a string tensor for the text plugin). Every record is flushed when written, so a crash loses at most the
// record being written.
//
//   TensorBoardWriter tb;
//   ECHELON_RETURN_IF_ERROR(tb.Open("runs/math-tiny"));   // events.out.tfevents.<secs>.<host>
//   ECHELON_RETURN_IF_ERROR(tb.WriteScalars(12, UnixSeconds(), {{"reward_mean", 0.4}, {"refused/too_long", 2}}));
//
// Each Open() starts a new file (TensorBoard reads every event file of a directory), so a
// resumed run adds one beside those of its earlier processes.
//
// Thread contract: Write*() are safe to call from several threads (one mutex).
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::obs {

using Scalars = std::vector<std::pair<std::string, double>>;

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Creates events.out.tfevents.<unix seconds>.<hostname> in `dir` (with a ".N" suffix should
  // that name be taken) and writes the file_version record.
  Status Open(const std::string& dir);
  // One Event of `scalars` (written as float32) at `step`; `wall_time` in unix seconds.
  Status WriteScalars(int64_t step, double wall_time, const Scalars& scalars);
  // One Event of a text summary (TensorBoard's Text tab renders it as markdown) at `step`.
  Status WriteText(int64_t step, double wall_time, const std::string& tag, std::string_view markdown);
  // A SessionLog START at `step`: TensorBoard then drops the points at `step` and after that
  // earlier files hold (a resumed run redoes those steps).
  Status WriteSessionStart(int64_t step, double wall_time);
  const std::string& path() const { return path_; }

 private:
  Status WriteRecord(const std::string& event);

  std::mutex mu_;  // guards file_
  std::FILE* file_ = nullptr;
  std::string path_;
};

// The scalars of a metrics.jsonl line (obs/metrics_log.h): a top-level number `key` becomes
// tag `key`, an object of numbers `key: {k: v}` tags `key/k`. Strings, booleans, arrays
// (consumed_groups), non-finite numbers and the key "step" are left out. In the line's order.
Scalars FlattenMetricsLine(const nlohmann::json& line);
// The TensorBoard step of a metrics line: its "step" (training lines), else its "version"
// (updates so far: resume, final and interrupted lines), else 0 (the warm-start line).
int64_t MetricsLineStep(const nlohmann::json& line);
// Seconds since the unix epoch, now.
double UnixSeconds();

// The encoding, exposed for tests.
namespace tensorboard {
uint32_t Crc32c(std::string_view data);
uint32_t MaskedCrc32c(std::string_view data);
// One TFRecord: length, masked CRC of the length, data, masked CRC of the data.
std::string FrameRecord(std::string_view data);
// Serialized Event messages.
std::string FileVersionEvent(double wall_time);
std::string ScalarsEvent(int64_t step, double wall_time, const Scalars& scalars);
std::string TextEvent(int64_t step, double wall_time, const std::string& tag, std::string_view markdown);
std::string SessionStartEvent(int64_t step, double wall_time);
}  // namespace tensorboard

}  // namespace echelon::obs
