// Config: a typed, validated set of settings loaded from a YAML file and `--set key=value`
// overrides. Every key is declared in a ConfigSchema (type, default, range, help), so
// an unknown key, a wrong type or an out-of-range value is refused with one message naming
// the file, line and key, and what is expected.
//
//   ConfigSchema schema;
//   schema.Int("rl.steps", 200, 1, 1000000, "learner updates");
//   ECHELON_ASSIGN_OR_RETURN(Config cfg, Config::Load(schema, "configs/math-tiny.yaml", {"rl.steps=10"}));
//   int64_t steps = cfg.Int("rl.steps");
//
// Keys are dotted paths into nested YAML maps ("rl.steps" is `rl: {steps: ...}`). A prefix
// declared with OpenSection ("task.") accepts any scalar key below it, kept as strings for
// the component that owns it (a task adapter validates its own options).
//
// Thread contract: a loaded Config is immutable; safe for concurrent reads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon {

enum class FieldType { kInt, kFloat, kBool, kString };

struct FieldSpec {
  std::string key;
  FieldType type = FieldType::kString;
  std::string default_value;  // canonical text form
  double min = 0, max = 0;    // numeric range (inclusive) for kInt / kFloat
  std::vector<std::string> choices;  // allowed values for kString (empty: any)
  std::string help;
  std::string readers;  // which processes read the key ("learner, actors"); empty: not stated
};

class ConfigSchema {
 public:
  ConfigSchema& Int(const std::string& key, int64_t def, int64_t min, int64_t max, const std::string& help);
  ConfigSchema& Float(const std::string& key, double def, double min, double max, const std::string& help);
  ConfigSchema& Bool(const std::string& key, bool def, const std::string& help);
  ConfigSchema& String(const std::string& key, const std::string& def, const std::string& help,
                       std::vector<std::string> choices = {});
  ConfigSchema& OpenSection(const std::string& prefix, const std::string& help);
  // States which processes read the key declared last ("learner, actors").
  ConfigSchema& ReadBy(const std::string& readers);

  const FieldSpec* Find(const std::string& key) const;
  bool InOpenSection(const std::string& key) const;
  const std::vector<FieldSpec>& fields() const { return fields_; }
  // Human-readable table of every key, for --help.
  std::string Describe() const;
  // The same table in Markdown, for the docs.
  std::string Markdown() const;

 private:
  std::vector<FieldSpec> fields_;
  std::vector<std::pair<std::string, std::string>> open_sections_;
};

// `text` as one Markdown table cell: '|' escaped, line breaks as <br>.
std::string MarkdownCell(const std::string& text);

class Config {
 public:
  // Loads `path` (may be empty: defaults only), then applies "key=value" overrides in order.
  static Result<Config> Load(const ConfigSchema& schema, const std::string& path,
                             const std::vector<std::string>& overrides);

  int64_t Int(const std::string& key) const;
  double Float(const std::string& key) const;
  bool Bool(const std::string& key) const;
  const std::string& String(const std::string& key) const;
  // Scalars under an open section, prefix stripped: {"seed": "3", ...} for "task.".
  std::map<std::string, std::string> Section(const std::string& prefix) const;
  // The resolved config as YAML (every declared key, nested), for the run directory.
  std::string ToYaml() const;
  const std::string& source() const { return source_; }
  // Every resolved key and its canonical text form.
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  Status Set(const std::string& key, const std::string& text, const std::string& where);
  const std::string& Raw(const std::string& key, FieldType type) const;

  const ConfigSchema* schema_ = nullptr;
  std::string source_;
  std::map<std::string, std::string> values_;  // canonical text form
};

}  // namespace echelon
