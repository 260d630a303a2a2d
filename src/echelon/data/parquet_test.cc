// The Parquet reader: its pieces on hand-computed bytes (Snappy, LZ4, the RLE / bit-packed
// hybrid, DELTA_BINARY_PACKED, Thrift's compact protocol), whole files built here byte by
// byte for each feature and each refusal, and the files of tests/data/parquet (written by
// parquet-wasm and hyparquet-writer, see its README) against their JSONL twin. Damaged copies
// of those files, truncated at every length and with bytes overwritten, each give one error
// line or rows, never a crash.
#include "echelon/data/parquet.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "echelon/data/parquet_codec.h"
#include "echelon/data/parquet_encoding.h"
#include "echelon/data/parquet_thrift.h"

namespace echelon::data {
namespace {

using nlohmann::json;
using namespace parquet;  // NOLINT(build/namespaces)

const std::string kDir = std::string(ECHELON_TEST_DATA) + "/parquet/";

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s += static_cast<char>(x);
  return s;
}
const uint8_t* U(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- Snappy and LZ4 ----

Result<std::string> Snappy(const std::string& in, size_t expected) {
  std::string out;
  Status st = SnappyUncompress(U(in), in.size(), expected, &out);
  if (!st.ok()) return st;
  return out;
}

TEST(ParquetTest, SnappyLiteralsAndCopies) {
  // preamble 5, literal "hello" (tag (5-1)<<2)
  EXPECT_EQ(Snappy(Bytes({5, 4 << 2}) + "hello", 5).value(), "hello");
  // "ab", then a 1-byte-offset copy of 6 at offset 2 (overlapping: repeats the pattern).
  EXPECT_EQ(Snappy(Bytes({8, 1 << 2}) + "ab" + Bytes({1 | ((6 - 4) << 2), 2}), 8).value(), "abababab");
  // 2-byte-offset copy: length 3 at offset 4; 4-byte-offset copy: length 2 at offset 7.
  EXPECT_EQ(Snappy(Bytes({9, 3 << 2}) + "abcd" + Bytes({2 | (2 << 2), 4, 0}) + Bytes({3 | (1 << 2), 7, 0, 0, 0}), 9).value(),
            "abcdabcab");
  // A literal whose length (70 - 1) follows the tag in one byte (tag 60).
  const std::string seventy(70, 'z');
  EXPECT_EQ(Snappy(Bytes({70, 60 << 2, 69}) + seventy, 70).value(), seventy);
}

TEST(ParquetTest, SnappyRefusesBadStreams) {
  auto error = [](const std::string& in, size_t expected) { return Snappy(in, expected).status().message(); };
  EXPECT_EQ(error(Bytes({4, 1 << 2}) + "ab" + Bytes({1, 3}), 6),  // offset 3 with 2 bytes written
            "Snappy data decompresses to 4 bytes, the page header says 6");
  EXPECT_EQ(error(Bytes({6, 1 << 2}) + "ab" + Bytes({1, 3}), 6), "Snappy copy at output byte 2 reaches back 3 bytes, before the start");
  EXPECT_EQ(error(Bytes({6, 1 << 2}) + "ab" + Bytes({1, 0}), 6), "Snappy copy at output byte 2 reaches back 0 bytes, before the start");
  EXPECT_EQ(error(Bytes({3, 4 << 2}) + "hello", 3),  // the preamble says 3, the page 3: the literal overruns
            "Snappy literal of 5 bytes at output byte 0 runs past the 3 bytes the page header says");
  EXPECT_EQ(error(Bytes({5, 4 << 2}) + "hel", 5), "Snappy literal of 5 bytes at input byte 2 runs past the end of the 5-byte page");
  EXPECT_EQ(error(Bytes({5, 2}), 5), "Snappy copy at input byte 2 is truncated");
  EXPECT_EQ(error(Bytes({0x80, 0x80, 0x80, 0x80, 0x80, 1}), 0), "Snappy length preamble is truncated or too long");
}

TEST(ParquetTest, Lz4Blocks) {
  std::string out;
  // token: 2 literals, match of 4 + 2 = 6 at offset 2 (overlapping), then a last literal "!"
  const std::string block = Bytes({0x22}) + "ab" + Bytes({2, 0, 0x10}) + "!";
  ASSERT_TRUE(Lz4RawUncompress(U(block), block.size(), 9, &out).ok());
  EXPECT_EQ(out, "abababab!");
  const std::string bad = Bytes({0x20}) + "ab" + Bytes({5, 0});
  EXPECT_EQ(Lz4RawUncompress(U(bad), bad.size(), 6, &out).message(),
            "LZ4 copy at output byte 2 reaches back 5 bytes, before the start");
}

TEST(ParquetTest, ZstdPageSizeMustMatchTheHeader) {
  const std::string text = "twelve bytes";
  std::string z(ZSTD_compressBound(text.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), text.data(), text.size(), 3));
  std::string out;
  ASSERT_TRUE(Decompress(kZstd, U(z), z.size(), 12, &out).ok());
  EXPECT_EQ(out, text);
  EXPECT_EQ(Decompress(kZstd, U(z), z.size(), 16, &out).message(), "ZSTD data decompresses to 12 bytes, the page header says 16");
  EXPECT_EQ(Decompress(kZstd, U(z), z.size(), 8, &out).message(), "ZSTD data decompresses past the 8 bytes the page header says");
  EXPECT_EQ(Decompress(kBrotli, U(z), z.size(), 8, &out).message(),
            "codec BROTLI is not supported; rewrite the file with snappy or zstd");
}

// ---- RLE / bit-packed hybrid, DELTA_BINARY_PACKED ----

TEST(ParquetTest, RleHybridRunsAndBitPacking) {
  // RLE run of five 3s (bit width 3: one value byte), then one bit-packed group of 0..7 —
  // the example in Parquet's Encodings.md: 0x88 0xC6 0xFA.
  const std::string data = Bytes({5 << 1, 3, (1 << 1) | 1, 0x88, 0xC6, 0xFA});
  RleDecoder rle(U(data), data.size(), 3);
  std::vector<uint32_t> v(13);
  ASSERT_TRUE(rle.Decode(13, v.data()).ok());
  EXPECT_EQ(v, (std::vector<uint32_t>{3, 3, 3, 3, 3, 0, 1, 2, 3, 4, 5, 6, 7}));
  RleDecoder more(U(data), data.size(), 3);
  v.resize(14);
  EXPECT_EQ(more.Decode(14, v.data()).message(), "RLE data ends after 13 of 14 values");

  std::vector<uint8_t> levels;
  EXPECT_EQ(DecodeLevels(U(data), data.size(), 2, 5, &levels).message(),  // width 2: the run's 3 fits, but
            "level 3 is above the column's maximum 2");                          // levels stop at 2
  const std::string runs = Bytes({4 << 1, 2, 2 << 1, 1});
  levels.clear();
  ASSERT_TRUE(DecodeLevels(U(runs), runs.size(), 2, 6, &levels).ok());
  EXPECT_EQ(levels, (std::vector<uint8_t>{2, 2, 2, 2, 1, 1}));
  levels.clear();
  EXPECT_EQ(DecodeLevels(U(runs), runs.size(), 1, 6, &levels).message(), "RLE run value 2 does not fit in 1 bits");
  EXPECT_EQ(BitWidth(0), 0);
  EXPECT_EQ(BitWidth(1), 1);
  EXPECT_EQ(BitWidth(7), 3);
  EXPECT_EQ(BitWidth(8), 4);
}

TEST(ParquetTest, DeltaBinaryPackedExamplesOfTheSpec) {
  // 1, 2, 3, 4, 5: block 128, 4 miniblocks, 5 values, first 1; min delta 1, widths 0.
  const std::string ones = Bytes({0x80, 0x01, 4, 5, 2, 2, 0, 0, 0, 0});
  std::vector<int64_t> v;
  size_t used = 0;
  ASSERT_TRUE(DecodeDeltaBinaryPacked(U(ones), ones.size(), 5, &v, &used).ok());
  EXPECT_EQ(v, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(used, ones.size());
  // 7, 5, 3, 1, 2, 3, 4, 5: min delta -2, deltas 0 0 0 3 3 3 3 in 2 bits.
  const std::string mixed = Bytes({0x80, 0x01, 4, 8, 14, 3, 2, 0, 0, 0, 0xC0, 0x3F, 0, 0, 0, 0, 0, 0});
  v.clear();
  ASSERT_TRUE(DecodeDeltaBinaryPacked(U(mixed), mixed.size(), 8, &v, &used).ok());
  EXPECT_EQ(v, (std::vector<int64_t>{7, 5, 3, 1, 2, 3, 4, 5}));
  v.clear();
  EXPECT_EQ(DecodeDeltaBinaryPacked(U(mixed), mixed.size() - 1, 8, &v, &used).message(),
            "DELTA_BINARY_PACKED miniblock runs past the page");
  EXPECT_EQ(DecodeDeltaBinaryPacked(U(mixed), mixed.size(), 9, &v, &used).message(),
            "DELTA_BINARY_PACKED header says 8 values, the page has 9");
}

// ---- Thrift compact protocol ----

TEST(ParquetTest, ThriftVarintsAndZigzag) {
  const std::string b = Bytes({0x96, 0x01, 0x01, 0x02, 0x03, 0xfe, 0xff, 0xff, 0xff, 0x0f});
  CompactReader r(U(b), b.size());
  uint64_t u = 0;
  int64_t i = 0;
  int32_t i32 = 0;
  ASSERT_TRUE(r.ReadVarint(&u).ok());
  EXPECT_EQ(u, 150u);
  ASSERT_TRUE(r.ReadI64(&i).ok());
  EXPECT_EQ(i, -1);
  ASSERT_TRUE(r.ReadI64(&i).ok());
  EXPECT_EQ(i, 1);
  ASSERT_TRUE(r.ReadI64(&i).ok());
  EXPECT_EQ(i, -2);
  ASSERT_TRUE(r.ReadI32(&i32).ok());  // zigzag 0xfffffffe = 2^32 - 2 -> 2147483647
  EXPECT_EQ(i32, 2147483647);
  EXPECT_EQ(r.ReadVarint(&u).message(), "Thrift varint runs past the end (byte 10 of 10)");

  const std::string big = Bytes({0x80, 0x80, 0x80, 0x80, 0x10});  // zigzag 2^32: out of i32
  CompactReader r2(U(big), big.size());
  EXPECT_EQ(r2.ReadI32(&i32).message(), "Thrift i32 out of range: 2147483648 (byte 5 of 5)");
  const std::string eleven(11, static_cast<char>(0x80));
  CompactReader r3(U(eleven), eleven.size());
  EXPECT_EQ(r3.ReadVarint(&u).message(), "Thrift varint longer than 10 bytes (byte 10 of 11)");
  const std::string wide = std::string(9, static_cast<char>(0x80)) + "\x7f";  // bits past the 64th
  CompactReader r4(U(wide), wide.size());
  EXPECT_EQ(r4.ReadVarint(&u).message(), "Thrift varint overflows 64 bits (byte 10 of 10)");
}

TEST(ParquetTest, ThriftSkipsUnknownFieldsAndRefusesLies) {
  // A struct: field 1 i32 (delta 1), field 40 (long form) holding a list of 2 structs, a map,
  // a bool field, a double, then stop.
  std::string s = Bytes({0x15, 0x04});                               // 1: i32 2
  s += Bytes({0x09, 80, 0x2C});                                      // 40: list<struct> of 2
  s += Bytes({0x18, 0x02}) + "hi" + Bytes({0x00}) + Bytes({0x00});   //   {1: "hi"}, {}
  s += Bytes({0x1B, 0x01, 0x58, 0x02, 0x01}) + "k";                  // 41: map<i32, binary> {1: "k"}
  s += Bytes({0x11, 0x17, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x00});      // 42: true; 43: 1.0; stop
  CompactReader r(U(s), s.size());
  ASSERT_TRUE(r.Skip(kCtStruct, 0).ok()) << r.Skip(kCtStruct, 0).message();
  EXPECT_EQ(r.remaining(), 0u);

  const std::string lie = Bytes({0xF9, 0xFF, 0xFF, 0x03, 0x05});  // list of 65535 i32s in 1 byte
  CompactReader r2(U(lie), lie.size());
  EXPECT_EQ(r2.Skip(kCtList, 0).message(), "Thrift list of 65535 elements in 1 bytes (byte 4 of 5)");
  const std::string deep(200, static_cast<char>(0x1C));  // struct in struct in struct ...
  CompactReader r3(U(deep), deep.size());
  EXPECT_NE(r3.Skip(kCtStruct, 0).message().find("nested deeper than 64"), std::string::npos);
  const std::string unknown = Bytes({0x1E});  // wire type 14
  CompactReader r4(U(unknown), unknown.size());
  EXPECT_EQ(r4.Skip(kCtStruct, 0).message(), "Thrift unknown wire type 14 (byte 1 of 1)");
}

// ---- Files built here byte by byte ----

// A compact-protocol writer: just enough for footers and page headers.
class ThriftOut {
 public:
  std::string bytes;
  void Varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes += static_cast<char>(v | 0x80);
    bytes += static_cast<char>(v);
  }
  static uint64_t Zig(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
  void Field(int id, int type) {
    if (id > last_.back() && id - last_.back() <= 15) {
      bytes += static_cast<char>(((id - last_.back()) << 4) | type);
    } else {
      bytes += static_cast<char>(type);
      Varint(Zig(id));
    }
    last_.back() = id;
  }
  void I32(int id, int64_t v) { Field(id, kCtI32), Varint(Zig(v)); }
  void I64(int id, int64_t v) { Field(id, kCtI64), Varint(Zig(v)); }
  void Str(int id, const std::string& s) { Field(id, kCtBinary), Varint(s.size()), bytes += s; }
  void Begin(int id) { Field(id, kCtStruct), last_.push_back(0); }
  void BeginElement() { last_.push_back(0); }
  void End() { bytes += '\0', last_.pop_back(); }
  void List(int id, int elem, size_t n) {
    Field(id, kCtList);
    if (n < 15) {
      bytes += static_cast<char>((n << 4) | elem);
    } else {
      bytes += static_cast<char>(0xF0 | elem);
      Varint(n);
    }
  }

 private:
  std::vector<int> last_{0};
};

struct TestPage {
  int type = kDataPage;
  std::string body;  // as stored (compressed when the column's codec compresses)
  int num_values = 0;
  int encoding = kPlain;
  int64_t uncompressed = -1;  // -1: body.size()
};

struct TestColumn {
  std::vector<std::string> path;
  int type = kInt32;
  int codec = kUncompressed;
  std::vector<TestPage> pages;
  int64_t num_values = 0;
  int64_t data_page_offset = -1;  // -1: where its pages are
};

struct TestElement {
  std::string name;
  int type = -1;
  int repetition = -1;
  int children = 0;
  int converted = -1;
  int logical = 0;
  int type_length = 0;
};

std::string PageBytes(const TestPage& p) {
  ThriftOut t;
  t.I32(1, p.type);
  t.I32(2, p.uncompressed >= 0 ? p.uncompressed : static_cast<int64_t>(p.body.size()));
  t.I32(3, p.body.size());
  t.Begin(p.type == kDictionaryPage ? 7 : 5);
  t.I32(1, p.num_values);
  t.I32(2, p.encoding);
  if (p.type == kDataPage) t.I32(3, kRle), t.I32(4, kRle);
  t.End();
  t.End();
  return t.bytes + p.body;
}

std::string BuildFile(const std::vector<TestElement>& schema, const std::vector<TestColumn>& cols, int64_t rows) {
  std::string file = "PAR1";
  std::vector<int64_t> offsets, sizes;
  for (const TestColumn& c : cols) {
    offsets.push_back(file.size());
    std::string chunk;
    for (const TestPage& p : c.pages) chunk += PageBytes(p);
    sizes.push_back(chunk.size());
    file += chunk;
  }
  ThriftOut m;
  m.I32(1, 1);
  m.List(2, kCtStruct, schema.size());
  for (const TestElement& e : schema) {
    m.BeginElement();
    if (e.type >= 0) m.I32(1, e.type);
    if (e.type_length > 0) m.I32(2, e.type_length);
    if (e.repetition >= 0) m.I32(3, e.repetition);
    m.Str(4, e.name);
    if (e.children > 0) m.I32(5, e.children);
    if (e.converted >= 0) m.I32(6, e.converted);
    if (e.logical > 0) m.Begin(10), m.Begin(e.logical), m.End(), m.End();
    m.End();
  }
  m.I64(3, rows);
  m.List(4, kCtStruct, 1);
  m.BeginElement();
  m.List(1, kCtStruct, cols.size());
  for (size_t i = 0; i < cols.size(); ++i) {
    const TestColumn& c = cols[i];
    m.BeginElement();
    m.I64(2, offsets[i]);
    m.Begin(3);
    m.I32(1, c.type);
    m.List(2, kCtI32, 1), m.Varint(ThriftOut::Zig(kPlain));
    m.List(3, kCtBinary, c.path.size());
    for (const std::string& p : c.path) m.Varint(p.size()), m.bytes += p;
    m.I32(4, c.codec);
    m.I64(5, c.num_values);
    m.I64(6, sizes[i]);
    m.I64(7, sizes[i]);
    m.I64(9, c.data_page_offset >= 0 ? c.data_page_offset : offsets[i]);
    m.End();
    m.End();
  }
  m.I64(2, file.size());
  m.I64(3, rows);
  m.End();
  m.bytes += '\0';
  const uint32_t len = m.bytes.size();
  file += m.bytes;
  file.append(reinterpret_cast<const char*>(&len), 4);
  return file + "PAR1";
}

std::string Int32s(std::initializer_list<int32_t> v) {
  std::string s;
  for (int32_t x : v) s.append(reinterpret_cast<const char*>(&x), 4);
  return s;
}
std::string Strings(std::initializer_list<std::string> v) {
  std::string s;
  for (const std::string& x : v) {
    const uint32_t n = x.size();
    s.append(reinterpret_cast<const char*>(&n), 4);
    s += x;
  }
  return s;
}
// Levels behind their 4-byte length (data page v1).
std::string Levels(const std::string& rle) {
  const uint32_t n = rle.size();
  return std::string(reinterpret_cast<const char*>(&n), 4) + rle;
}

const TestElement kRoot{"schema", -1, -1, 1};

std::string Rows(const std::string& file, const ParquetLimits& limits = ParquetLimits()) {
  auto rows = ParseParquetRows(file, "t.parquet", limits);
  if (!rows.ok()) return rows.status().message();
  std::string out;
  for (const json& r : rows.value()) out += r.dump() + "\n";
  return out;
}

TEST(ParquetTest, LegacyTwoLevelListAndBareRepeatedField) {
  // optional group a (LIST) { repeated int32 element; }: [1, 2], [], null.
  // rep 0 1 0 0 (one bit-packed group of width 1); def 2 2 1 0 (width 2).
  const std::string page = Levels(Bytes({3, 0x02})) + Levels(Bytes({3, 0x1A, 0x00})) + Int32s({1, 2});
  const std::string list = BuildFile({kRoot, {"a", -1, kOptional, 1, kCvList}, {"element", kInt32, kRepeated}},
                                     {{{"a", "element"}, kInt32, kUncompressed, {{kDataPage, page, 4}}, 4}}, 3);
  EXPECT_EQ(Rows(list), "{\"a\":[1,2]}\n{\"a\":[]}\n{\"a\":null}\n");
  // repeated int32 x (no annotation): [1, 2], [] — rep 0 1 0, def 1 1 0.
  const std::string bare_page = Levels(Bytes({3, 0x02})) + Levels(Bytes({3, 0x03})) + Int32s({1, 2});
  const std::string bare = BuildFile({kRoot, {"x", kInt32, kRepeated}},
                                     {{{"x"}, kInt32, kUncompressed, {{kDataPage, bare_page, 3}}, 3}}, 2);
  EXPECT_EQ(Rows(bare), "{\"x\":[1,2]}\n{\"x\":[]}\n");
}

TEST(ParquetTest, MapWithIntegerKeysIsAnArrayOfPairs) {
  // required group m (MAP) { repeated group key_value { required int32 key; optional binary value (UTF8); } }
  // one row {7: "a", 9: null}: key rep 0 1, def 1 1; value rep 0 1, def 2 1.
  const std::vector<TestElement> schema = {kRoot, {"m", -1, kRequired, 1, kCvMap}, {"key_value", -1, kRepeated, 2},
                                           {"key", kInt32, kRequired}, {"value", kByteArray, kOptional, 0, kCvUtf8}};
  const std::string keys = Levels(Bytes({3, 0x02})) + Levels(Bytes({3, 0x03})) + Int32s({7, 9});
  const std::string values = Levels(Bytes({3, 0x02})) + Levels(Bytes({3, 0x06})) + Strings({"a"});
  const std::string file = BuildFile(schema, {{{"m", "key_value", "key"}, kInt32, kUncompressed, {{kDataPage, keys, 2}}, 2},
                                              {{"m", "key_value", "value"}, kByteArray, kUncompressed, {{kDataPage, values, 2}}, 2}},
                                     1);
  EXPECT_EQ(Rows(file), "{\"m\":[{\"key\":7,\"value\":\"a\"},{\"key\":9,\"value\":null}]}\n");
}

TEST(ParquetTest, ScalarTypes) {
  // UUID, FLOAT16, an unsigned INT32, BYTE_STREAM_SPLIT doubles, and unannotated binary text.
  std::string uuid;
  for (int i = 0; i < 16; ++i) uuid += static_cast<char>(i * 17);
  const std::string half = Bytes({0x00, 0x3C, 0x00, 0xC0});  // 1.0, -2.0
  double d[2] = {0.5, -1.25};
  std::string split(16, '\0');
  for (int b = 0; b < 8; ++b)
    for (int i = 0; i < 2; ++i) split[b * 2 + i] = reinterpret_cast<const char*>(&d[i])[b];
  const std::string file = BuildFile(
      {{"schema", -1, -1, 5}, {"u", kFixedLenByteArray, kRequired, 0, -1, kLtUuid, 16},
       {"h", kFixedLenByteArray, kRequired, 0, -1, kLtFloat16, 2}, {"n", kInt32, kRequired, 0, kCvUint32},
       {"d", kDouble, kRequired}, {"b", kByteArray, kRequired}},
      {{{"u"}, kFixedLenByteArray, kUncompressed, {{kDataPage, uuid + uuid, 2}}, 2},
       {{"h"}, kFixedLenByteArray, kUncompressed, {{kDataPage, half, 2}}, 2},
       {{"n"}, kInt32, kUncompressed, {{kDataPage, Int32s({-1, 5}), 2}}, 2},
       {{"d"}, kDouble, kUncompressed, {{kDataPage, split, 2, kByteStreamSplit}}, 2},
       {{"b"}, kByteArray, kUncompressed, {{kDataPage, Strings({"plain", "ü"}), 2}}, 2}},
      2);
  EXPECT_EQ(Rows(file),
            "{\"b\":\"plain\",\"d\":0.5,\"h\":1.0,\"n\":4294967295,\"u\":\"00112233-4455-6677-8899-aabbccddeeff\"}\n"
            "{\"b\":\"ü\",\"d\":-1.25,\"h\":-2.0,\"n\":5,\"u\":\"00112233-4455-6677-8899-aabbccddeeff\"}\n");
}

// One required INT32 column "x" of two rows in the given pages.
std::string OneColumn(const std::vector<TestPage>& pages, int codec = kUncompressed, int type = kInt32,
                      int64_t offset = -1) {
  return BuildFile({kRoot, {"x", type, kRequired}}, {{{"x"}, type, codec, pages, 2, offset}}, 2);
}

TEST(ParquetTest, DictionaryPagesAndTheirErrors) {
  const TestPage dict{kDictionaryPage, Int32s({10, 20}), 2};
  // indices 1, 0: bit width 1, one bit-packed group 0b01.
  EXPECT_EQ(Rows(OneColumn({dict, {kDataPage, Bytes({1, 3, 0x01}), 2, kRleDictionary}})), "{\"x\":20}\n{\"x\":10}\n");
  EXPECT_EQ(Rows(OneColumn({dict, {kDataPage, Bytes({3, 3, 0x05}), 2, kRleDictionary}})),
            "t.parquet: RLE_DICTIONARY values: dictionary index 5 is out of range (the dictionary has 2 values) (column x, row group 0, page 1)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Bytes({1, 3, 0x01}), 2, kRleDictionary}})),
            "t.parquet: RLE_DICTIONARY values: a dictionary-encoded page, but the column chunk has no dictionary page "
            "(column x, row group 0, page 0)");
  EXPECT_EQ(Rows(OneColumn({dict, dict})), "t.parquet: a second dictionary page (column x, row group 0, page 1)");
}

TEST(ParquetTest, PagesThatLieAboutTheirSize) {
  // A Snappy page of 8 bytes whose header says 12.
  const std::string snappy = Bytes({8, 7 << 2}) + Int32s({1, 2});
  EXPECT_EQ(Rows(OneColumn({{kDataPage, snappy, 2, kPlain, 8}}, kSnappy)), "{\"x\":1}\n{\"x\":2}\n");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, snappy, 2, kPlain, 12}}, kSnappy)),
            "t.parquet: Snappy data decompresses to 8 bytes, the page header says 12 (column x, row group 0, page 0)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1, 2}), 2, kPlain, 9}})),
            "t.parquet: UNCOMPRESSED page has 8 bytes, the page header says 9 (column x, row group 0, page 0)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1}), 2}})),
            "t.parquet: PLAIN values: PLAIN INT32: 2 values need 2 x 4 bytes, the page has 4 (column x, row group 0, page 0)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1}), 1}})),
            "t.parquet: the column chunk ends after 1 of its 2 values (column x, row group 0, page 1)");
  ParquetLimits small;
  small.max_page_bytes = 4;
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1, 2}), 2}}), small),
            "t.parquet: page of 8 bytes is over the reader's limit of 4 (column x, row group 0, page 0)");
}

TEST(ParquetTest, ChunksOutsideTheFileAndHugeCountsAreRefusedBeforeAllocating) {
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1, 2}), 2}}, kUncompressed, kInt32, 1 << 30)),
            "t.parquet: column chunk at bytes 1073741824..1073741849 lies outside the file's data (bytes 4..29) "
            "(column x, row group 0)");
  // An optional column whose one page claims 2^30 nulls in a 6-byte RLE run: refused before
  // any level array is sized, by the budget of a file this small (64 entries a byte + 2^20).
  const std::string nulls = Levels(Bytes({0x80, 0x80, 0x80, 0x80, 0x08, 0}));
  const std::string file = BuildFile({kRoot, {"x", kInt32, kOptional}},
                                     {{{"x"}, kInt32, kUncompressed, {{kDataPage, nulls, 1 << 30}}, 1 << 30}}, 1 << 30);
  const std::string budget = std::to_string(64 * file.size() + (1 << 20));
  EXPECT_EQ(Rows(file), "t.parquet: the row groups hold more than " + budget +
                            " rows, the reader's limit for a file of " + std::to_string(file.size()) + " bytes");
  // One row whose repeated column claims 2^30 entries.
  const std::string many = BuildFile({kRoot, {"x", kInt32, kRepeated}},
                                     {{{"x"}, kInt32, kUncompressed, {{kDataPage, nulls + nulls, 1 << 30}}, 1 << 30}}, 1);
  EXPECT_EQ(Rows(many), "t.parquet: column chunk of 1073741824 values is over the reader's limit of " +
                            std::to_string(64 * many.size() + (1 << 20)) + " for a file of this size (column x, row group 0)");
}

TEST(ParquetTest, UnsupportedFeaturesNameTheColumn) {
  EXPECT_EQ(Rows(OneColumn({{kDataPage, std::string(24, 'a'), 2}}, kUncompressed, kInt96)),
            "t.parquet: schema: INT96 (legacy timestamps) is not supported; write timestamps as INT64 (column x)");
  EXPECT_EQ(Rows(BuildFile({kRoot, {"f", kFixedLenByteArray, kRequired, 0, -1, 0, 4}}, {}, 0)),
            "t.parquet: schema: FIXED_LEN_BYTE_ARRAY of 4 bytes without a UUID or FLOAT16 annotation is not supported "
            "(column f)");
  EXPECT_EQ(Rows(BuildFile({kRoot, {"p", kInt64, kRequired, 0, kCvDecimal}}, {}, 0)),
            "t.parquet: schema: DECIMAL values are not supported; store them as DOUBLE or as strings (column p)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1, 2}), 2}}, kBrotli)),
            "t.parquet: codec BROTLI is not supported; rewrite the file with snappy or zstd (column x, row group 0)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Int32s({1, 2}), 2, kBitPacked}})),
            "t.parquet: BIT_PACKED values: encoding BIT_PACKED is not supported (column x, row group 0, page 0)");
  EXPECT_EQ(Rows(OneColumn({{kDataPage, Strings({"ok", "\xff"}), 2}}, kUncompressed, kByteArray)),
            "t.parquet: PLAIN values: a binary value of 1 bytes is not valid UTF-8 text (a BYTE_ARRAY without a string "
            "annotation is read as text) (column x, row group 0, page 0)");
  std::vector<TestElement> deep = {kRoot};
  for (int i = 0; i < 40; ++i) deep.push_back({"g" + std::to_string(i), -1, kOptional, 1});
  deep.push_back({"leaf", kInt32, kOptional});
  const std::string m = Rows(BuildFile(deep, {}, 0));
  EXPECT_EQ(m.substr(0, 47), "t.parquet: schema: nested deeper than 32 (colum") << m;
  // Regression (found by fuzzing): the root promises two columns, its first group's child
  // takes the last element, and the second column was read past the end of the schema.
  EXPECT_EQ(Rows(BuildFile({{"schema", -1, -1, 2}, {"g", -1, kOptional, 1}, {"leaf", kInt32, kOptional}}, {}, 0)),
            "t.parquet: schema: the schema's root claims more children than the schema holds");
  EXPECT_EQ(Rows(BuildFile({{"schema", -1, -1, 1}, {"g", -1, kOptional, 3}, {"leaf", kInt32, kOptional}}, {}, 0)),
            "t.parquet: schema: schema element g claims 3 children, the schema has 1 elements left");
  std::string pare = OneColumn({{kDataPage, Int32s({1, 2}), 2}});
  pare.replace(pare.size() - 4, 4, "PARE");
  EXPECT_EQ(Rows(pare), "t.parquet: encrypted Parquet files (PARE footer) are not supported");
}

// Regression (found by fuzzing): names are JSON keys and parts of one-line messages.
TEST(ParquetTest, ColumnNamesAreUtf8AndEscapedInMessages) {
  EXPECT_EQ(Rows(BuildFile({kRoot, {"bad\xff", kInt32, kRequired}}, {}, 0)),
            "t.parquet: schema: the column name is not valid UTF-8 (column bad\\xff)");
  const std::string file = BuildFile({kRoot, {"a\nb", kInt32, kRequired}},
                                     {{{"other"}, kInt32, kUncompressed, {{kDataPage, Int32s({1, 2}), 2}}, 2}}, 2);
  EXPECT_EQ(Rows(file), "t.parquet: the column chunk is for column other, the schema's column here is a\\x0ab "
                        "(column a\\x0ab, row group 0)");
}

TEST(ParquetTest, TheTextBudgetStopsDictionaryBombs) {
  // A 6-byte string repeated by a dictionary: three rows make 18 bytes of text.
  const std::string file = BuildFile(
      {kRoot, {"s", kByteArray, kRequired, 0, kCvUtf8}},
      {{{"s"}, kByteArray, kUncompressed, {{kDictionaryPage, Strings({"abcdef"}), 1}, {kDataPage, Bytes({0, 3 << 1}), 3, kRleDictionary}}, 3}},
      3);
  EXPECT_EQ(Rows(file), "{\"s\":\"abcdef\"}\n{\"s\":\"abcdef\"}\n{\"s\":\"abcdef\"}\n");
  ParquetLimits small;
  small.max_text_bytes = 15;
  EXPECT_EQ(Rows(file, small), "t.parquet: RLE_DICTIONARY values: the decoded text is larger than the reader's limit "
                               "(column s, row group 0, page 1)");
}

TEST(ParquetTest, FileFramingErrors) {
  EXPECT_EQ(Rows(""), "t.parquet: not a Parquet file: 0 bytes, too short");
  EXPECT_EQ(Rows("{\"prompt\": \"hello\"}\n"), "t.parquet: not a Parquet file: it does not start with PAR1");
  const std::string good = OneColumn({{kDataPage, Int32s({1, 2}), 2}});
  EXPECT_EQ(Rows(good.substr(0, good.size() - 10)), "t.parquet: truncated or not a Parquet file: it does not end with PAR1");
  std::string long_footer = good;
  long_footer[long_footer.size() - 6] = 0x10;  // footer length + 2^20
  uint32_t footer = 0;
  std::memcpy(&footer, good.data() + good.size() - 8, 4);
  EXPECT_EQ(Rows(long_footer), "t.parquet: footer length " + std::to_string(footer + (1 << 20)) +
                                   " runs past the start of the " + std::to_string(good.size()) + "-byte file");
  std::string cut_footer = good;
  cut_footer[cut_footer.size() - 8] = 3;  // footer length 3: the metadata ends early
  EXPECT_EQ(Rows(cut_footer).substr(0, 31), "t.parquet: corrupt footer: Thri");
  auto missing = ReadParquetRows("/nonexistent/data.parquet");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/data.parquet"), std::string::npos);
}

// ---- The files of independent writers ----

std::vector<json> Twin() {
  std::vector<json> rows;
  std::ifstream in(kDir + "verl.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

TEST(ParquetTest, IndependentWritersFilesEqualTheirTwin) {
  const std::vector<json> want = Twin();
  ASSERT_EQ(want.size(), 18u);
  for (const char* name : {"verl_snappy", "verl_zstd", "verl_gzip_delta", "verl_hyparquet"}) {
    auto rows = ReadParquetRows(kDir + name + ".parquet");
    ASSERT_TRUE(rows.ok()) << rows.status().message();
    ASSERT_EQ(rows->size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(rows.value()[i], want[i]) << name << " row " << i;
  }
  // What a consumer of verl's layout reads, by hand.
  const std::vector<json> rows = ReadParquetRows(kDir + "verl_snappy.parquet").value();
  EXPECT_EQ(rows[0]["prompt"][1]["role"], "user");
  EXPECT_EQ(rows[0]["prompt"][1]["content"].get<std::string>().substr(0, 33), "Question 0: 小明有 0 个苹果");
  EXPECT_EQ(rows[3]["prompt"][0]["content"].get<std::string>().size() >= 400, true);
  EXPECT_TRUE(rows[1]["extra_info"].is_null());
  EXPECT_TRUE(rows[16]["prompt"].is_null());
  EXPECT_EQ(rows[9]["prompt"], json::array());
  EXPECT_EQ(rows[2]["extra_info"]["index"], 2);
  EXPECT_TRUE(rows[2]["extra_info"]["answer"].is_null());
  EXPECT_EQ(rows[5]["reward_model"]["ground_truth"], "35");
}

// Every truncation and many overwritten bytes of real files: rows or one error line naming
// the file, never a crash (the ASan build of this test is the real check).
TEST(ParquetTest, DamagedFilesGiveOneErrorLine) {
  for (const char* name : {"verl_snappy", "verl_zstd", "verl_hyparquet"}) {
    const std::string good = Slurp(kDir + name + ".parquet");
    ASSERT_GT(good.size(), 1000u);
    auto check = [&](const std::string& bytes, const std::string& what) {
      auto rows = ParseParquetRows(bytes, "d.parquet");
      if (rows.ok()) return;
      const std::string& m = rows.status().message();
      EXPECT_EQ(m.rfind("d.parquet: ", 0), 0u) << what << ": " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": " << m;
    };
    for (size_t n = 0; n < good.size(); n += 7) {
      auto rows = ParseParquetRows(good.substr(0, n), "d.parquet");
      EXPECT_FALSE(rows.ok()) << name << " cut at " << n;
    }
    for (size_t i = 4; i + 4 < good.size(); i += 3) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (0x5A + i % 7));
      check(bad, std::string(name) + " byte " + std::to_string(i));
    }
  }
}

}  // namespace
}  // namespace echelon::data
