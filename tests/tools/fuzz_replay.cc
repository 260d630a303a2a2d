// `echelon_testkit fuzz-replay TARGET PATH...`: runs every file under PATH (a corpus
// directory or single files) through the libFuzzer target TARGET once, as an ordinary test, so
// a target that no longer compiles or a corpus input that crashes fails `make test`. For
// `submit` it also requires the corpus' valid seed to be accepted (the target reaches the
// dispatcher and the reward). `echelon_testkit fuzz-seed submit FILE` writes that seed.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fuzz/submit_fuzz.h"

extern "C" int FuzzConfigYaml(const uint8_t* data, size_t size);
extern "C" int FuzzMathJsonl(const uint8_t* data, size_t size);
extern "C" int FuzzSafetensors(const uint8_t* data, size_t size);
extern "C" int FuzzSubmit(const uint8_t* data, size_t size);
extern "C" int FuzzParquet(const uint8_t* data, size_t size);
extern "C" int FuzzSafeRegex(const uint8_t* data, size_t size);

namespace echelon::testkit {

int FuzzReplayMain(int argc, char** argv) {
  const std::map<std::string, int (*)(const uint8_t*, size_t)> targets = {
      {"config_yaml", FuzzConfigYaml}, {"math_jsonl", FuzzMathJsonl}, {"safetensors", FuzzSafetensors},
      {"submit", FuzzSubmit}, {"parquet", FuzzParquet}, {"safe_regex", FuzzSafeRegex}};
  if (argc < 3 || targets.count(argv[1]) == 0) {
    std::cerr << "usage: echelon_testkit fuzz-replay config_yaml|math_jsonl|safetensors|submit|parquet|safe_regex PATH..." << std::endl;
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (int i = 2; i < argc; ++i) {
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (std::filesystem::is_regular_file(argv[i])) {
      files.push_back(argv[i]);
    } else {
      std::cerr << argv[i] << ": no such file or directory" << std::endl;
      return 1;
    }
  }
  if (files.empty()) {
    std::cerr << "no corpus input under the given paths" << std::endl;
    return 1;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    targets.at(argv[1])(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::cout << argv[1] << ": " << files.size() << " inputs replayed" << std::endl;
  if (std::strcmp(argv[1], "submit") == 0 && SubmitFuzzAccepted() < 1) {
    std::cerr << "submit: no corpus input was accepted: the valid seed no longer passes the intake "
                 "(rewrite it with `echelon_testkit fuzz-seed submit fuzz/corpus/submit/seed_valid.pb`)"
              << std::endl;
    return 1;
  }
  return 0;
}

int FuzzSeedMain(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "submit") != 0) {
    std::cerr << "usage: echelon_testkit fuzz-seed submit FILE" << std::endl;
    return 2;
  }
  std::ofstream(argv[2], std::ios::binary) << SubmitFuzzValidSeed();
  return 0;
}

}  // namespace echelon::testkit
