// echelon_testkit parquet-dump FILE: prints each row of a Parquet file as one JSON line, the way
// echelon::data::ReadParquetRows reads it; on failure prints its one error line to stderr
// and exits 1. tests/parquet_test.sh compares its output with a JSONL twin written beside
// the file by an independent Parquet writer.
#include <cstdio>
#include <iostream>

#include "echelon/data/parquet.h"

namespace echelon::testkit {

int ParquetDumpMain(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: echelon_testkit parquet-dump FILE.parquet" << std::endl;
    return 2;
  }
  auto rows = echelon::data::ReadParquetRows(argv[1]);
  if (!rows.ok()) {
    std::cerr << rows.status().message() << std::endl;
    return 1;
  }
  std::string out;
  for (const nlohmann::json& row : rows.value()) {
    out += row.dump();
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace echelon::testkit
