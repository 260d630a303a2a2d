#include "echelon/data/prompts_adapter.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/data/adapter_kit.h"
#include "echelon/data/http_reward.h"
#include "echelon/data/parquet.h"
#include "echelon/data/python_reward.h"
#include "echelon/data/adapter_options.h"
#include "echelon/data/reward_spec.h"

namespace echelon::data {
namespace {

constexpr char kExample[] =
    R"(a row is {"prompt": [{"role": "user", "content": "..."}], "reward_model": {"ground_truth": "..."}})";

std::string Field(const std::string& name) { return "field \"" + name + "\""; }

// A ground truth as text: a string, or a number as JSON writes it.
Result<std::string> GroundTruth(const nlohmann::json& v, const std::string& field) {
  if (v.is_string()) {
    if (v.get<std::string>().find_first_not_of(" \t\r\n") == std::string::npos)
      return InvalidArgument(Field(field) + ": the ground truth is empty");
    return v.get<std::string>();
  }
  if (v.is_number()) return v.dump();
  return InvalidArgument(Field(field) + ": must be a string or a number");
}

// The prompt into p->text (and p->system): a string, or chat messages [system?, user].
Status PromptText(const nlohmann::json& j, Prompt* p) {
  if (j.is_string()) {
    if (j.get<std::string>().empty()) return InvalidArgument(Field("prompt") + ": empty");
    p->text = j.get<std::string>();
    return Status::Ok();
  }
  if (!j.is_array()) return InvalidArgument(Field("prompt") + ": must be a string or a list of chat messages");
  const size_t n = j.size();
  if (n == 0 || n > 2)
    return InvalidArgument(Field("prompt") + ": holds " + std::to_string(n) +
                           " messages; supported are one user message, or a system message then a user message");
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& m = j[i];
    const std::string at = "prompt[" + std::to_string(i) + "]";
    const std::string role = i + 1 == n ? "user" : "system";
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string())
      return InvalidArgument(Field(at) + ": must be {\"role\": \"" + role + "\", \"content\": \"...\"}");
    if (m["role"] != role)
      return InvalidArgument(Field(at + ".role") + ": \"" + m["role"].get<std::string>() + "\", expected \"" + role +
                             "\" (supported are one user message, or a system message then a user message)");
    if (m["content"].get<std::string>().empty()) return InvalidArgument(Field(at + ".content") + ": empty");
    (role == "user" ? p->text : p->system) = m["content"].get<std::string>();
  }
  return Status::Ok();
}

Result<Prompt> ParseRow(const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(std::string("not valid JSON; ") + kExample);
  if (!j.is_object()) return InvalidArgument(std::string("not a JSON object; ") + kExample);
  if (!j.contains("prompt")) return InvalidArgument("missing " + Field("prompt") + "; " + kExample);
  Prompt p;
  ECHELON_RETURN_IF_ERROR(PromptText(j["prompt"], &p));
  if (j.contains("reward_model")) {
    const nlohmann::json& rm = j["reward_model"];
    if (!rm.is_object() || !rm.contains("ground_truth"))
      return InvalidArgument(Field("reward_model") + ": must be an object with \"ground_truth\"");
    ECHELON_ASSIGN_OR_RETURN(p.reference, GroundTruth(rm["ground_truth"], "reward_model.ground_truth"));
  } else if (j.contains("answer")) {
    ECHELON_ASSIGN_OR_RETURN(p.reference, GroundTruth(j["answer"], "answer"));
  } else {
    return InvalidArgument("missing " + Field("reward_model.ground_truth") + " (or \"answer\"); " + kExample);
  }
  if (j.contains("data_source")) {
    if (!j["data_source"].is_string()) return InvalidArgument(Field("data_source") + ": must be a string");
    p.data_source = j["data_source"].get<std::string>();
  }
  if (j.contains("extra_info")) p.extra_info = j["extra_info"].dump();
  return p;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr uint64_t kSplitStream = 1;
constexpr uint64_t kShuffleStream = 2;

struct PromptsOptions {
  std::string train_file;
  std::string eval_file;
  double eval_fraction = 0.1;
  uint64_t seed = 0;
  bool external_errors_score_zero = false;  // reward_on_error: zero
  double reward_group_seconds = 0;          // Python reward time of one group (0: unbounded)
};

class PromptsAdapter final : public TaskAdapter {
 public:
  PromptsAdapter(PromptsOptions o, RewardSpec reward, std::unique_ptr<PythonRewardPool> python,
                 std::unique_ptr<HttpReward> http)
      : opts_(std::move(o)), reward_(std::move(reward)), python_(std::move(python)), http_(std::move(http)) {}

  Status Load() {
    std::vector<PromptRow> train;
    if (!opts_.train_file.empty()) {
      ECHELON_ASSIGN_OR_RETURN(train, ReadPromptRows(opts_.train_file));
    }
    if (!opts_.eval_file.empty()) {
      ECHELON_ASSIGN_OR_RETURN(held_out_rows_, ReadPromptRows(opts_.eval_file));
      train_ = std::move(train);
    } else if (!train.empty()) {
      ECHELON_RETURN_IF_ERROR(Split(std::move(train)));
    }
    for (size_t i = 0; i < held_out_rows_.size(); ++i) {
      held_out_.push_back(held_out_rows_[i].prompt);
      held_out_.back().id = i;
    }
    order_.resize(train_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[StableHash(opts_.seed, kShuffleStream, i, 0) % i]);
    return Status::Ok();
  }

  std::string name() const override { return "prompts"; }

  std::string Alphabet() const override {
    std::set<char> chars;
    for (const std::vector<PromptRow>* rows : {&train_, &held_out_rows_})
      for (const PromptRow& r : *rows) {
        chars.insert(r.prompt.text.begin(), r.prompt.text.end());
        chars.insert(r.prompt.system.begin(), r.prompt.system.end());
        if (!r.prompt.system.empty()) chars.insert('\n');  // joins system and user without a chat template
        chars.insert(r.prompt.reference.begin(), r.prompt.reference.end());
      }
    return std::string(chars.begin(), chars.end());
  }

  Status ReadyToTrain() const override {
    if (train_.empty()) return FailedPrecondition("prompts task: set task.train_file (the training rows)");
    if (reward_.uses_python() && !python_)
      return FailedPrecondition("prompts task: the reward uses python: set task.python_file (and task.python_function)");
    if (reward_.uses_http() && !http_)
      return FailedPrecondition("prompts task: the reward uses http: set task.reward_url");
    return Status::Ok();
  }

  // Actors have neither python_file nor reward_url: the learner computes those rewards.
  bool ActorsCanScore() const override { return !reward_.uses_python() && !reward_.uses_http(); }

  uint64_t TrainPromptKey(uint64_t group_id) const override {
    return train_.empty() ? group_id : order_[group_id % order_.size()];
  }

  Prompt TrainPrompt(uint64_t group_id) const override {
    if (train_.empty()) return Prompt{group_id, "", ""};
    Prompt p = train_[order_[group_id % order_.size()]].prompt;
    p.id = group_id;
    return p;
  }

  const std::vector<Prompt>& HeldOut() const override { return held_out_; }

  Result<std::vector<Episode>> RunGroup(const Prompt& prompt, int group_size, Policy& policy,
                                        uint64_t seed) const override {
    return RunSingleTurnGroup(*this, prompt, group_size, policy, seed);
  }
  bool SamplesWithGroupSeed() const override { return true; }

  Result<Scored> Reward(const Prompt& prompt, const std::string& completion) const override {
    ECHELON_ASSIGN_OR_RETURN(std::vector<Scored> one, RewardGroup(prompt, {completion}));
    return std::move(one[0]);
  }

  // The built-in verifiers, plus one Python call per completion and one HTTP request per
  // group when the reward uses them.
  Result<std::vector<Scored>> RewardGroup(const Prompt& prompt, const std::vector<std::string>& completions) const override {
    const size_t n = completions.size();
    std::vector<Scored> out(n);
    std::vector<ExternalScores> external(n);
    const std::string extra_info = prompt.extra_info.empty() ? "null" : prompt.extra_info;
    std::vector<RewardSample> samples;
    for (const std::string& c : completions) samples.push_back({prompt.data_source, c, prompt.reference, extra_info});
    // One budget for the group's external calls (task.reward_group_seconds). A group whose texts
    // spend it is refused whatever reward_on_error says: the time is its worker's doing
    // (learn/trajectory_intake.h: reward_slow, counted against that worker).
    const auto start = std::chrono::steady_clock::now();
    const auto left = [&] {
      if (opts_.reward_group_seconds <= 0) return 0.0;  // no budget
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return std::max(1e-3, opts_.reward_group_seconds - elapsed);
    };
    if (python_) {
      // On the pool's workers side by side (task.reward_workers), in order.
      const std::vector<Result<ExternalScore>> scores = python_->ScoreAll(samples, left());
      for (const Result<ExternalScore>& s : scores)
        if (!s.ok() && s.status().code() == StatusCode::kResourceExhausted) return s.status();
      for (size_t i = 0; i < n; ++i) ECHELON_RETURN_IF_ERROR(Take(scores[i], "python", &external[i].python, &out[i].metrics));
    }
    if (http_) {
      Result<std::vector<ExternalScore>> s = http_->Score(samples, left());
      if (!s.ok() && s.status().code() == StatusCode::kResourceExhausted) return s.status();
      for (size_t i = 0; i < n; ++i)
        ECHELON_RETURN_IF_ERROR(Take(s.ok() ? Result<ExternalScore>(s.value()[i]) : Result<ExternalScore>(s.status()),
                                     "http", &external[i].http, &out[i].metrics));
    }
    for (size_t i = 0; i < n; ++i) out[i].reward = reward_.Score(completions[i], prompt.reference, external[i]);
    return out;
  }

  std::string Demonstration(const Prompt& prompt) const override { return prompt.reference; }

  Status ExportHeldOut(const std::string& path) const override {
    std::string out;
    for (const PromptRow& r : held_out_rows_) out += r.line + "\n";
    return WriteFileAtomic(path, out);
  }

 private:
  // Holds out round(eval_fraction * n) rows (at least one), chosen by the seed; the rest train.
  Status Split(std::vector<PromptRow> rows) {
    const size_t n = rows.size();
    const size_t held = std::max<size_t>(1, static_cast<size_t>(std::llround(opts_.eval_fraction * n)));
    if (held >= n)
      return InvalidArgument("prompts task: train_file " + opts_.train_file + " has " + std::to_string(n) +
                             " rows; eval_fraction " + std::to_string(opts_.eval_fraction) +
                             " leaves none to train on (give an eval_file or more rows)");
    std::vector<std::pair<uint64_t, size_t>> keyed;
    for (size_t i = 0; i < n; ++i) keyed.emplace_back(StableHash(opts_.seed, kSplitStream, i, 0), i);
    std::sort(keyed.begin(), keyed.end());
    std::vector<bool> is_held(n, false);
    for (size_t k = 0; k < held; ++k) is_held[keyed[k].second] = true;
    for (size_t i = 0; i < n; ++i) (is_held[i] ? held_out_rows_ : train_).push_back(std::move(rows[i]));
    return Status::Ok();
  }

  // One external score into `score` and `metrics`; with reward_on_error: zero a failure scores
  // 0 and counts in metrics "<name>_errors" (logged every 100th time), else it is the error.
  Status Take(const Result<ExternalScore>& s, const std::string& name, double* score,
              std::map<std::string, double>* metrics) const {
    if (!s.ok() && !opts_.external_errors_score_zero) return s.status();
    if (opts_.external_errors_score_zero) (*metrics)[name + "_errors"] = s.ok() ? 0.0 : 1.0;
    if (!s.ok()) {
      if (external_errors_.fetch_add(1) % 100 == 0)
        spdlog::warn("{} reward failed, scored 0 (task.reward_on_error: zero; {} so far): {}", name,
                     external_errors_.load(), s.status().message());
      return Status::Ok();
    }
    *score = s->score;
    for (const auto& [k, v] : s->extras) (*metrics)[k] = v;
    return Status::Ok();
  }

  const PromptsOptions opts_;
  const RewardSpec reward_;
  const std::unique_ptr<PythonRewardPool> python_;  // null without python_file (an actor's adapter)
  const std::unique_ptr<HttpReward> http_;      // null without reward_url (an actor's adapter)
  mutable std::atomic<int64_t> external_errors_{0};
  std::vector<PromptRow> train_;
  std::vector<PromptRow> held_out_rows_;
  std::vector<Prompt> held_out_;
  std::vector<size_t> order_;  // seeded shuffle of train_
};

}  // namespace

Result<std::vector<PromptRow>> ReadPromptRows(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<PromptRow> rows;
  if (EndsWith(path, ".parquet") || text.compare(0, 4, "PAR1") == 0) {
    // verl's layout in Parquet: each row read as the JSON object of its columns, then checked
    // as a JSONL line would be ("FILE: row N: ..." for a bad one, N from 1).
    ECHELON_ASSIGN_OR_RETURN(const std::vector<nlohmann::json> parquet_rows, ParseParquetRows(text, path));
    for (size_t i = 0; i < parquet_rows.size(); ++i) {
      nlohmann::json row = parquet_rows[i];
      // A null column is a key the JSONL row would not have.
      for (auto it = row.begin(); it != row.end();) it = it->is_null() ? row.erase(it) : std::next(it);
      std::string line = row.dump();
      Result<Prompt> p = ParseRow(line);
      if (!p.ok()) return InvalidArgument(path + ": row " + std::to_string(i + 1) + ": " + p.status().message());
      p->id = i + 1;
      rows.push_back(PromptRow{std::move(p).value(), std::move(line)});
    }
    if (rows.empty()) return InvalidArgument(path + ": no rows; " + kExample);
    return rows;
  }
  ECHELON_RETURN_IF_ERROR(ForEachJsonlLine(path, text, [&](uint64_t line_no, const std::string& line) -> Status {
    ECHELON_ASSIGN_OR_RETURN(Prompt p, ParseRow(line));
    p.id = line_no;
    rows.push_back(PromptRow{std::move(p), line});
    return Status::Ok();
  }));
  if (rows.empty()) return InvalidArgument(path + ": no rows; " + kExample);
  return rows;
}

namespace {

// The external rewards the options name (the learner; an actor gets neither files nor URLs).
struct External {
  std::unique_ptr<PythonRewardPool> python;
  std::unique_ptr<HttpReward> http;
};

Result<External> StartExternal(const AdapterOptions& options, const RewardSpec& reward, PromptsOptions* o) {
  const std::string on_error = OptionOr(options, PromptsOptionTable(), "reward_on_error");
  if (on_error != "fail" && on_error != "zero")
    return InvalidArgument("prompts task option reward_on_error: expected fail or zero, got \"" + on_error + "\"");
  o->external_errors_score_zero = on_error == "zero";
  ECHELON_ASSIGN_OR_RETURN(const uint64_t timeout,
                           ParseUnsignedOption("prompts", "reward_timeout", OptionOr(options, PromptsOptionTable(), "reward_timeout"), 1, 86400));
  External e;
  PythonRewardOptions py;
  py.file = OptionOr(options, PromptsOptionTable(), "python_file");
  py.function = OptionOr(options, PromptsOptionTable(), "python_function");
  py.timeout_seconds = static_cast<double>(timeout);
  py.load_timeout_seconds = std::max(py.load_timeout_seconds, py.timeout_seconds);
  ECHELON_ASSIGN_OR_RETURN(const uint64_t budget,
                           ParseUnsignedOption("prompts", "reward_group_seconds",
                                               OptionOr(options, PromptsOptionTable(), "reward_group_seconds"), 0, 86400));
  o->reward_group_seconds = static_cast<double>(budget);
  if (!py.file.empty()) {
    if (!reward.uses_python())
      return InvalidArgument("prompts task: task.python_file is set but task.reward does not use it (reward: python, "
                             "or a sum with python)");
    ECHELON_ASSIGN_OR_RETURN(const uint64_t workers,
                             ParseUnsignedOption("prompts", "reward_workers",
                                                 OptionOr(options, PromptsOptionTable(), "reward_workers"), 1, 256));
    ECHELON_ASSIGN_OR_RETURN(e.python, PythonRewardPool::Start(py, static_cast<int>(workers)));
  }
  const std::string url = OptionOr(options, PromptsOptionTable(), "reward_url");
  if (!url.empty()) {
    if (!reward.uses_http())
      return InvalidArgument("prompts task: task.reward_url is set but task.reward does not use it (reward: http, or "
                             "a sum with http)");
    ECHELON_ASSIGN_OR_RETURN(e.http, HttpReward::Create(url, static_cast<double>(timeout)));
  }
  return e;
}

}  // namespace

// eval_fraction 0.1 is verl's and OpenRLHF's usual split.
const OptionTable& PromptsOptionTable() {
  static const OptionTable table = {
      {"train_file", "", "JSONL training rows, cycled in a seeded shuffled order (needed to train; actors get each "
                         "prompt with its work and need no files)"},
      {"eval_file", "", "JSONL held-out rows; without it, eval_fraction of train_file is held out"},
      {"eval_fraction", "0.1", "share of train_file rows held out (0 < f <= 0.5), chosen by the seed"},
      {"seed", "0", "shuffle order and held-out choice (`echelon train` sets the run's seed)"},
      {"reward", "math", "verifier or weighted sum: math, exact, choice, regex, format, python, http, "
                         "e.g. 0.9*math + 0.1*format (data/reward_spec.h)"},
      {"regex", "", "the regex verifier's expression (ECMAScript syntax without backreferences or lookaround, matched "
                    "in time linear in the completion: data/safe_regex.h)"},
      {"format", "think", "the format verifier's form: think (<think>...</think> then an answer) or a regular "
                          "expression the whole completion matches"},
      {"python_file", "", "a .py file with the reward function, called as verl calls it (learner only)"},
      {"python_function", "compute_score", "the reward function's name in python_file"},
      {"reward_workers", "1", "Python reward processes scoring a group's samples side by side (each call keeps its reward_timeout)"},
      {"reward_url", "", "a scoring service, http://HOST:PORT/PATH (learner only)"},
      {"reward_timeout", "30", "seconds per Python call or HTTP attempt"},
      {"reward_group_seconds", "60", "seconds of Python calls and scoring-service requests one group may take in all "
                                     "(retries included; 0: no bound); a group past it is refused (reward_slow) and "
                                     "counts against its worker, so a text that makes the reward slow costs that "
                                     "worker, not the run"},
      {"reward_on_error", "fail", "fail: a failed Python call or service request refuses the group (reward_error; "
                                  "the run stops when groups of several workers fail in a row); zero: it scores 0 "
                                  "and reward_metrics.<python|http>_errors counts it"},
  };
  return table;
}

Result<std::unique_ptr<TaskAdapter>> CreatePromptsAdapter(const AdapterOptions& options) {
  ECHELON_RETURN_IF_ERROR(CheckOptionNames("prompts", options, PromptsOptionTable()));
  PromptsOptions o;
  o.train_file = OptionOr(options, PromptsOptionTable(), "train_file");
  o.eval_file = OptionOr(options, PromptsOptionTable(), "eval_file");
  ECHELON_ASSIGN_OR_RETURN(o.seed, ParseUnsignedOption("prompts", "seed", OptionOr(options, PromptsOptionTable(), "seed"), 0, UINT64_MAX));
  const std::string fraction = OptionOr(options, PromptsOptionTable(), "eval_fraction");
  size_t used = 0;
  try {
    o.eval_fraction = std::stod(fraction, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != fraction.size() || fraction.empty() || !(o.eval_fraction > 0 && o.eval_fraction <= 0.5))
    return InvalidArgument("prompts task option eval_fraction: expected a number in (0, 0.5], got \"" + fraction + "\"");
  if (!o.eval_file.empty() && options.count("eval_fraction"))
    return InvalidArgument("prompts task options eval_fraction and eval_file are exclusive");
  ECHELON_ASSIGN_OR_RETURN(RewardSpec reward, RewardSpec::Parse(OptionOr(options, PromptsOptionTable(), "reward"),
                                                                OptionOr(options, PromptsOptionTable(), "regex"),
                                                                OptionOr(options, PromptsOptionTable(), "format")));
  ECHELON_ASSIGN_OR_RETURN(External external, StartExternal(options, reward, &o));
  auto adapter = std::make_unique<PromptsAdapter>(std::move(o), std::move(reward), std::move(external.python),
                                                  std::move(external.http));
  ECHELON_RETURN_IF_ERROR(adapter->Load());
  return std::unique_ptr<TaskAdapter>(std::move(adapter));
}

}  // namespace echelon::data
