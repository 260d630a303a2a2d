#include "echelon/plan/yaml_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "echelon/common/fs.h"

namespace echelon::plan {
namespace {

std::string MarkText(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return file;
  return file + ":" + std::to_string(mark.line + 1);
}

std::string Num(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

}  // namespace

Result<YAML::Node> LoadYamlFile(const std::string& path) {
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  try {
    YAML::Node node = YAML::Load(text.value());
    if (!node.IsMap()) return InvalidArgument(path + ": expected a YAML mapping at the top level");
    return node;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(MarkText(path, e.mark) + ": YAML syntax error: " + e.msg);
  }
}

YamlMap::YamlMap(YAML::Node node, std::string file, std::string prefix)
    : node_(node), file_(std::move(file)), prefix_(std::move(prefix)) {
  ok_ = !node_ || node_.IsNull() || node_.IsMap();
}

bool YamlMap::Has(const std::string& key) const {
  return ok_ && node_ && node_.IsMap() && node_[key];
}

std::string YamlMap::Where(const std::string& key) const {
  if (Has(key)) return MarkText(file_, node_[key].Mark());
  return MarkText(file_, node_ ? node_.Mark() : YAML::Mark::null_mark());
}

Result<YAML::Node> YamlMap::Scalar(const std::string& key, bool required) {
  if (!ok_) return status();
  read_.insert(key);
  if (!Has(key)) {
    if (required) return InvalidArgument(Where(key) + ": missing required key '" + prefix_ + key + "'");
    return YAML::Node();
  }
  YAML::Node v = node_[key];
  if (!v.IsScalar()) return InvalidArgument(Where(key) + ": " + prefix_ + key + " must be a single value");
  return v;
}

Status YamlMap::Float(const std::string& key, double* out, double min, double max, bool required) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, required));
  if (v.IsNull()) return Status::Ok();  // absent (a present null is refused by Scalar)
  const std::string s = v.Scalar();
  errno = 0;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || *end != '\0' || !std::isfinite(d) || d < min || d > max)
    return InvalidArgument(Where(key) + ": " + prefix_ + key + " = '" + s + "' is invalid; expected a number in [" +
                           Num(min) + ", " + Num(max) + "]");
  *out = d;
  return Status::Ok();
}

Status YamlMap::Int(const std::string& key, int64_t* out, int64_t min, int64_t max, bool required) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, required));
  if (v.IsNull()) return Status::Ok();  // absent (a present null is refused by Scalar)
  const std::string s = v.Scalar();
  errno = 0;
  char* end = nullptr;
  long long i = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0' || i < min || i > max)
    return InvalidArgument(Where(key) + ": " + prefix_ + key + " = '" + s + "' is invalid; expected an integer in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]");
  *out = i;
  return Status::Ok();
}

Status YamlMap::String(const std::string& key, std::string* out, bool required) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, required));
  if (!v.IsNull()) *out = v.Scalar();
  return Status::Ok();
}

Result<YAML::Node> YamlMap::Map(const std::string& key) {
  if (!ok_) return status();
  read_.insert(key);
  if (!Has(key)) return YAML::Node();
  YAML::Node v = node_[key];
  if (!v.IsMap() && !v.IsNull()) return InvalidArgument(Where(key) + ": " + prefix_ + key + " must be a mapping");
  return v;
}

Result<YAML::Node> YamlMap::Sequence(const std::string& key, bool required) {
  if (!ok_) return status();
  read_.insert(key);
  if (!Has(key)) {
    if (required) return InvalidArgument(Where(key) + ": missing required list '" + prefix_ + key + "'");
    return YAML::Node();
  }
  YAML::Node v = node_[key];
  if (!v.IsSequence()) return InvalidArgument(Where(key) + ": " + prefix_ + key + " must be a list");
  return v;
}

Status YamlMap::NoUnknownKeys() const {
  if (!ok_) return status();
  if (!node_ || !node_.IsMap()) return Status::Ok();
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (!read_.count(key)) {
      std::string known;
      for (const auto& k : read_) known += (known.empty() ? "" : ", ") + k;
      return InvalidArgument(MarkText(file_, it->first.Mark()) + ": unknown key '" + prefix_ + key +
                             "' (known here: " + known + ")");
    }
  }
  return Status::Ok();
}

}  // namespace echelon::plan
