// Fuzzes config loading: a YAML file from a user, checked against the training schema.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "echelon/cli/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/echelon-config-fuzz-" + std::to_string(::getpid()) + ".yaml";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  echelon::Result<echelon::Config> cfg = echelon::Config::Load(echelon::cli::TrainSchema(), path, {});
  if (cfg.ok()) echelon::cli::RunOptionsFromConfig(cfg.value());
  return 0;
}
