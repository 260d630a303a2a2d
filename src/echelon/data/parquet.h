// A Parquet reader of our own (Debian 12 packages no Arrow or Parquet library), for datasets
// in verl's layout, read whole into JSON rows:
//   data_source: string, prompt: list<struct<role: string, content: string>>, ability: string,
//   reward_model: struct<style: string, ground_truth: string>,
//   extra_info: struct<split: string, index: int64, ...>
// becomes, per row, {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "..."}], ...}.
//
// What it reads (files from pyarrow/pandas, arrow-rs/parquet-wasm, hyparquet-writer):
// - structs as objects; LIST (3-level, and the legacy 2-level forms) and bare repeated
//   fields as arrays; MAP as an object when its keys are strings, else an array of
//   {"key": k, "value": v}; a null anywhere as null.
// - BOOLEAN, INT32, INT64 (signed or unsigned), FLOAT, DOUBLE as booleans and numbers (dates
//   and timestamps as their integers); BYTE_ARRAY as a string, which must be valid UTF-8
//   (with or without a STRING annotation); FIXED_LEN_BYTE_ARRAY as UUID text or FLOAT16.
// - data pages v1 and v2, dictionary pages; PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, RLE,
//   DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY, BYTE_STREAM_SPLIT;
//   codecs UNCOMPRESSED, SNAPPY, GZIP, ZSTD, LZ4_RAW; page CRCs when a writer stored them.
// Refused, with the feature and the column named: encryption, INT96, DECIMAL, INTERVAL,
// other FIXED_LEN_BYTE_ARRAYs, codecs LZO/BROTLI/LZ4 (Hadoop framing), the BIT_PACKED level
// encoding, column data in other files.
//
// Files are user input: every length, offset, count, bit width and nesting depth is checked
// against the bytes it claims and against ParquetLimits before anything is sized by it. A bad
// file is one error, "PATH: what is wrong (column a.b.c, row group N, page M)" (0-based
// indices), never a crash, a hang or an allocation the file did not pay for.
//
//   ECHELON_ASSIGN_OR_RETURN(std::vector<nlohmann::json> rows, ReadParquetRows("train.parquet"));
//   for (const nlohmann::json& row : rows) use(row["prompt"][0]["content"]);
//
// Thread contract: pure functions; concurrent calls share nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"

namespace echelon::data {

// How much one file may make the reader hold. The defaults admit any real RL prompt set.
struct ParquetLimits {
  // One page, compressed or not. Writers cut pages at ~1 MiB (pyarrow, arrow-rs) but a page
  // holds at least one whole value, so this is also the largest single string.
  uint64_t max_page_bytes = uint64_t{1} << 30;
  // Level entries (values and nulls of every leaf column) in the file: 2^28 is ~30 leaves by
  // 8M rows. A page's entry count sizes its level arrays, and RLE packs billions of nulls into
  // a few bytes, so the count is charged here before anything is allocated.
  uint64_t max_values = uint64_t{1} << 28;
  // ... and at most this many per byte of the file (plus 2^20): every entry becomes JSON of
  // ~100 bytes, so a kilobyte must not claim 2^28 null rows. Real files stay far below: a
  // dataset of 100x-repeated prompts holds ~2 entries per byte (its dictionary dominates).
  uint64_t max_values_per_byte = 64;
  // Decoded text in the file. A dictionary or DELTA_BYTE_ARRAY prefix repeats a string for a
  // few bits per row; the largest prompt sets (a prompt set repeated 100x) decode to about a
  // gigabyte, so 4 GiB stops a dictionary bomb, not a dataset.
  uint64_t max_text_bytes = uint64_t{4} << 30;
  // ... and at most this many bytes per byte of the file (plus 64 MiB): text compresses ~3x,
  // a 100x-repeated prompt set ~300x.
  uint64_t max_text_per_byte = 1024;
  // Schema nesting (levels fit a byte; verl's schema is 4 deep) and schema size.
  int max_depth = 32;
  uint64_t max_schema_elements = uint64_t{1} << 16;
};

// The rows of the Parquet file at `path`, each a JSON object keyed by the top-level columns.
Result<std::vector<nlohmann::json>> ReadParquetRows(const std::string& path);

// The same for a file's bytes; `name` is the PATH errors start with.
Result<std::vector<nlohmann::json>> ParseParquetRows(std::string_view bytes, const std::string& name,
                                                     const ParquetLimits& limits = ParquetLimits());

}  // namespace echelon::data
