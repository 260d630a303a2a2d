#include "echelon/data/adapter_options.h"

namespace echelon::data {

std::string OptionOr(const AdapterOptions& options, const std::string& key, const std::string& dflt) {
  auto it = options.find(key);
  return it == options.end() ? dflt : it->second;
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

Status CheckOptionNames(const std::string& task, const AdapterOptions& options, const std::set<std::string>& known) {
  for (const auto& [key, value] : options) {
    if (known.count(key)) continue;
    std::string list;
    for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
    return InvalidArgument(task + " task: unknown option \"" + key + "\"; known options: " + list);
  }
  return Status::Ok();
}

}  // namespace echelon::data
