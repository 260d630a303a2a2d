#include "echelon/plan/yaml_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "echelon/common/config.h"
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

const char* TypeName(KeyType t) {
  switch (t) {
    case KeyType::kInt: return "an integer";
    case KeyType::kFloat: return "a number";
    case KeyType::kBool: return "true or false";
    case KeyType::kString: return "a string";
    case KeyType::kStringList: return "a list of strings";
    case KeyType::kMapList: return "a list of mappings";
  }
  return "?";
}

// "an integer, default 3, range [0, 10]": the key's type, default and allowed values.
std::string Constraint(const KeyDoc& k) {
  std::ostringstream ss;
  ss << TypeName(k.type);
  if (k.required) ss << ", required";
  else ss << ", default " << (k.default_value.empty() ? "\"\"" : k.default_value);
  if (k.type == KeyType::kInt) ss << ", range [" << k.int_min << ", " << k.int_max << "]";
  if (k.type == KeyType::kFloat) ss << ", range [" << Num(k.min) << ", " << Num(k.max) << "]";
  if (!k.choices.empty()) {
    ss << ", one of";
    for (const std::string& c : k.choices) ss << " " << c;
  }
  return ss.str();
}

}  // namespace

const KeyDoc* KeyTable::Find(const std::string& key) const {
  for (const KeyDoc& k : keys_)
    if (k.key == key) return &k;
  return nullptr;
}

std::string KeyTable::Describe() const {
  std::ostringstream ss;
  for (const KeyDoc& k : keys_) {
    ss << "  " << k.key << " (" << Constraint(k);
    if (!k.readers.empty()) ss << "; read by " << k.readers;
    ss << ")\n      " << k.help << "\n";
  }
  return ss.str();
}

std::string KeyTable::Markdown() const {
  std::ostringstream ss;
  ss << "| key | type, default, range | read by | meaning |\n|---|---|---|---|\n";
  for (const KeyDoc& k : keys_)
    ss << "| `" << k.key << "` | " << MarkdownCell(Constraint(k)) << " | " << MarkdownCell(k.readers) << " | " << MarkdownCell(k.help) << " |\n";
  return ss.str();
}

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

YamlMap YamlMap::Describing(KeyTable* table, std::string readers) {
  YamlMap m(YAML::Node(), "", "");
  m.table_ = table;
  m.readers_ = std::move(readers);
  return m;
}

void YamlMap::Record(const std::string& key, KeyType type, std::string default_value, const KeyHelp& help,
                     KeyDoc doc) {
  doc.key = prefix_ + key;
  doc.type = type;
  doc.default_value = std::move(default_value);
  doc.required = help.required;
  doc.help = help.text;
  doc.readers = help.readers.empty() ? readers_ : help.readers;
  table_->Add(std::move(doc));
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

Status YamlMap::Float(const std::string& key, double* out, double min, double max, const KeyHelp& help) {
  if (describing()) {
    KeyDoc doc;
    doc.min = min;
    doc.max = max;
    Record(key, KeyType::kFloat, Num(*out), help, std::move(doc));
    return Status::Ok();
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, help.required));
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

Status YamlMap::Int(const std::string& key, int64_t* out, int64_t min, int64_t max, const KeyHelp& help) {
  if (describing()) {
    KeyDoc doc;
    doc.int_min = min;
    doc.int_max = max;
    Record(key, KeyType::kInt, std::to_string(*out), help, std::move(doc));
    return Status::Ok();
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, help.required));
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

Status YamlMap::Bool(const std::string& key, bool* out, const KeyHelp& help) {
  if (describing()) {
    Record(key, KeyType::kBool, *out ? "true" : "false", help);
    return Status::Ok();
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, help.required));
  if (v.IsNull()) return Status::Ok();
  const std::string s = v.Scalar();
  if (s != "true" && s != "false")
    return InvalidArgument(Where(key) + ": " + prefix_ + key + " = '" + s + "' is invalid; expected true or false");
  *out = s == "true";
  return Status::Ok();
}

Status YamlMap::String(const std::string& key, std::string* out, const KeyHelp& help) {
  if (describing()) {
    Record(key, KeyType::kString, *out, help);
    return Status::Ok();
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, help.required));
  if (!v.IsNull()) *out = v.Scalar();
  return Status::Ok();
}

Status YamlMap::Choice(const std::string& key, std::string* out, const std::vector<std::string>& choices,
                       const KeyHelp& help) {
  if (describing()) {
    KeyDoc doc;
    doc.choices = choices;
    Record(key, KeyType::kString, *out, help, std::move(doc));
    return Status::Ok();
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node v, Scalar(key, help.required));
  if (v.IsNull()) return Status::Ok();
  const std::string s = v.Scalar();
  std::string list;
  for (const std::string& c : choices) {
    if (s == c) {
      *out = s;
      return Status::Ok();
    }
    list += (list.empty() ? "" : " or ") + c;
  }
  return InvalidArgument(Where(key) + ": " + prefix_ + key + " = '" + s + "' is invalid; expected " + list);
}

Status YamlMap::StringList(const std::string& key, std::vector<std::string>* out, const KeyHelp& help) {
  if (describing()) {
    std::string def = "[";
    for (const std::string& s : *out) def += (def.size() > 1 ? ", " : "") + s;
    Record(key, KeyType::kStringList, def + "]", help);
    return Status::Ok();
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node list, Sequence(key, help.required));
  if (!list) return Status::Ok();
  std::vector<std::string> values;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].IsScalar() || list[i].Scalar().empty())
      return InvalidArgument(Where(key) + ": " + prefix_ + key + "[" + std::to_string(i) + "] must be a non-empty string");
    values.push_back(list[i].Scalar());
  }
  *out = std::move(values);
  return Status::Ok();
}

Result<YamlMap> YamlMap::Child(const std::string& key) {
  if (describing()) {
    YamlMap child = Describing(table_, readers_);
    child.prefix_ = prefix_ + key + ".";
    return child;
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node node, Map(key));
  YamlMap child(node, file_, prefix_ + key + ".");
  child.readers_ = readers_;
  return child;
}

Status YamlMap::EachMap(const std::string& key, const KeyHelp& help,
                        const std::function<Status(YamlMap& entry, size_t i)>& read) {
  if (describing()) {
    Record(key, KeyType::kMapList, "[]", help);
    YamlMap entry = Describing(table_, readers_);
    entry.prefix_ = prefix_ + key + "[].";
    return read(entry, 0);
  }
  ECHELON_ASSIGN_OR_RETURN(YAML::Node list, Sequence(key, help.required));
  for (size_t i = 0; list && i < list.size(); ++i) {
    YamlMap entry(list[i], file_, prefix_ + key + "[" + std::to_string(i) + "].");
    entry.readers_ = readers_;
    ECHELON_RETURN_IF_ERROR(entry.status());
    ECHELON_RETURN_IF_ERROR(read(entry, i));
  }
  return Status::Ok();
}

Status YamlMap::Float(const std::string& key, double* out, double min, double max, bool required) {
  return Float(key, out, min, max, KeyHelp{"", required, {}});
}

Status YamlMap::Int(const std::string& key, int64_t* out, int64_t min, int64_t max, bool required) {
  return Int(key, out, min, max, KeyHelp{"", required, {}});
}

Status YamlMap::String(const std::string& key, std::string* out, bool required) {
  return String(key, out, KeyHelp{"", required, {}});
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
