// Fuzzes the math JSONL reader (training and evaluation files).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "echelon/data/math_jsonl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/echelon-jsonl-fuzz-" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  echelon::data::ReadMathJsonl(path);
  return 0;
}
