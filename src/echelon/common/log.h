// Logging: spdlog to stderr with one pattern for every role. Progress lines that a user
// reads (per-step lines of `echelon train`) go to stdout; diagnostics go through here.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace echelon {

// level: "debug", "info", "warn", "error". Call once from main().
void InitLogging(const std::string& level);

}  // namespace echelon
