#include "echelon/model/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <string>

namespace echelon::model {
namespace {

// A file from a raw header text and `data_bytes` zero bytes of tensor data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

// This process's resident set (VmRSS), MiB.
double ResidentMb() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1048576.0;
}

void ExpectError(const Result<SafetensorsFile>& r, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << *parts.begin();
  for (const std::string& part : parts) {
    EXPECT_NE(r.status().message().find(part), std::string::npos)
        << "message \"" << r.status().message() << "\" lacks \"" << part << "\"";
  }
}

// Refused alike from memory and from a file (ReadSafetensors reads it piece by piece, and
// MapSafetensors maps it).
void ExpectRejected(const std::string& bytes, const std::string& name, std::initializer_list<std::string> parts) {
  ExpectError(ParseSafetensors(bytes, name), parts);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("echelon_st_" + std::to_string(::getpid()) + "_" + name)).string();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  ExpectError(ReadSafetensors(path), parts);
  ExpectError(MapSafetensors(path), parts);
  std::remove(path.c_str());
}

std::map<std::string, at::Tensor> AllDtypes() {
  std::map<std::string, at::Tensor> t;
  t["f32"] = at::arange(6, at::kFloat).reshape({2, 3}) * 0.5 - 1;
  t["f64"] = at::tensor({1e-300, -2.5, 3.25}, at::kDouble);
  t["f16"] = at::tensor({0.5, -1.5, 65504.0}, at::kFloat).to(at::kHalf);
  // bf16 values that are not exactly representable in f16, and an inexact f32 to check rounding is kept.
  t["bf16"] = at::tensor({1.0f, -3.0e38f, 1.0e-30f, 0.1f}, at::kFloat).to(at::kBFloat16).reshape({2, 2});
  t["i64"] = at::tensor({int64_t{1} << 40, int64_t{-7}}, at::kLong);
  t["i32"] = at::tensor({-5, 2147483647}, at::kInt);
  t["i16"] = at::tensor({-300, 300}, at::kShort);
  t["i8"] = at::tensor({-128, 127}, at::kChar);
  t["u8"] = at::tensor({0, 255}, at::kByte);
  t["bool"] = at::tensor({1, 0, 1}, at::kByte).to(at::kBool);
  t["scalar"] = at::scalar_tensor(42.0, at::kFloat);
  t["empty"] = at::empty({0, 4}, at::kFloat);
  return t;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndMetadata) {
  const auto tensors = AllDtypes();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "17"}};
  Result<std::string> bytes = SerializeSafetensors(tensors, meta);
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes->data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "data section must stay 8-byte aligned";

  Result<SafetensorsFile> back = ParseSafetensors(bytes.value(), "mem");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->metadata, meta);
  ASSERT_EQ(back->tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor& got = back->tensors.at(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(got, t)) << name;
  }
}

TEST(SafetensorsTest, FileRoundTripIsByteStable) {
  const std::string path = std::filesystem::temp_directory_path().string() + "/echelon_st_test_" +
                           std::to_string(::getpid()) + ".safetensors";
  const auto tensors = AllDtypes();
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"k", "v"}}).ok());
  Result<SafetensorsFile> back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  // Re-serialising what was read gives the same bytes: nothing is lost or reordered.
  EXPECT_EQ(SerializeSafetensors(back->tensors, back->metadata).value(),
            SerializeSafetensors(tensors, {{"k", "v"}}).value());
  std::remove(path.c_str());
}

// A mapped file gives the tensors a read gives, every dtype (BOOL and the misaligned ones
// copied), and they outlive everything but themselves: the mapping goes with the last of them.
TEST(SafetensorsTest, MappedFileGivesTheTensorsItHolds) {
  const std::string path = std::filesystem::temp_directory_path().string() + "/echelon_st_map_" +
                           std::to_string(::getpid()) + ".safetensors";
  const auto tensors = AllDtypes();
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"k", "v"}}).ok());
  at::Tensor kept;
  {
    Result<SafetensorsFile> mapped = MapSafetensors(path);
    ASSERT_TRUE(mapped.ok()) << mapped.status().message();
    EXPECT_EQ(SerializeSafetensors(mapped->tensors, mapped->metadata).value(),
              SerializeSafetensors(tensors, {{"k", "v"}}).value());
    kept = mapped->tensors.at("f32");
  }
  std::remove(path.c_str());  // the mapping keeps the file's pages
  EXPECT_TRUE(at::equal(kept, tensors.at("f32")));
  EXPECT_EQ(MapSafetensors(path).status().code(), StatusCode::kNotFound);
}

// The pages of a mapped tensor are resident once read and gone from the resident set once
// released; read again, they hold the same values. A tensor not mapped is left as it is.
TEST(SafetensorsTest, ReleasedPagesLeaveTheResidentSetAndReadBackTheSame) {
  const std::string path = std::filesystem::temp_directory_path().string() + "/echelon_st_release_" +
                           std::to_string(::getpid()) + ".safetensors";
  const at::Tensor big = at::arange(16 << 20, at::kFloat);  // 64 MiB
  ASSERT_TRUE(WriteSafetensors(path, {{"big", big}}).ok());
  Result<SafetensorsFile> mapped = MapSafetensors(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  const at::Tensor& view = mapped->tensors.at("big");
  const double before = ResidentMb();
  const double sum = view.sum().item<double>();
  const double read = ResidentMb();
  EXPECT_GT(read - before, 48.0) << "reading the view makes its pages resident";
  ReleaseMappedPages(view);
  EXPECT_LT(ResidentMb() - before, 8.0) << "released";
  EXPECT_EQ(view.sum().item<double>(), sum);
  at::Tensor heap = big.clone();
  ReleaseMappedPages(heap);
  EXPECT_TRUE(at::equal(heap, big));
  std::remove(path.c_str());
}

TEST(SafetensorsTest, ReadsReferenceWrittenFiles) {
  Result<SafetensorsFile> bf16 =
      ReadSafetensors(std::string(ECHELON_TEST_DATA) + "/model/qwen3_bf16/model.safetensors");
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(bf16->metadata.at("format"), "pt");
  const at::Tensor& embed = bf16->tensors.at("model.embed_tokens.weight");
  EXPECT_EQ(embed.scalar_type(), at::kBFloat16);
  EXPECT_EQ(embed.sizes(), (std::vector<int64_t>{300, 64}));
  Result<SafetensorsFile> f32 = ReadSafetensors(std::string(ECHELON_TEST_DATA) + "/model/qwen3_tied/model.safetensors");
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  EXPECT_EQ(f32->tensors.at("model.norm.weight").scalar_type(), at::kFloat);
  EXPECT_EQ(f32->tensors.count("lm_head.weight"), 0u);
}

TEST(SafetensorsTest, RejectsTruncatedFiles) {
  const std::string good = SerializeSafetensors({{"w", at::ones({4}, at::kFloat)}}).value();
  ExpectRejected(good.substr(0, good.size() - 3), "cut.st", {"cut.st", "\"w\"", "past the data"});
  ExpectRejected(good.substr(0, 5), "tiny.st", {"tiny.st", "shorter"});
  ExpectRejected(good.substr(0, 20), "half.st", {"half.st", "header length"});
}

TEST(SafetensorsTest, RejectsHeaderLengthPastEnd) {
  std::string bytes = RawFile("{}", 0);
  bytes[6] = 1;  // header length now about 2^48
  ExpectRejected(bytes, "big.st", {"big.st", "runs past the end"});
}

TEST(SafetensorsTest, RejectsBadJson) {
  ExpectRejected(RawFile("{\"w\": {\"dtype\": ", 0), "bad.st", {"bad.st", "JSON"});
  ExpectRejected(RawFile("[1, 2]", 0), "arr.st", {"arr.st", "JSON object"});
  ExpectError(ParseSafetensors(RawFile(R"({"w": {"dtype": "F32", "shape": [1]}})", 4), "nooff.st"),
              {"nooff.st", "\"w\"", "data_offsets"});
  ExpectRejected(RawFile(R"({"__metadata__": {"a": 1}})", 0), "meta.st", {"meta.st", "__metadata__"});
}

TEST(SafetensorsTest, RejectsOverlappingGappedAndOutOfRangeOffsets) {
  const std::string overlap =
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  ExpectRejected(RawFile(overlap, 12), "o.st", {"o.st", "\"b\"", "overlaps"});
  const std::string gap =
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})";
  ExpectRejected(RawFile(gap, 20), "g.st", {"g.st", "\"b\"", "gap"});
  const std::string one = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  ExpectRejected(RawFile(one, 4), "short.st", {"short.st", "\"a\"", "past the data"});
  ExpectRejected(RawFile(one, 12), "tail.st", {"tail.st", "after the last tensor"});
  const std::string backwards = R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})";
  ExpectRejected(RawFile(backwards, 8), "back.st", {"back.st", "\"a\""});
  const std::string negative = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})";
  ExpectRejected(RawFile(negative, 8), "neg.st", {"neg.st", "\"a\"", "data_offsets"});
}

TEST(SafetensorsTest, RejectsDtypeShapeSizeMismatch) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})";
  ExpectRejected(RawFile(h, 8), "m.st", {"m.st", "\"w\"", "needs 12"});
  const std::string huge = R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})";
  ExpectRejected(RawFile(huge, 8), "huge.st", {"huge.st", "\"w\"", "too large"});
}

TEST(SafetensorsTest, RejectsUnknownDtypeAndBadBools) {
  const std::string h = R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})";
  ExpectRejected(RawFile(h, 2), "d.st", {"d.st", "\"w\"", "unsupported dtype", "F8_E4M3"});
  std::string bools = RawFile(R"({"b": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", 2);
  bools.back() = 7;
  ExpectRejected(bools, "b.st", {"b.st", "\"b\"", "BOOL"});
}

TEST(SafetensorsTest, SerializeRejectsUnsupportedTensors) {
  EXPECT_FALSE(SerializeSafetensors({{"c", at::zeros({2}, at::kComplexFloat)}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"__metadata__", at::zeros({2})}}).ok());
}

}  // namespace
}  // namespace echelon::model
