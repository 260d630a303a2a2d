// The worker file the testkit's actors read: one "NAME TOKEN" line per worker (the learner's
// --token-file format).
#pragma once

#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "echelon/common/fs.h"

namespace echelon::testkit {

struct Worker {
  std::string name;
  std::string token;
};

// nullopt (the error printed) when the file cannot be read.
inline std::optional<std::vector<Worker>> ReadWorkers(const std::string& path) {
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) {
    std::cerr << text.status().message() << std::endl;
    return std::nullopt;
  }
  std::vector<Worker> workers;
  std::istringstream in(text.value());
  for (Worker w; in >> w.name >> w.token;) workers.push_back(w);
  return workers;
}

}  // namespace echelon::testkit
