#include "echelon/obs/report_data.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "echelon/obs/metrics_log.h"

namespace echelon::obs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Reads an optional number field: absent or null -> kMissing; anything else not a number ->
// an error naming the field.
Status ReadNumber(const json& o, const char* key, const std::string& where, double* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return Status::Ok();
  if (!it->is_number())
    return InvalidArgument(where + ": field '" + key + "' is " + it->dump() + "; expected a number");
  *out = it->get<double>();
  return Status::Ok();
}

Status ReadEvent(const json& o, const std::string& where, RunEvent* e) {
  e->present = true;
  e->kind = o["event"].get<std::string>();
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "wall_s", where, &e->wall_s));
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "heldout_accuracy", where, &e->heldout_accuracy));
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "version", where, &e->version));
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "learner_busy_frac", where, &e->learner_busy_frac));
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "groups_consumed", where, &e->groups_consumed));
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "groups_dropped_stale", where, &e->groups_dropped_stale));
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "groups_reissued", where, &e->groups_reissued));
  return Status::Ok();
}

Status ReadEval(const json& o, const std::string& where, std::vector<EvalPoint>* out) {
  auto set = o.find("set");
  if (set == o.end() || !set->is_string()) return InvalidArgument(where + ": an eval line without its set's name");
  EvalPoint p;
  p.set = set->get<std::string>();
  ECHELON_RETURN_IF_ERROR(ReadNumber(o, "version", where, &p.version));
  auto figures = o.find("eval/" + p.set);
  if (figures == o.end() || !figures->is_object())
    return InvalidArgument(where + ": an eval line without its figures (\"eval/" + p.set + "\")");
  ECHELON_RETURN_IF_ERROR(ReadNumber(*figures, "k", where, &p.k));
  ECHELON_RETURN_IF_ERROR(ReadNumber(*figures, "mean_at_k", where, &p.mean_at_k));
  ECHELON_RETURN_IF_ERROR(ReadNumber(*figures, "pass_at_k", where, &p.pass_at_k));
  out->push_back(std::move(p));
  return Status::Ok();
}

void Flatten(const YAML::Node& node, const std::string& prefix, std::vector<std::pair<std::string, std::string>>* out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      Flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else if (node.IsSequence()) {
    std::string joined;
    for (size_t i = 0; i < node.size(); ++i) {
      YAML::Emitter e;
      e << YAML::Flow << node[i];
      joined += (i ? ", " : "") + std::string(e.c_str());
    }
    out->emplace_back(prefix, "[" + joined + "]");
  } else if (node.IsScalar()) {
    out->emplace_back(prefix, node.Scalar());
  } else {
    out->emplace_back(prefix, "");
  }
}

}  // namespace

Result<RunData> ParseMetrics(std::istream& in, const std::string& path) {
  RunData run;
  Result<int64_t> read = ReadMetricsLines(in, path, [&](const json& o, const std::string& where, int64_t) -> Status {
    auto ev = o.find("event");
    if (ev != o.end()) {
      const std::string kind = ev->get<std::string>();
      if (kind == "warmstart") return ReadEvent(o, where, &run.warmstart);
      if (kind == "final" || kind == "interrupted") return ReadEvent(o, where, &run.end);
      if (kind == "eval") return ReadEval(o, where, &run.evals);
      return Status::Ok();
    }
    ECHELON_ASSIGN_OR_RETURN(StepRecord r, StepRecord::FromJson(o, where));
    run.steps.push_back(std::move(r));
    return Status::Ok();
  });
  if (!read.ok()) return read.status();
  return run;
}

Result<std::vector<std::pair<std::string, std::string>>> ParseConfigYaml(const std::string& text,
                                                                          const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return out;
    if (!root.IsMap()) return InvalidArgument(path + ":1: expected a YAML map of settings");
    Flatten(root, "", &out);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML (" + e.msg + ")");
  }
  return out;
}

Result<RunData> LoadRun(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return NotFound(dir + ": no such run directory (expected a directory written by `echelon train`)");
  const std::string metrics_path = (fs::path(dir) / "metrics.jsonl").string();
  std::ifstream in(metrics_path);
  if (!in) return NotFound(metrics_path + ": cannot open (is " + dir + " a run directory?)");
  ECHELON_ASSIGN_OR_RETURN(RunData run, ParseMetrics(in, metrics_path));
  if (run.steps.empty()) return InvalidArgument(metrics_path + ": no training step lines; nothing to report");
  run.dir = dir;
  run.label = fs::path(dir).lexically_normal().filename().string();
  if (run.label.empty()) run.label = fs::path(dir).lexically_normal().parent_path().filename().string();
  const std::string config_path = (fs::path(dir) / "config.yaml").string();
  if (!fs::exists(config_path, ec)) {
    run.config_note = "no config.yaml in " + dir;
    return run;
  }
  std::ifstream config_in(config_path);
  std::stringstream text;
  text << config_in.rdbuf();
  if (!config_in) return DataLoss(config_path + ": cannot read");
  ECHELON_ASSIGN_OR_RETURN(run.config, ParseConfigYaml(text.str(), config_path));
  return run;
}

void AssignLabels(std::vector<RunData>* runs) {
  // Lengthen each clashing label by one more parent directory until all differ (or paths run out).
  std::vector<fs::path> paths;
  std::vector<int> depth(runs->size(), 1);
  for (const RunData& r : *runs) paths.push_back(fs::absolute(r.dir).lexically_normal());
  auto suffix = [&](size_t i) {
    std::vector<std::string> parts;
    for (const auto& p : paths[i])
      if (!p.empty() && p != "/") parts.push_back(p.string());
    while (!parts.empty() && parts.back().empty()) parts.pop_back();
    const int n = std::min<int>(depth[i], static_cast<int>(parts.size()));
    std::string s;
    for (int k = static_cast<int>(parts.size()) - n; k < static_cast<int>(parts.size()); ++k)
      s += (s.empty() ? "" : "/") + parts[k];
    return s;
  };
  for (int round = 0; round < 64; ++round) {
    bool changed = false;
    std::map<std::string, std::vector<size_t>> by_label;
    for (size_t i = 0; i < runs->size(); ++i) by_label[suffix(i)].push_back(i);
    for (auto& [label, idx] : by_label) {
      if (idx.size() < 2) continue;
      for (size_t i : idx) {
        const std::string before = suffix(i);
        ++depth[i];
        changed |= suffix(i) != before;
      }
    }
    if (!changed) break;
  }
  for (size_t i = 0; i < runs->size(); ++i) (*runs)[i].label = suffix(i);
}

}  // namespace echelon::obs
