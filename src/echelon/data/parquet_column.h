// One column chunk of a Parquet file read into its levels and values, for the reader in
// src/echelon/data/parquet.h: page headers, CRCs, decompression, levels and values, with
// every page checked against the chunk, the file and ParquetLimits.
//
//   ColumnData col;
//   int page = -1;
//   Status st = ReadColumnChunk(chunk_input, &col, &page);   // page: where it failed, or -1
//
// Thread contract: pure function over caller-owned bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "echelon/common/status.h"
#include "echelon/data/parquet.h"
#include "echelon/data/parquet_encoding.h"
#include "echelon/data/parquet_thrift.h"

namespace echelon::data::parquet {

// A leaf of the schema: a column chunk per row group holds its values.
struct LeafColumn {
  std::vector<std::string> path;  // names from the root's child down
  std::string dotted;             // "a.b.c", for errors
  int max_def = 0;
  int max_rep = 0;
  ValueType type;
};

// A column chunk decoded: one repetition and one definition level per entry (zeros when the
// column has no such levels), and the non-null values in order (one per entry whose
// definition level is max_def).
struct ColumnData {
  std::vector<uint8_t> rep;
  std::vector<uint8_t> def;
  std::vector<nlohmann::json> values;
};

struct ChunkInput {
  const uint8_t* file = nullptr;
  uint64_t data_end = 0;  // where the footer starts: column chunks lie before it
  const ColumnMetaData* meta = nullptr;
  const LeafColumn* leaf = nullptr;
  int64_t num_rows = 0;  // the row group's
  const ParquetLimits* limits = nullptr;
  uint64_t values_budget = 0;       // the level entries the file may hold (ParquetLimits)
  uint64_t* values_left = nullptr;  // what is left of it, shared by the file's chunks
  TextBudget* text = nullptr;
};

// Reads the chunk; on failure *page is the 0-based page it failed in (-1: the chunk as a whole).
Status ReadColumnChunk(const ChunkInput& in, ColumnData* out, int* page);

}  // namespace echelon::data::parquet
