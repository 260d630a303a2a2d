// YamlMap: a strict reader for one YAML mapping, used by the plan/simulate configs and the
// price catalogue, whose lists (worker catalogues) do not fit the scalar-only Config. Every
// error names the file, the line and the key, and says what was expected.
//
//   ECHELON_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
//   YamlMap m(root, path, "");
//   double bw = 0;
//   ECHELON_RETURN_IF_ERROR(m.Float("memory_bandwidth_gbs", &bw, 1, 1e5, Required("GB/s of memory")));
//   ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());   // after every key was read
//
// A reading function written against YamlMap is also the config's key table: run it over a
// default-initialised struct with YamlMap::Describing(&table, ...) and every getter records
// its key (dotted path, `workers[].gpu` for list entries), type, default (the value *out
// holds), range or choices, whether it is required, its help and who reads it, and reads
// nothing. So the reader, the defaults, --help and the docs table cannot disagree.
//
//   KeyTable table;
//   YamlMap d = YamlMap::Describing(&table, "plan, simulate");
//   Catalogue defaults;
//   ReadCatalogue(d, &defaults);   // the same function LoadCatalogue calls
//   std::cout << table.Describe();
//
// Thread contract: a value; not shared.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::plan {

// Parses a YAML file; a syntax error names file:line.
Result<YAML::Node> LoadYamlFile(const std::string& path);

// What a key means, given to a YamlMap getter: Help("...") or Required("...").
struct KeyHelp {
  std::string text;
  bool required = false;
  std::string readers;  // who reads the key; empty: the map's (YamlMap::ReadBy)

  KeyHelp& ReadBy(std::string r) {
    readers = std::move(r);
    return *this;
  }
};
inline KeyHelp Help(std::string text) { return KeyHelp{std::move(text), false, {}}; }
inline KeyHelp Required(std::string text) { return KeyHelp{std::move(text), true, {}}; }

enum class KeyType { kInt, kFloat, kBool, kString, kStringList, kMapList };

// One key of a config, as a YamlMap in describe mode recorded it.
struct KeyDoc {
  std::string key;  // dotted path; an entry of a list of mappings is "workers[].gpu"
  KeyType type = KeyType::kString;
  std::string default_value;  // text form of what the reader leaves when the key is absent
  bool required = false;
  int64_t int_min = 0, int_max = 0;  // kInt, inclusive
  double min = 0, max = 0;           // kFloat, inclusive
  std::vector<std::string> choices;  // kString: the allowed values (empty: any)
  std::string help;
  std::string readers;
};

// The keys of one config in reading order; --help and docs text in the formats of
// ConfigSchema::Describe and ConfigSchema::Markdown (common/config.h).
class KeyTable {
 public:
  void Add(KeyDoc doc) { keys_.push_back(std::move(doc)); }
  const std::vector<KeyDoc>& keys() const { return keys_; }
  const KeyDoc* Find(const std::string& key) const;
  std::string Describe() const;
  std::string Markdown() const;

 private:
  std::vector<KeyDoc> keys_;
};

class YamlMap {
 public:
  // `prefix` is prepended to key names in messages ("workers[2].").
  YamlMap(YAML::Node node, std::string file, std::string prefix);
  // Describe mode: getters record their keys into *table and leave *out unchanged.
  static YamlMap Describing(KeyTable* table, std::string readers);
  bool describing() const { return table_ != nullptr; }
  // Who reads the keys read through this map and its children from now on.
  void ReadBy(std::string readers) { readers_ = std::move(readers); }

  // Each getter leaves *out unchanged when the key is absent and not required.
  Status Float(const std::string& key, double* out, double min, double max, const KeyHelp& help);
  Status Int(const std::string& key, int64_t* out, int64_t min, int64_t max, const KeyHelp& help);
  Status Bool(const std::string& key, bool* out, const KeyHelp& help);  // true or false
  Status String(const std::string& key, std::string* out, const KeyHelp& help);
  Status Choice(const std::string& key, std::string* out, const std::vector<std::string>& choices, const KeyHelp& help);
  // A list of non-empty strings; present, it replaces *out.
  Status StringList(const std::string& key, std::vector<std::string>* out, const KeyHelp& help);
  // The nested mapping `key` (absent: an empty one), prefixed "key.".
  Result<YamlMap> Child(const std::string& key);
  // Calls read(entry, i) for each mapping of the list `key` (entries prefixed "key[i].");
  // in describe mode once, with a describing entry prefixed "key[].".
  Status EachMap(const std::string& key, const KeyHelp& help,
                 const std::function<Status(YamlMap& entry, size_t i)>& read);

  // Undocumented getters (the price catalogue).
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
  void Record(const std::string& key, KeyType type, std::string default_value, const KeyHelp& help, KeyDoc doc = {});

  YAML::Node node_;
  std::string file_;
  std::string prefix_;
  bool ok_ = true;
  std::set<std::string> read_;
  KeyTable* table_ = nullptr;  // describe mode
  std::string readers_;
};

}  // namespace echelon::plan
