#include "echelon/obs/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace echelon::obs {
namespace tensorboard {
namespace {

// Table of the reflected CRC-32C (Castagnoli) polynomial, one entry per byte value.
std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// --- protobuf wire format: the few encodings an Event needs ---------------------------------
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutTag(std::string* out, uint32_t field, WireType type) { PutVarint(out, (field << 3) | type); }

void PutDouble(std::string* out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutTag(out, field, kFixed64);
  PutLittleEndian(out, bits, 8);
}

void PutFloat(std::string* out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutTag(out, field, kFixed32);
  PutLittleEndian(out, bits, 4);
}

// int64 is a varint of the two's complement (a negative step takes ten bytes).
void PutInt64(std::string* out, uint32_t field, int64_t v) {
  PutTag(out, field, kVarint);
  PutVarint(out, static_cast<uint64_t>(v));
}

void PutBytes(std::string* out, uint32_t field, std::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Event {1 wall_time double, 2 step int64, 3 file_version string, 5 summary Summary,
//        7 session_log SessionLog}
// Summary {1 repeated Value value}; Value {1 tag string, 2 simple_value float}
// SessionLog {1 status enum (START = 1)}
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
                   kEventSessionLog = 7;
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;
// Text (TensorBoard's text plugin, as tf.summary.text writes it): Value {8 tensor TensorProto,
// 9 metadata SummaryMetadata}; TensorProto {1 dtype (DT_STRING = 7), 2 tensor_shape (empty:
// a scalar), 8 repeated string_val}; SummaryMetadata {1 plugin_data PluginData}; PluginData
// {1 plugin_name}.
constexpr uint32_t kValueTensor = 8, kValueMetadata = 9;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8, kDtypeString = 7;
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1;
constexpr uint32_t kSessionLogStatus = 1, kSessionLogStart = 1;

std::string EventHeader(int64_t step, double wall_time) {
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutInt64(&event, kEventStep, step);
  return event;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> kTable = MakeCrc32cTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : data) crc = kTable[(crc ^ b) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(std::string_view data) {
  std::string length;
  PutLittleEndian(&length, data.size(), 8);
  std::string record = length;
  PutLittleEndian(&record, MaskedCrc32c(length), 4);
  record.append(data.data(), data.size());
  PutLittleEndian(&record, MaskedCrc32c(data), 4);
  return record;
}

std::string FileVersionEvent(double wall_time) {
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutBytes(&event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string ScalarsEvent(int64_t step, double wall_time, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(&v, kValueTag, tag);
    PutFloat(&v, kValueSimpleValue, static_cast<float>(value));
    PutBytes(&summary, kSummaryValue, v);
  }
  std::string event = EventHeader(step, wall_time);
  PutBytes(&event, kEventSummary, summary);
  return event;
}

std::string TextEvent(int64_t step, double wall_time, const std::string& tag, std::string_view markdown) {
  std::string tensor;
  PutTag(&tensor, kTensorDtype, kVarint);
  PutVarint(&tensor, kDtypeString);
  PutBytes(&tensor, kTensorShape, "");
  PutBytes(&tensor, kTensorStringVal, markdown);
  std::string plugin_data;
  PutBytes(&plugin_data, kPluginName, "text");
  std::string metadata;
  PutBytes(&metadata, kMetadataPluginData, plugin_data);
  std::string value;
  PutBytes(&value, kValueTag, tag);
  PutBytes(&value, kValueTensor, tensor);
  PutBytes(&value, kValueMetadata, metadata);
  std::string summary;
  PutBytes(&summary, kSummaryValue, value);
  std::string event = EventHeader(step, wall_time);
  PutBytes(&event, kEventSummary, summary);
  return event;
}

std::string SessionStartEvent(int64_t step, double wall_time) {
  std::string session_log;
  PutTag(&session_log, kSessionLogStatus, kVarint);
  PutVarint(&session_log, kSessionLogStart);
  std::string event = EventHeader(step, wall_time);
  PutBytes(&event, kEventSessionLog, session_log);
  return event;
}

}  // namespace tensorboard

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status TensorBoardWriter::Open(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ != nullptr) return FailedPrecondition("TensorBoard event file " + path_ + " is already open");
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  for (char* c = host; *c != '\0'; ++c)
    if (*c == '/') *c = '_';
  const double now = UnixSeconds();
  const std::string base = (std::filesystem::path(dir) / ("events.out.tfevents." +
                                                          std::to_string(static_cast<int64_t>(now)) + "." + host))
                               .string();
  // Never append to another process's file: a name taken (a restart within the second) gets a suffix.
  std::string path = base;
  int fd = -1;
  for (int n = 1; n <= 100; ++n) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
    path = base + "." + std::to_string(n);
  }
  if (fd < 0) return Internal("cannot create TensorBoard event file " + path + ": " + std::strerror(errno));
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    ::close(fd);
    return Internal("cannot open TensorBoard event file " + path + ": " + std::strerror(errno));
  }
  path_ = path;
  const std::string record = tensorboard::FrameRecord(tensorboard::FileVersionEvent(now));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    return Internal("write to TensorBoard event file " + path_ + " failed: " + std::strerror(errno));
  return Status::Ok();
}

Status TensorBoardWriter::WriteScalars(int64_t step, double wall_time, const Scalars& scalars) {
  return WriteRecord(tensorboard::ScalarsEvent(step, wall_time, scalars));
}

Status TensorBoardWriter::WriteText(int64_t step, double wall_time, const std::string& tag, std::string_view markdown) {
  return WriteRecord(tensorboard::TextEvent(step, wall_time, tag, markdown));
}

Status TensorBoardWriter::WriteSessionStart(int64_t step, double wall_time) {
  return WriteRecord(tensorboard::SessionStartEvent(step, wall_time));
}

Status TensorBoardWriter::WriteRecord(const std::string& event) {
  const std::string record = tensorboard::FrameRecord(event);
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return FailedPrecondition("TensorBoard event file is not open");
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    return Internal("write to TensorBoard event file " + path_ + " failed: " + std::strerror(errno));
  return Status::Ok();
}

Scalars FlattenMetricsLine(const nlohmann::json& line) {
  Scalars out;
  auto add = [&out](const std::string& tag, const nlohmann::json& v) {
    if (!v.is_number()) return;  // booleans and strings are not numbers in nlohmann::json
    const double d = v.get<double>();
    if (std::isfinite(d)) out.emplace_back(tag, d);
  };
  if (!line.is_object()) return out;
  for (const auto& [key, value] : line.items()) {
    if (key == "step") continue;
    if (value.is_object()) {
      for (const auto& [k, v] : value.items()) add(key + "/" + k, v);
    } else {
      add(key, value);
    }
  }
  return out;
}

int64_t MetricsLineStep(const nlohmann::json& line) {
  for (const char* key : {"step", "version"}) {
    auto it = line.find(key);
    if (it != line.end() && it->is_number_integer()) return it->get<int64_t>();
  }
  return 0;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace echelon::obs
