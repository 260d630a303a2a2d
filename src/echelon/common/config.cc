#include "echelon/common/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>

namespace echelon {
namespace {

const char* TypeName(FieldType t) {
  switch (t) {
    case FieldType::kInt: return "an integer";
    case FieldType::kFloat: return "a number";
    case FieldType::kBool: return "true or false";
    case FieldType::kString: return "a string";
  }
  return "?";
}

// The shortest of 15-17 significant digits that reads back as `v` ("0.2", not
// "0.20000000000000001").
std::string FormatDouble(double v) {
  std::string out;
  for (int digits = 15; digits <= 17; ++digits) {
    std::ostringstream ss;
    ss.precision(digits);
    ss << v;
    out = ss.str();
    if (std::strtod(out.c_str(), nullptr) == v) break;
  }
  return out;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool ParseFloat(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool ParseBool(const std::string& s, bool* out) {
  if (s == "true" || s == "True" || s == "yes" || s == "on" || s == "1") return *out = true, true;
  if (s == "false" || s == "False" || s == "no" || s == "off" || s == "0") return *out = false, true;
  return false;
}

std::string Where(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1);
}

}  // namespace

ConfigSchema& ConfigSchema::Int(const std::string& key, int64_t def, int64_t min, int64_t max,
                                const std::string& help) {
  fields_.push_back({key, FieldType::kInt, std::to_string(def), double(min), double(max), {}, help, {}});
  return *this;
}

ConfigSchema& ConfigSchema::Float(const std::string& key, double def, double min, double max,
                                  const std::string& help) {
  fields_.push_back({key, FieldType::kFloat, FormatDouble(def), min, max, {}, help, {}});
  return *this;
}

ConfigSchema& ConfigSchema::Bool(const std::string& key, bool def, const std::string& help) {
  fields_.push_back({key, FieldType::kBool, def ? "true" : "false", 0, 0, {}, help, {}});
  return *this;
}

ConfigSchema& ConfigSchema::String(const std::string& key, const std::string& def, const std::string& help,
                                   std::vector<std::string> choices) {
  fields_.push_back({key, FieldType::kString, def, 0, 0, std::move(choices), help, {}});
  return *this;
}

ConfigSchema& ConfigSchema::OpenSection(const std::string& prefix, const std::string& help) {
  open_sections_.emplace_back(prefix, help);
  return *this;
}

const FieldSpec* ConfigSchema::Find(const std::string& key) const {
  for (const FieldSpec& f : fields_)
    if (f.key == key) return &f;
  return nullptr;
}

ConfigSchema& ConfigSchema::ReadBy(const std::string& readers) {
  if (!fields_.empty()) fields_.back().readers = readers;
  return *this;
}

bool ConfigSchema::InOpenSection(const std::string& key) const {
  for (const auto& [prefix, help] : open_sections_)
    if (key.rfind(prefix, 0) == 0 && key.size() > prefix.size()) return true;
  return false;
}

namespace {

// "an integer, default 3, range [0, 10]": a key's type, default and allowed values.
std::string Constraint(const FieldSpec& f) {
  std::ostringstream ss;
  ss << TypeName(f.type) << ", default " << (f.default_value.empty() ? "\"\"" : f.default_value);
  if (f.type == FieldType::kInt)
    ss << ", range [" << static_cast<int64_t>(f.min) << ", " << static_cast<int64_t>(f.max) << "]";
  if (f.type == FieldType::kFloat) ss << ", range [" << f.min << ", " << f.max << "]";
  if (!f.choices.empty()) {
    ss << ", one of";
    for (const auto& c : f.choices) ss << " " << c;
  }
  return ss.str();
}

}  // namespace

std::string MarkdownCell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += "<br>";
    else out += c;
  }
  return out;
}

std::string ConfigSchema::Describe() const {
  std::ostringstream ss;
  for (const FieldSpec& f : fields_) {
    ss << "  " << f.key << " (" << Constraint(f);
    if (!f.readers.empty()) ss << "; read by " << f.readers;
    ss << ")\n      " << f.help << "\n";
  }
  for (const auto& [prefix, help] : open_sections_) ss << "  " << prefix << "*\n      " << help << "\n";
  return ss.str();
}

std::string ConfigSchema::Markdown() const {
  std::ostringstream ss;
  ss << "| key | type, default, range | read by | meaning |\n|---|---|---|---|\n";
  for (const FieldSpec& f : fields_)
    ss << "| `" << f.key << "` | " << MarkdownCell(Constraint(f)) << " | " << MarkdownCell(f.readers) << " | " << MarkdownCell(f.help) << " |\n";
  for (const auto& [prefix, help] : open_sections_) ss << "| `" << prefix << "*` | | | " << MarkdownCell(help) << " |\n";
  return ss.str();
}

Status Config::Set(const std::string& key, const std::string& text, const std::string& where) {
  const FieldSpec* f = schema_->Find(key);
  if (f == nullptr) {
    if (schema_->InOpenSection(key)) {
      values_[key] = text;
      return Status::Ok();
    }
    return InvalidArgument(where + ": unknown config key '" + key + "' (see `echelon train --help` for the keys)");
  }
  auto bad = [&](const std::string& expected) {
    return InvalidArgument(where + ": " + key + " = '" + text + "' is invalid; expected " + expected);
  };
  switch (f->type) {
    case FieldType::kInt: {
      int64_t v;
      if (!ParseInt(text, &v)) return bad("an integer");
      if (v < f->min || v > f->max)
        return bad("an integer in [" + std::to_string(int64_t(f->min)) + ", " + std::to_string(int64_t(f->max)) + "]");
      values_[key] = std::to_string(v);
      return Status::Ok();
    }
    case FieldType::kFloat: {
      double v;
      if (!ParseFloat(text, &v)) return bad("a number");
      if (v < f->min || v > f->max) return bad("a number in [" + FormatDouble(f->min) + ", " + FormatDouble(f->max) + "]");
      values_[key] = FormatDouble(v);
      return Status::Ok();
    }
    case FieldType::kBool: {
      bool v;
      if (!ParseBool(text, &v)) return bad("true or false");
      values_[key] = v ? "true" : "false";
      return Status::Ok();
    }
    case FieldType::kString: {
      if (!f->choices.empty()) {
        bool found = false;
        std::string list;
        for (const auto& c : f->choices) {
          found = found || c == text;
          list += (list.empty() ? "" : ", ") + c;
        }
        if (!found) return bad("one of: " + list);
      }
      values_[key] = text;
      return Status::Ok();
    }
  }
  return Internal("unreachable");
}

namespace {

Status Walk(const YAML::Node& node, const std::string& prefix, const std::string& file,
            const std::function<Status(const std::string&, const std::string&, const std::string&)>& set) {
  if (!node.IsMap())
    return InvalidArgument(Where(file, node.Mark()) + ": expected a mapping of keys" +
                           (prefix.empty() ? std::string() : " under '" + prefix + "'"));
  for (const auto& kv : node) {
    const std::string key = prefix + kv.first.as<std::string>();
    const YAML::Node& value = kv.second;
    const std::string where = Where(file, kv.first.Mark());
    if (value.IsMap()) {
      ECHELON_RETURN_IF_ERROR(Walk(value, key + ".", file, set));
    } else if (value.IsScalar()) {
      ECHELON_RETURN_IF_ERROR(set(key, value.Scalar(), where));
    } else if (value.IsNull()) {
      ECHELON_RETURN_IF_ERROR(set(key, "", where));
    } else {
      return InvalidArgument(where + ": " + key + " must be a single value, not a list");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Config> Config::Load(const ConfigSchema& schema, const std::string& path,
                            const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.schema_ = &schema;
  cfg.source_ = path;
  for (const FieldSpec& f : schema.fields()) cfg.values_[f.key] = f.default_value;
  auto set = [&cfg](const std::string& k, const std::string& v, const std::string& w) { return cfg.Set(k, v, w); };
  if (!path.empty()) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::BadFile&) {
      return NotFound("cannot read config file " + path);
    } catch (const YAML::Exception& e) {
      return InvalidArgument(Where(path, e.mark) + ": YAML syntax error: " + e.msg);
    }
    if (!root.IsNull()) ECHELON_RETURN_IF_ERROR(Walk(root, "", path, set));
  }
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument("--set " + o + ": expected key=value, e.g. --set rl.steps=50");
    ECHELON_RETURN_IF_ERROR(cfg.Set(o.substr(0, eq), o.substr(eq + 1), "--set " + o));
  }
  return cfg;
}

const std::string& Config::Raw(const std::string& key, FieldType type) const {
  const FieldSpec* f = schema_->Find(key);
  if (f == nullptr || f->type != type) throw std::logic_error("config key not declared with this type: " + key);
  return values_.at(key);
}

int64_t Config::Int(const std::string& key) const { return std::stoll(Raw(key, FieldType::kInt)); }
double Config::Float(const std::string& key) const { return std::stod(Raw(key, FieldType::kFloat)); }
bool Config::Bool(const std::string& key) const { return Raw(key, FieldType::kBool) == "true"; }
const std::string& Config::String(const std::string& key) const { return Raw(key, FieldType::kString); }

std::map<std::string, std::string> Config::Section(const std::string& prefix) const {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : values_)
    if (k.rfind(prefix, 0) == 0 && schema_->Find(k) == nullptr) out[k.substr(prefix.size())] = v;
  return out;
}

namespace {

// Nested view of dotted keys, for emitting YAML maps in key order.
struct YamlTree {
  std::map<std::string, YamlTree> children;
  std::string value;
  bool quoted = false;
};

void Emit(YAML::Emitter& out, const YamlTree& node) {
  out << YAML::BeginMap;
  for (const auto& [name, child] : node.children) {
    out << YAML::Key << name << YAML::Value;
    if (!child.children.empty()) {
      Emit(out, child);
    } else if (child.quoted) {
      out << YAML::DoubleQuoted << child.value;
    } else {
      out << child.value;
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string Config::ToYaml() const {
  YamlTree root;
  for (const auto& [key, value] : values_) {
    YamlTree* node = &root;
    std::stringstream ss(key);
    std::string part;
    while (std::getline(ss, part, '.')) node = &node->children[part];
    const FieldSpec* f = schema_->Find(key);
    node->value = value;
    node->quoted = f == nullptr || f->type == FieldType::kString;
  }
  YAML::Emitter out;
  Emit(out, root);
  return std::string(out.c_str()) + "\n";
}

}  // namespace echelon
