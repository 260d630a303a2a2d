// Parsing helpers for TaskAdapter options (AdapterOptions: flat key -> string from the
// config's `task:` section). An adapter names its options once, in an OptionTable (name,
// default, help): the name check, the defaults and `echelon train --help` read that table.
// Every adapter reports bad options the same way:
//   "<task> task option <key>: expected an integer in LO..HI, got \"x\""
//   "<task> task: unknown option \"k\"; known options: a, b, c"
//
// Thread contract: free functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/run_secret.h"
#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::data {

// The option's value, or the table's default when it is absent. `key` must be in the table
// (std::logic_error otherwise: a misspelt name in the adapter's own code).
std::string OptionOr(const AdapterOptions& options, const OptionTable& table, const std::string& key);
// A decimal integer in [lo, hi]; anything else (sign, spaces, overflow) is refused.
Result<uint64_t> ParseUnsignedOption(const std::string& task, const std::string& key, const std::string& value,
                                     uint64_t lo, uint64_t hi);
// The `secret` option (common/run_secret.h: 64 hex characters, set by the learner), or nullopt
// when it is absent or empty.
Result<std::optional<RunSecret>> ParseSecretOption(const std::string& task, const AdapterOptions& options);
// Its table row: what `what` is drawn from.
OptionSpec SecretOptionRow(const std::string& what);
// Refuses the first option name not in `table`, listing the known ones (sorted).
Status CheckOptionNames(const std::string& task, const AdapterOptions& options, const OptionTable& table);
// "  seed (default 0): ...\n" lines, for --help.
std::string DescribeOptions(const OptionTable& table, const std::string& indent);

}  // namespace echelon::data
