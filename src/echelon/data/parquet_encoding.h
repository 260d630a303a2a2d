// The value and level encodings of Parquet data pages, decoded from untrusted bytes for the
// reader in src/echelon/data/parquet.h: the RLE / bit-packed hybrid (levels, dictionary
// indices, booleans), PLAIN, dictionary indices, DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY,
// DELTA_BYTE_ARRAY and BYTE_STREAM_SPLIT. Values come out as JSON: numbers, booleans, and
// strings (UTF-8 checked: a BYTE_ARRAY that is not text is an error, never a JSON string
// nlohmann would refuse to dump). Every count is checked against the bytes it needs before
// anything is sized by it, and the text a page expands to (dictionary and DELTA_BYTE_ARRAY
// prefixes repeat strings) is charged to a budget.
//
//   std::vector<uint8_t> def;
//   Status st = DecodeLevels(bytes, size, /*max_level=*/3, num_values, &def);
//   RleDecoder rle(bytes, size, /*bit_width=*/2);
//   std::vector<uint32_t> idx(5);
//   st = rle.Decode(5, idx.data());
//
// Thread contract: pure functions and a decoder over caller-owned bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::data::parquet {

// The RLE / bit-packed hybrid without its length prefix: runs of one repeated value and
// groups of 8 bit-packed values (LSB first), each behind a varint header.
class RleDecoder {
 public:
  RleDecoder(const uint8_t* data, size_t size, int bit_width) : data_(data), size_(size), bit_width_(bit_width) {}
  // The next n values into out[0, n); an error when the data ends first.
  Status Decode(size_t n, uint32_t* out);

 private:
  Status NextRun();
  const uint8_t* data_;
  size_t size_;
  int bit_width_;
  size_t pos_ = 0;
  // The current run: `left` values still to give; a repeated `value`, or bit-packed values
  // starting at bit `bit` of data_.
  uint64_t left_ = 0;
  bool packed_ = false;
  uint32_t value_ = 0;
  uint64_t bit_ = 0;
};

// The bits needed for values 0..max_value (0 for 0).
int BitWidth(uint64_t max_value);

// n repetition or definition levels (RLE hybrid, no length prefix), each checked <= max_level,
// appended to *out.
Status DecodeLevels(const uint8_t* data, size_t size, int max_level, size_t n, std::vector<uint8_t>* out);

// n DELTA_BINARY_PACKED values (wrapping 64-bit arithmetic; an INT32 column keeps the low
// 32 bits) appended to *out; *consumed: the bytes the encoding took.
Status DecodeDeltaBinaryPacked(const uint8_t* data, size_t size, size_t n, std::vector<int64_t>* out,
                               size_t* consumed);

// What a leaf column's values become in JSON.
enum class ValueKind { kBool, kInt32, kUInt32, kInt64, kUInt64, kFloat, kDouble, kString, kUuid, kFloat16 };

struct ValueType {
  int physical = 0;     // PhysicalType
  int type_length = 0;  // FIXED_LEN_BYTE_ARRAY
  ValueKind kind = ValueKind::kString;
  bool text = false;    // BYTE_ARRAY annotated as text (STRING, ENUM, JSON): errors say so
};

// Bytes of decoded text a file may expand to, shared by its pages (see kMaxTextBytes in
// parquet.cc).
struct TextBudget {
  uint64_t bytes_left = 0;
};

// n values of `encoding` from a page's value section, appended to *out. `dict`: the column
// chunk's dictionary, or null when it has none.
Status DecodeValues(int encoding, const ValueType& type, const uint8_t* data, size_t size, size_t n,
                    const std::vector<nlohmann::json>* dict, TextBudget* budget, std::vector<nlohmann::json>* out);

}  // namespace echelon::data::parquet
