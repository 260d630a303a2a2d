#include "echelon/data/adapter_options.h"

#include <algorithm>
#include <stdexcept>

namespace echelon::data {

std::string OptionOr(const AdapterOptions& options, const OptionTable& table, const std::string& key) {
  for (const OptionSpec& o : table) {
    if (o.name != key) continue;
    auto it = options.find(key);
    return it == options.end() ? o.default_value : it->second;
  }
  throw std::logic_error("task option \"" + key + "\" is not in its adapter's option table");
}

Result<std::optional<RunSecret>> ParseSecretOption(const std::string& task, const AdapterOptions& options) {
  auto it = options.find("secret");
  if (it == options.end() || it->second.empty()) return std::optional<RunSecret>();
  ECHELON_ASSIGN_OR_RETURN(RunSecret s, RunSecret::FromHex(it->second, task + " task option secret"));
  return std::optional<RunSecret>(s);
}

OptionSpec SecretOptionRow(const std::string& what) {
  return {"secret", "",
          what + " are drawn from it: the run's secret, which `echelon train` sets and never sends to a worker (empty: "
                 "from seed)"};
}

Result<uint64_t> ParseUnsignedOption(const std::string& task, const std::string& key, const std::string& value,
                                     uint64_t lo, uint64_t hi) {
  const std::string expected = task + " task option " + key + ": expected an integer in " + std::to_string(lo) +
                               ".." + std::to_string(hi) + ", got \"" + value + "\"";
  if (value.empty() || value.size() > 20) return InvalidArgument(expected);
  uint64_t v = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return InvalidArgument(expected);
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return InvalidArgument(expected);
    v = v * 10 + digit;
  }
  if (v < lo || v > hi) return InvalidArgument(expected);
  return v;
}

Status CheckOptionNames(const std::string& task, const AdapterOptions& options, const OptionTable& table) {
  for (const auto& [key, value] : options) {
    bool known = false;
    for (const OptionSpec& o : table) known = known || o.name == key;
    if (known) continue;
    std::vector<std::string> names;
    for (const OptionSpec& o : table) names.push_back(o.name);
    std::sort(names.begin(), names.end());
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    return InvalidArgument(task + " task: unknown option \"" + key + "\"; known options: " + list);
  }
  return Status::Ok();
}

std::string DescribeOptions(const OptionTable& table, const std::string& indent) {
  std::string out;
  for (const OptionSpec& o : table)
    out += indent + o.name + " (default " + (o.default_value.empty() ? "none" : o.default_value) + "): " + o.help + "\n";
  return out;
}

}  // namespace echelon::data
