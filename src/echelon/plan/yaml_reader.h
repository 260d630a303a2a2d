// YamlMap: a strict reader for one YAML mapping, used by the plan/simulate configs and the
// price catalogue, whose lists (worker catalogues) do not fit the scalar-only Config. Every
// error names the file, the line and the key, and says what was expected.
//
//   ECHELON_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
//   YamlMap m(root, path, "");
//   double bw = 0;
//   ECHELON_RETURN_IF_ERROR(m.Float("memory_bandwidth_gbs", &bw, 1, 1e5, /*required=*/true));
//   ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());   // after every key was read
//
// Thread contract: a value; not shared.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>

#include "echelon/common/status.h"

namespace echelon::plan {

// Parses a YAML file; a syntax error names file:line.
Result<YAML::Node> LoadYamlFile(const std::string& path);

class YamlMap {
 public:
  // `prefix` is prepended to key names in messages ("workers[2].").
  YamlMap(YAML::Node node, std::string file, std::string prefix);

  // Each getter leaves *out unchanged when the key is absent and not required.
  Status Float(const std::string& key, double* out, double min, double max, bool required = false);
  Status Int(const std::string& key, int64_t* out, int64_t min, int64_t max, bool required = false);
  Status String(const std::string& key, std::string* out, bool required = false);
  // A nested mapping (absent: a null node, which reads as an empty map).
  Result<YAML::Node> Map(const std::string& key);
  Result<YAML::Node> Sequence(const std::string& key, bool required = false);
  bool Has(const std::string& key) const;
  // Refuses keys that no getter asked for (a typo would otherwise be silently ignored).
  Status NoUnknownKeys() const;
  // "file:line" of the key (or of the map when the key is absent).
  std::string Where(const std::string& key) const;
  bool valid() const { return ok_; }
  Status status() const { return ok_ ? Status::Ok() : InvalidArgument(file_ + ": " + prefix_ + " must be a mapping"); }

 private:
  Result<YAML::Node> Scalar(const std::string& key, bool required);

  YAML::Node node_;
  std::string file_;
  std::string prefix_;
  bool ok_ = true;
  std::set<std::string> read_;
};

}  // namespace echelon::plan
