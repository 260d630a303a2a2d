// Parsing helpers for TaskAdapter options (AdapterOptions: flat key -> string from the
// config's `task:` section), so every adapter reports bad options the same way:
//   "<task> task option <key>: expected an integer in LO..HI, got \"x\""
//   "<task> task: unknown option \"k\"; known options: a, b, c"
//
// Thread contract: free functions over values.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::data {

// The option's value, or `dflt` when it is absent.
std::string OptionOr(const AdapterOptions& options, const std::string& key, const std::string& dflt);
// A decimal integer in [lo, hi]; anything else (sign, spaces, overflow) is refused.
Result<uint64_t> ParseUnsignedOption(const std::string& task, const std::string& key, const std::string& value,
                                     uint64_t lo, uint64_t hi);
// Refuses the first option name not in `known`, listing the known ones (sorted).
Status CheckOptionNames(const std::string& task, const AdapterOptions& options, const std::set<std::string>& known);

}  // namespace echelon::data
