// Fuzzes the Parquet reader: a dataset is a file from elsewhere (data/parquet.h). Every input
// ends in rows or in one error, with bounded memory (the limits are the defaults').
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "echelon/data/parquet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)echelon::data::ParseParquetRows(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  return 0;
}
