// The Thrift compact protocol, and the Parquet footer and page headers written in it, read
// from untrusted bytes (src/echelon/data/parquet.h is the reader built on this). Every read
// is checked against the end of its byte range; unknown fields are skipped by their wire
// type (as Thrift's own readers do, so files from newer writers still read); nesting is
// bounded; a list never claims more elements than it has bytes left. A known field with an
// unexpected wire type is an error, not a guess.
//
//   CompactReader r(bytes.data(), bytes.size());
//   FileMetaData meta;
//   Status st = ParseFileMetaData(&r, &meta);   // "Thrift varint runs past the end (byte 97 of 97)"
//
// Only the fields the reader uses are kept; the rest (statistics, indexes, key-value
// metadata, encodings lists, sorting columns) are skipped.
//
// Thread contract: values and a cursor over caller-owned bytes; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::data::parquet {

// Wire types of the compact protocol (low nibble of a field header).
enum CompactType : uint8_t {
  kCtStop = 0, kCtBoolTrue = 1, kCtBoolFalse = 2, kCtByte = 3, kCtI16 = 4, kCtI32 = 5, kCtI64 = 6,
  kCtDouble = 7, kCtBinary = 8, kCtList = 9, kCtSet = 10, kCtMap = 11, kCtStruct = 12,
};

// Nested structs, lists and maps deeper than this are refused: the Parquet footer nests
// about 6 deep (FileMetaData > RowGroup > ColumnChunk > ColumnMetaData > Statistics), so
// 64 leaves room for any future field while bounding the recursion of Skip().
constexpr int kMaxThriftDepth = 64;

// A cursor over [data, data + size) reading the compact protocol.
class CompactReader {
 public:
  CompactReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  Status ReadByte(uint8_t* out);
  // Unsigned LEB128 of at most 10 bytes; a longer or overflowing one is an error.
  Status ReadVarint(uint64_t* out);
  // Zigzag-decoded varints, range-checked for the narrower widths.
  Status ReadI64(int64_t* out);
  Status ReadI32(int32_t* out);
  Status ReadI16(int16_t* out);
  Status ReadDouble(double* out);
  // A length-prefixed byte string; the length is checked against the bytes left.
  Status ReadBinary(std::string* out);

  // A field header inside a struct. `last_id` is the previous field's id (0 at the start);
  // on return *id is the new id (0 with *type == kCtStop at the end of the struct).
  Status ReadFieldHeader(int16_t last_id, int16_t* id, uint8_t* type);
  // A list or set header: element type and count (count <= bytes left).
  Status ReadListHeader(uint8_t* elem_type, uint32_t* count);
  // Skips one value of the given wire type. `in_collection`: a bool inside a list is one
  // byte, while a bool field carries its value in the field header.
  Status Skip(uint8_t type, int depth, bool in_collection = false);

  // "Thrift ... (byte P of N)": where a failure happened.
  Status Error(const std::string& what) const;

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Parquet's enums, by their numbers in parquet.thrift.
enum PhysicalType { kBoolean = 0, kInt32 = 1, kInt64 = 2, kInt96 = 3, kFloat = 4, kDouble = 5,
                    kByteArray = 6, kFixedLenByteArray = 7 };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum ConvertedType { kCvUtf8 = 0, kCvMap = 1, kCvMapKeyValue = 2, kCvList = 3, kCvEnum = 4, kCvDecimal = 5,
                     kCvDate = 6, kCvUint8 = 11, kCvUint16 = 12, kCvUint32 = 13, kCvUint64 = 14,
                     kCvJson = 19, kCvBson = 20, kCvInterval = 21 };
// The LogicalType union: the number of the member that is set.
enum LogicalKind { kLtNone = 0, kLtString = 1, kLtMap = 2, kLtList = 3, kLtEnum = 4, kLtDecimal = 5,
                   kLtDate = 6, kLtTime = 7, kLtTimestamp = 8, kLtInteger = 10, kLtUnknown = 11,
                   kLtJson = 12, kLtBson = 13, kLtUuid = 14, kLtFloat16 = 15, kLtVariant = 16 };
enum Encoding { kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kDeltaBinaryPacked = 5,
                kDeltaLengthByteArray = 6, kDeltaByteArray = 7, kRleDictionary = 8, kByteStreamSplit = 9 };
enum Codec { kUncompressed = 0, kSnappy = 1, kGzip = 2, kLzo = 3, kBrotli = 4, kLz4 = 5, kZstd = 6, kLz4Raw = 7 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

std::string PhysicalTypeName(int type);
std::string EncodingName(int encoding);
std::string CodecName(int codec);

struct LogicalType {
  int kind = kLtNone;
  int bit_width = 0;     // INTEGER
  bool is_signed = true;  // INTEGER
};

struct SchemaElement {
  std::optional<int> type;  // set on leaves only
  int type_length = 0;
  std::optional<int> repetition;
  std::string name;
  std::optional<int> num_children;
  std::optional<int> converted_type;
  LogicalType logical;
};

struct ColumnMetaData {
  int type = -1;
  std::vector<std::string> path_in_schema;
  int codec = -1;
  int64_t num_values = -1;
  int64_t total_compressed_size = -1;
  int64_t data_page_offset = -1;
  std::optional<int64_t> dictionary_page_offset;
};

struct ColumnChunk {
  std::optional<std::string> file_path;  // set: the data lives in another file
  std::optional<ColumnMetaData> meta_data;
  bool encrypted = false;  // crypto_metadata or encrypted_column_metadata present
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t num_rows = -1;
};

struct FileMetaData {
  std::vector<SchemaElement> schema;
  int64_t num_rows = -1;
  std::vector<RowGroup> row_groups;
  bool encrypted = false;  // encryption_algorithm present (plaintext footer, encrypted columns)
};

struct PageHeader {
  int type = -1;
  int32_t uncompressed_page_size = -1;
  int32_t compressed_page_size = -1;
  std::optional<int32_t> crc;
  // DataPageHeader (type 0), DictionaryPageHeader (2) and DataPageHeaderV2 (3) in one: the
  // fields of the page's own kind are filled in.
  int32_t num_values = -1;
  int encoding = -1;
  int definition_level_encoding = kRle;
  int repetition_level_encoding = kRle;
  int32_t num_nulls = 0;                         // v2
  int32_t definition_levels_byte_length = 0;     // v2
  int32_t repetition_levels_byte_length = 0;     // v2
  bool is_compressed = true;                     // v2
  bool has_page_kind = false;  // the header for `type` was present
};

// The footer; errors name the missing or malformed field.
Status ParseFileMetaData(CompactReader* r, FileMetaData* out);
// One page header; afterwards r->pos() is its length in bytes.
Status ParsePageHeader(CompactReader* r, PageHeader* out);

}  // namespace echelon::data::parquet
