// The plan config's key table (PlanConfigKeys: the reader run in describe mode) walked
// against the reader, --help text and docs/CAPACITY.md, so that no key is spelled twice and
// none of them can drift from the others.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "echelon/plan/plan_config.h"

namespace echelon::plan {
namespace {

namespace fs = std::filesystem;

// ECHELON_TEST_DATA is <repo>/tests/data.
std::string RepoPath(const std::string& rel) { return std::string(ECHELON_TEST_DATA) + "/../../" + rel; }

// A valid config holding one entry of each list, so every key has a place to go.
const char* kBase = R"(model: {params_billion: 8, kv_bytes_per_token: 147456}
rollout: {groups_per_step: 16, group_size: 4, completion_tokens: 100}
workers:
  - {gpu: a100, available: 4}
simulate:
  price_changes:
    - {at_step: 5, gpu: a100, price_per_hour: 2}
)";

std::vector<std::string> Split(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

// "workers[].gpu" -> the node of workers[0]'s map, and "gpu".
YAML::Node Parent(YAML::Node root, const std::vector<std::string>& parts) {
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string& p = parts[i];
    const bool entry = p.size() > 2 && p.compare(p.size() - 2, 2, "[]") == 0;
    YAML::Node next = entry ? node[p.substr(0, p.size() - 2)][0] : node[p];
    node.reset(next);
  }
  return node;
}

// The name an error gives a key: list entries are indexed ("workers[0].gpu").
std::string ErrorName(std::string key) {
  for (size_t at = key.find("[]"); at != std::string::npos; at = key.find("[]")) key.replace(at, 2, "[0]");
  return key;
}

std::string Prefix(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot + 1);
}

std::string Text(double v) {
  std::ostringstream ss;
  ss.precision(17);
  ss << v;
  return ss.str();
}

class PlanConfigKeysWalk : public ::testing::Test {
 protected:
  // Configs go in <tmp>/configs beside <tmp>/data/prices.yaml: the default `prices:` resolves.
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/plan_config_keys_test_" + std::to_string(::getpid());
    fs::create_directories(dir_ + "/configs");
    fs::create_directories(dir_ + "/data");
    fs::copy_file(RepoPath("data/prices.yaml"), dir_ + "/data/prices.yaml", fs::copy_options::overwrite_existing);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads the base config with `edit` applied.
  Result<PlanConfig> Load(const std::function<void(YAML::Node)>& edit) {
    YAML::Node root = YAML::Load(kBase);
    edit(root);
    const std::string path = dir_ + "/configs/walk.yaml";
    std::ofstream(path) << YAML::Dump(root) << "\n";
    return LoadPlanConfig(path);
  }
  Result<PlanConfig> Set(const std::string& key, const YAML::Node& value) {
    return Load([&](YAML::Node root) {
      const std::vector<std::string> parts = Split(key);
      Parent(root, parts)[parts.back()] = value;
    });
  }
  static std::string Refusal(const Result<PlanConfig>& r) { return r.ok() ? "(accepted)" : r.status().message(); }

  std::string dir_;
};

TEST_F(PlanConfigKeysWalk, DescribeRunsOverTheDefaultsAndNamesEveryKeyOnce) {
  KeyTable table;
  ASSERT_TRUE(DescribePlanConfig(&table).ok());
  std::set<std::string> seen;
  for (const KeyDoc& k : table.keys()) {
    EXPECT_TRUE(seen.insert(k.key).second) << k.key << " is read twice";
    EXPECT_FALSE(k.help.empty()) << k.key;
    EXPECT_FALSE(k.readers.empty()) << k.key;
  }
  EXPECT_EQ(table.keys().size(), PlanConfigKeys().keys().size());
  for (const char* key : {"prices", "model.params_billion", "rl.max_staleness", "broadcast.mode", "workers",
                          "workers[].gpu", "workers[].run_actors", "simulate.seed", "simulate.price_changes[].at_step"})
    EXPECT_NE(table.Find(key), nullptr) << key;
  // Defaults are the struct initialisers the reader leaves in place.
  EXPECT_EQ(table.Find("learner.gpu")->default_value, "h200");
  EXPECT_EQ(table.Find("learner.mfu")->default_value, "0.35");
  EXPECT_EQ(table.Find("workers[].downlink_mbps")->default_value, "1000");
  EXPECT_EQ(table.Find("simulate.reactivate")->default_value, "true");
  EXPECT_TRUE(table.Find("workers[].available")->required);
  EXPECT_EQ(table.Find("simulate.detect_seconds")->readers, "simulate");
  EXPECT_EQ(table.Find("simulate.restart_seconds")->readers, "plan, simulate");
}

TEST_F(PlanConfigKeysWalk, EveryKeyIsAcceptedInRangeAndRefusedOutsideItNamingTheKey) {
  ASSERT_TRUE(Load([](YAML::Node) {}).ok()) << Refusal(Load([](YAML::Node) {}));
  const YAML::Node base = YAML::Load(kBase);
  for (const KeyDoc& k : PlanConfigKeys().keys()) {
    SCOPED_TRACE(k.key);
    const std::string name = ErrorName(k.key);
    if (k.required) {
      Result<PlanConfig> r = Load([&](YAML::Node root) {
        const std::vector<std::string> parts = Split(k.key);
        Parent(root, parts).remove(parts.back());
      });
      const std::string what = k.type == KeyType::kMapList ? "list" : "key";
      EXPECT_NE(Refusal(r).find("missing required " + what + " '" + name + "'"), std::string::npos) << Refusal(r);
    }
    std::string valid;  // a value in range: the default, or for sentinels outside the range, the minimum
    std::vector<YAML::Node> invalid;
    switch (k.type) {
      case KeyType::kInt: {
        const int64_t def = std::stoll(k.default_value);
        valid = std::to_string(def >= k.int_min && def <= k.int_max ? def : k.int_min);
        invalid.emplace_back(k.int_max == INT64_MAX ? "9223372036854775808" : std::to_string(k.int_max + 1));
        invalid.emplace_back(std::to_string(k.int_min - 1));
        invalid.emplace_back("1.5");
        break;
      }
      case KeyType::kFloat: {
        const double def = std::stod(k.default_value);
        valid = Text(def >= k.min && def <= k.max ? def : k.min);
        invalid.emplace_back(Text(k.max + std::max(1.0, std::abs(k.max))));
        invalid.emplace_back(Text(k.min - std::max(1.0, std::abs(k.min))));
        invalid.emplace_back("many");
        break;
      }
      case KeyType::kBool:
        valid = k.default_value;
        invalid.emplace_back("maybe");
        break;
      case KeyType::kString:
        valid = k.default_value;
        if (!k.choices.empty()) {
          EXPECT_NE(std::find(k.choices.begin(), k.choices.end(), k.default_value), k.choices.end());
          invalid.emplace_back("bogus");
        }
        invalid.push_back(YAML::Load("[1, 2]"));
        break;
      case KeyType::kStringList:
        invalid.emplace_back("actor-0");
        break;
      case KeyType::kMapList:
        invalid.emplace_back("3");
        break;
    }
    if (k.required) valid = Parent(base, Split(k.key))[Split(k.key).back()].Scalar();
    if (k.type == KeyType::kStringList) {
      Result<PlanConfig> r = Set(k.key, YAML::Load("[actor-0, actor-1]"));
      EXPECT_TRUE(r.ok()) << Refusal(r);
    } else if (k.type != KeyType::kMapList) {
      Result<PlanConfig> r = Set(k.key, YAML::Node(valid));
      EXPECT_TRUE(r.ok()) << k.key << " = '" << valid << "': " << Refusal(r);
    }
    for (const YAML::Node& value : invalid) {
      Result<PlanConfig> r = Set(k.key, value);
      const std::string expected = value.IsScalar() && k.type != KeyType::kStringList && k.type != KeyType::kMapList
                                       ? name + " = '" + value.Scalar() + "' is invalid"
                                       : name + " must be a";
      EXPECT_NE(Refusal(r).find(expected), std::string::npos) << YAML::Dump(value) << ": " << Refusal(r);
    }
  }
}

TEST_F(PlanConfigKeysWalk, AnUnknownKeyIsRefusedInEveryMap) {
  std::set<std::string> prefixes;
  for (const KeyDoc& k : PlanConfigKeys().keys()) prefixes.insert(Prefix(k.key));
  EXPECT_EQ(prefixes.size(), 10u);  // top, model, rollout, learner, baseline, rl, broadcast, workers[], simulate, price_changes[]
  for (const std::string& prefix : prefixes) {
    Result<PlanConfig> r = Set(prefix + "no_such_key", YAML::Node(1));
    EXPECT_NE(Refusal(r).find("unknown key '" + ErrorName(prefix) + "no_such_key'"), std::string::npos)
        << prefix << ": " << Refusal(r);
  }
}

TEST_F(PlanConfigKeysWalk, HelpTextAndMarkdownListEveryKeyOnce) {
  const KeyTable& table = PlanConfigKeys();
  const std::string text = "\n" + table.Describe();
  const std::string markdown = "\n" + table.Markdown();
  auto count = [](const std::string& s, const std::string& part) {
    size_t n = 0;
    for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
    return n;
  };
  for (const KeyDoc& k : table.keys()) {
    EXPECT_EQ(count(text, "\n  " + k.key + " ("), 1u) << k.key;
    EXPECT_EQ(count(markdown, "\n| `" + k.key + "` |"), 1u) << k.key;
  }
  size_t key_lines = 0;  // a line per key; its help is indented further
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) key_lines += line.size() > 2 && line.rfind("  ", 0) == 0 && line[2] != ' ';
  EXPECT_EQ(key_lines, table.keys().size());
  EXPECT_NE(text.find("\n  workers[].gpu (a string, required; read by plan, simulate)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  rl.staleness_cap (an integer, default 6, range [1, 1000]; read by plan, simulate)\n"),
            std::string::npos);
  EXPECT_NE(text.find("\n  broadcast.mode (a string, default relay, one of relay star; read by plan, simulate)\n"),
            std::string::npos);
}

// Every key a shipped plan/simulate config uses is in the table.
void Flatten(const YAML::Node& node, const std::string& prefix, std::set<std::string>* keys) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = prefix + it->first.Scalar();
    keys->insert(key);
    if (it->second.IsMap()) Flatten(it->second, key + ".", keys);
    if (it->second.IsSequence())
      for (const YAML::Node& entry : it->second)
        if (entry.IsMap()) Flatten(entry, key + "[].", keys);
  }
}

TEST_F(PlanConfigKeysWalk, ShippedConfigsUseOnlyDescribedKeys) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(RepoPath("configs"))) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("plan-", 0) != 0 && name.rfind("simulate-", 0) != 0) continue;
    ++files;
    std::set<std::string> keys;
    Flatten(YAML::LoadFile(entry.path().string()), "", &keys);
    for (const std::string& key : keys) {
      bool described = PlanConfigKeys().Find(key) != nullptr;  // a key, or a section holding keys
      for (const KeyDoc& d : PlanConfigKeys().keys()) described |= d.key.rfind(key + ".", 0) == 0;
      EXPECT_TRUE(described) << name << ": " << key;
    }
  }
  EXPECT_GE(files, 6);
}

// docs/CAPACITY.md's "Config keys" table is the generated one (`echelon plan --config-keys
// markdown`).
TEST_F(PlanConfigKeysWalk, CapacityDocTableIsTheGeneratedOne) {
  std::ifstream in(RepoPath("docs/CAPACITY.md"));
  ASSERT_TRUE(in) << RepoPath("docs/CAPACITY.md");
  std::string line, table;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Config keys";
    if (in_section && line.rfind("|", 0) == 0) table += line + "\n";
  }
  EXPECT_EQ(table, PlanConfigKeys().Markdown())
      << "regenerate the table in docs/CAPACITY.md with `echelon plan --config-keys markdown`";
}

}  // namespace
}  // namespace echelon::plan
