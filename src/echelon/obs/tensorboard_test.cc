#include "echelon/obs/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

#include "echelon/common/fs.h"
#include "echelon/obs/metrics_log.h"

namespace echelon::obs {
namespace {

namespace fs = std::filesystem;
using tensorboard::Crc32c;
using tensorboard::FrameRecord;
using tensorboard::MaskedCrc32c;

// --- a reader of the formats, written from their descriptions, independent of the writer ----
uint64_t ReadLittleEndian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return v;
}

// Splits a TFRecord stream into its records, checking both CRCs of each.
std::vector<std::string> ReadRecords(std::string_view file) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_GE(file.size() - at, 12u) << "truncated header at " << at;
    if (file.size() - at < 12) break;
    const uint64_t length = ReadLittleEndian(file.substr(at, 8));
    EXPECT_EQ(ReadLittleEndian(file.substr(at + 8, 4)), MaskedCrc32c(file.substr(at, 8))) << "length CRC at " << at;
    EXPECT_GE(file.size() - at - 12, length + 4) << "truncated record at " << at;
    if (file.size() - at - 12 < length + 4) break;
    const std::string_view data = file.substr(at + 12, length);
    EXPECT_EQ(ReadLittleEndian(file.substr(at + 12 + length, 4)), MaskedCrc32c(data)) << "data CRC at " << at;
    records.emplace_back(data);
    at += 12 + length + 4;
  }
  return records;
}

struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;     // wire type 0
  std::string bytes;       // wire types 1, 2, 5 (the raw bytes)
};

uint64_t ReadVarint(std::string_view in, size_t* at) {
  uint64_t v = 0;
  for (int shift = 0; *at < in.size() && shift < 64; shift += 7) {
    const auto b = static_cast<unsigned char>(in[(*at)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  ADD_FAILURE() << "bad varint";
  return v;
}

std::vector<Field> ParseMessage(std::string_view in) {
  std::vector<Field> fields;
  size_t at = 0;
  while (at < in.size()) {
    const uint64_t key = ReadVarint(in, &at);
    Field f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    size_t n = 0;
    switch (f.wire_type) {
      case 0: f.varint = ReadVarint(in, &at); break;
      case 1: n = 8; break;
      case 2: n = ReadVarint(in, &at); break;
      case 5: n = 4; break;
      default: ADD_FAILURE() << "wire type " << f.wire_type; return fields;
    }
    if (at + n > in.size()) {
      ADD_FAILURE() << "field " << f.number << " runs past the message";
      return fields;
    }
    f.bytes = std::string(in.substr(at, n));
    at += n;
    fields.push_back(std::move(f));
  }
  return fields;
}

struct DecodedEvent {
  double wall_time = NAN;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
  int64_t session_status = -1;
};

DecodedEvent DecodeEvent(std::string_view data) {
  DecodedEvent e;
  for (const Field& f : ParseMessage(data)) {
    if (f.number == 1 && f.wire_type == 1) {
      const uint64_t bits = ReadLittleEndian(f.bytes);
      std::memcpy(&e.wall_time, &bits, 8);
    } else if (f.number == 2 && f.wire_type == 0) {
      e.step = static_cast<int64_t>(f.varint);
    } else if (f.number == 3 && f.wire_type == 2) {
      e.file_version = f.bytes;
    } else if (f.number == 5 && f.wire_type == 2) {
      for (const Field& value : ParseMessage(f.bytes)) {
        EXPECT_EQ(value.number, 1u);
        std::string tag;
        float v = NAN;
        for (const Field& vf : ParseMessage(value.bytes)) {
          if (vf.number == 1 && vf.wire_type == 2) tag = vf.bytes;
          if (vf.number == 2 && vf.wire_type == 5) {
            const auto bits = static_cast<uint32_t>(ReadLittleEndian(vf.bytes));
            std::memcpy(&v, &bits, 4);
          }
        }
        e.values.emplace_back(tag, v);
      }
    } else if (f.number == 7 && f.wire_type == 2) {
      for (const Field& sf : ParseMessage(f.bytes))
        if (sf.number == 1 && sf.wire_type == 0) e.session_status = static_cast<int64_t>(sf.varint);
    } else {
      ADD_FAILURE() << "unexpected Event field " << f.number << " (wire type " << f.wire_type << ")";
    }
  }
  return e;
}

std::vector<fs::path> EventFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

fs::path FreshDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("echelon_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// --- tests ------------------------------------------------------------------------------------
TEST(TensorBoardTest, Crc32cOfKnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the usual check value.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(TensorBoardTest, MaskedCrcRotatesAndAddsTheDelta) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32.
  EXPECT_EQ(MaskedCrc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(MaskedCrc32c(std::string(32, '\0')), 0x0FD7FFFAu);
  EXPECT_EQ(MaskedCrc32c(""), 0xA282EAD8u);
}

TEST(TensorBoardTest, RecordFraming) {
  const std::string record = FrameRecord("abc");
  ASSERT_EQ(record.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(ReadLittleEndian(record.substr(8, 4)), MaskedCrc32c(std::string("\x03\0\0\0\0\0\0\0", 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(ReadLittleEndian(record.substr(15, 4)), MaskedCrc32c("abc"));
}

TEST(TensorBoardTest, ScalarsEventBytes) {
  // wall_time 1.5, step 3, one value {tag "a", simple_value 0.5}, byte by byte.
  const std::string want = std::string("\x09\0\0\0\0\0\0\xf8\x3f", 9) + std::string("\x10\x03", 2) +
                           std::string("\x2a\x0a\x0a\x08\x0a\x01" "a" "\x15\0\0\0\x3f", 12);
  EXPECT_EQ(tensorboard::ScalarsEvent(3, 1.5, {{"a", 0.5}}), want);
}

TEST(TensorBoardTest, TextEventBytes) {
  // wall_time 1.5, step 3, one value {tag "a", tensor {dtype DT_STRING, shape {}, string_val
  // "hi"}, metadata {plugin_data {plugin_name "text"}}}, byte by byte.
  const std::string want = std::string("\x09\0\0\0\0\0\0\xf8\x3f", 9) + std::string("\x10\x03", 2) +
                           std::string("\x2a\x19\x0a\x17", 4) + std::string("\x0a\x01" "a", 3) +
                           std::string("\x42\x08\x08\x07\x12\x00\x42\x02" "hi", 10) +
                           std::string("\x4a\x08\x0a\x06\x0a\x04" "text", 10);
  EXPECT_EQ(tensorboard::TextEvent(3, 1.5, "a", "hi"), want);
}

TEST(TensorBoardTest, RoundTripThroughTheFile) {
  const fs::path dir = FreshDir("round_trip");
  TensorBoardWriter tb;
  ASSERT_TRUE(tb.Open(dir.string()).ok());
  const std::string name = fs::path(tb.path()).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  ASSERT_TRUE(tb.WriteScalars(7, 1700000000.25, {{"reward_mean", 0.125}, {"refused/too_long", 3}, {"big", 1e10}}).ok());
  ASSERT_TRUE(tb.WriteScalars(-1, 1700000001.0, {{"loss", -2.5}}).ok());
  ASSERT_TRUE(tb.WriteSessionStart(300, 1700000002.0).ok());

  // Flushed as written: the file is complete while the writer is still open.
  const std::vector<std::string> records = ReadRecords(ReadFile(tb.path()).value());
  ASSERT_EQ(records.size(), 4u);
  const DecodedEvent first = DecodeEvent(records[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_GT(first.wall_time, 1.6e9);
  EXPECT_TRUE(first.values.empty());

  const DecodedEvent e = DecodeEvent(records[1]);
  EXPECT_EQ(e.step, 7);
  EXPECT_EQ(e.wall_time, 1700000000.25);
  EXPECT_EQ(e.file_version, "");
  ASSERT_EQ(e.values.size(), 3u);
  EXPECT_EQ(e.values[0], (std::pair<std::string, float>{"reward_mean", 0.125f}));
  EXPECT_EQ(e.values[1], (std::pair<std::string, float>{"refused/too_long", 3.0f}));
  EXPECT_EQ(e.values[2], (std::pair<std::string, float>{"big", 1e10f}));

  const DecodedEvent negative = DecodeEvent(records[2]);
  EXPECT_EQ(negative.step, -1);
  ASSERT_EQ(negative.values.size(), 1u);
  EXPECT_EQ(negative.values[0].second, -2.5f);

  const DecodedEvent session = DecodeEvent(records[3]);
  EXPECT_EQ(session.step, 300);
  EXPECT_EQ(session.session_status, 1) << "SessionLog START";
  EXPECT_TRUE(session.values.empty());

  // A second writer in the same second gets a file of its own.
  TensorBoardWriter again;
  ASSERT_TRUE(again.Open(dir.string()).ok());
  EXPECT_NE(again.path(), tb.path());
  EXPECT_EQ(EventFiles(dir).size(), 2u);
  fs::remove_all(dir);
}

TEST(TensorBoardTest, OpenFailureNamesTheFile) {
  TensorBoardWriter tb;
  const Status s = tb.Open("/nonexistent-dir-for-echelon-tests/run");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir-for-echelon-tests/run/events.out.tfevents."), std::string::npos)
      << s.message();
  EXPECT_FALSE(tb.WriteScalars(0, 0, {{"x", 1}}).ok());
}

TEST(TensorBoardTest, FlattensAMetricsLine) {
  const nlohmann::json line = nlohmann::json::parse(R"({
    "step": 4, "version": 5, "wall_s": 12.5, "reward_mean": 0.25,
    "refused": {"too_long": 2, "bad_logprob": 0}, "staleness_hist": {"0": 3, "1": 1},
    "consumed_groups": [1, 2, 3], "event": "x", "chat": true, "nothing": null,
    "mixed": {"n": 1, "s": "no", "list": [1], "inner": {"deep": 1}},
    "heldout_accuracy": null, "empty": {}
  })");
  const Scalars got = FlattenMetricsLine(line);
  std::map<std::string, double> by_tag(got.begin(), got.end());
  EXPECT_EQ(by_tag.size(), got.size()) << "tags are unique";
  const std::map<std::string, double> want = {{"version", 5},           {"wall_s", 12.5},
                                              {"reward_mean", 0.25},    {"refused/too_long", 2},
                                              {"refused/bad_logprob", 0}, {"staleness_hist/0", 3},
                                              {"staleness_hist/1", 1},  {"mixed/n", 1}};
  EXPECT_EQ(by_tag, want);
  EXPECT_EQ(MetricsLineStep(line), 4);
  EXPECT_EQ(MetricsLineStep({{"event", "final"}, {"version", 9}}), 9);
  EXPECT_EQ(MetricsLineStep({{"event", "warmstart"}, {"steps", 450}}), 0);
}

TEST(TensorBoardTest, FlattenLeavesOutNonFiniteNumbers) {
  nlohmann::json line;
  line["inf"] = std::numeric_limits<double>::infinity();
  line["nan"] = std::numeric_limits<double>::quiet_NaN();
  line["map"] = {{"ninf", -std::numeric_limits<double>::infinity()}, {"ok", 1}};
  const Scalars got = FlattenMetricsLine(line);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], (std::pair<std::string, double>{"map/ok", 1}));
}

// MetricsLog mirrors every line it writes, at the line's step, and a resume purges.
TEST(TensorBoardTest, MetricsLogMirrorsEachLine) {
  const fs::path dir = FreshDir("mirror");
  {
    MetricsLog log;
    ASSERT_TRUE(log.Open((dir / "metrics.jsonl").string()).ok());
    ASSERT_TRUE(log.MirrorToTensorBoard(dir.string()).ok());
    ASSERT_TRUE(log.Write({{"event", "warmstart"}, {"heldout_accuracy", 0.08}, {"wall_s", 2.0}}).ok());
    ASSERT_TRUE(log.Write({{"step", 0}, {"version", 1}, {"loss", 0.5}, {"refused", {{"too_long", 1}}}}).ok());
    ASSERT_TRUE(log.Write({{"event", "final"}, {"version", 1}, {"heldout_accuracy", 0.1}}).ok());
  }
  std::vector<fs::path> files = EventFiles(dir);
  ASSERT_EQ(files.size(), 1u);
  const fs::path first_file = files[0];
  std::vector<std::string> records = ReadRecords(ReadFile(first_file.string()).value());
  ASSERT_EQ(records.size(), 4u);
  const DecodedEvent warm = DecodeEvent(records[1]), step = DecodeEvent(records[2]), final_ = DecodeEvent(records[3]);
  EXPECT_EQ(warm.step, 0);
  EXPECT_EQ(warm.values, (std::vector<std::pair<std::string, float>>{{"heldout_accuracy", 0.08f}, {"wall_s", 2.0f}}));
  EXPECT_EQ(step.step, 0);
  EXPECT_EQ(step.values,
            (std::vector<std::pair<std::string, float>>{{"loss", 0.5f}, {"refused/too_long", 1.0f}, {"version", 1.0f}}));
  EXPECT_EQ(final_.step, 1);
  const double now = UnixSeconds();
  EXPECT_NEAR(step.wall_time, now, 60) << "real unix time";

  MetricsLog resumed;
  ASSERT_TRUE(resumed.Open((dir / "metrics.jsonl").string()).ok());
  ASSERT_TRUE(resumed.MirrorToTensorBoard(dir.string(), 1).ok());
  files = EventFiles(dir);
  ASSERT_EQ(files.size(), 2u) << "a resumed run opens a new file";
  const fs::path newer = files[0] == first_file ? files[1] : files[0];
  records = ReadRecords(ReadFile(newer.string()).value());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(DecodeEvent(records[1]).session_status, 1);
  EXPECT_EQ(DecodeEvent(records[1]).step, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace echelon::obs
