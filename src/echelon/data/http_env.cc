#include "echelon/data/http_env.h"

#include <cmath>
#include <optional>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/data/adapter_kit.h"
#include "echelon/data/adapter_options.h"
#include "echelon/data/json_http.h"

namespace echelon::data {
namespace {

using nlohmann::json;

constexpr uint64_t kEvalSeedBase = uint64_t{1} << 50;
constexpr uint64_t kMaxSeed = (uint64_t{1} << 53) - 1;

struct EnvOptions {
  std::string server;
  uint64_t max_turns = 8;
  uint64_t eval_size = 32;
  uint64_t seed = 0;
  std::optional<RunSecret> secret;  // training episode seeds (held-out ones come from the seed)
  std::string eval_file;
  double timeout_seconds = 30;
};

// One step's answer, checked.
struct StepAnswer {
  std::string observation;
  double reward = 0;
  bool done = false;
  std::map<std::string, double> metrics;
};

// The environment service: the three endpoints with their answers checked.
class EnvService {
 public:
  explicit EnvService(JsonHttp http) : http_(std::move(http)) {}

  // {session, observation}
  Result<std::pair<json, std::string>> Reset(uint64_t seed) const {
    ECHELON_ASSIGN_OR_RETURN(const json a, http_.Post("/reset", {{"seed", seed}}));
    if (!a.is_object() || !a.contains("session") || !(a["session"].is_string() || a["session"].is_number_integer()))
      return Bad("/reset", a, "\"session\" (a string or an integer)");
    if (!a.contains("observation") || !a["observation"].is_string()) return Bad("/reset", a, "\"observation\" (a string)");
    return std::make_pair(a["session"], a["observation"].get<std::string>());
  }

  Result<StepAnswer> Step(const json& session, const std::string& action) const {
    ECHELON_ASSIGN_OR_RETURN(const json a, http_.Post("/step", {{"session", session}, {"action", action}}));
    if (!a.is_object()) return Bad("/step", a, "a JSON object");
    StepAnswer s;
    if (!a.contains("reward") || !a["reward"].is_number() || !std::isfinite(a["reward"].get<double>()))
      return Bad("/step", a, "\"reward\" (a finite number)");
    s.reward = a["reward"].get<double>();
    if (!a.contains("done") || !a["done"].is_boolean()) return Bad("/step", a, "\"done\" (true or false)");
    s.done = a["done"].get<bool>();
    if (a.contains("observation") && a["observation"].is_string()) {
      s.observation = a["observation"].get<std::string>();
    } else if (!s.done) {
      return Bad("/step", a, "\"observation\" (a string) while the episode goes on");
    }
    if (a.contains("metrics")) {
      if (!a["metrics"].is_object()) return Bad("/step", a, "\"metrics\" as an object of numbers");
      for (const auto& [k, v] : a["metrics"].items()) {
        if (!v.is_number() || !std::isfinite(v.get<double>())) return Bad("/step", a, "\"metrics\"." + k + " (a finite number)");
        s.metrics[k] = v.get<double>();
      }
    }
    return s;
  }

  // Best effort: a session cut at max_turns is released; errors are ignored.
  void Close(const json& session) const { (void)http_.Post("/close", {{"session", session}}); }

 private:
  Status Bad(const std::string& endpoint, const json& answer, const std::string& wanted) const {
    return InvalidArgument("environment POST " + http_.url() + endpoint + ": expected " + wanted + " in the answer, got " +
                           Clip(answer.dump(-1, ' ', false, json::error_handler_t::replace), 300));
  }

  JsonHttp http_;
};

uint64_t SeedOf(const Prompt& p) {
  uint64_t seed = 0;
  for (char c : p.reference) seed = seed * 10 + static_cast<uint64_t>(c - '0');
  return seed;
}

Prompt PromptOfSeed(uint64_t id, uint64_t seed) {
  return Prompt{id, "environment seed " + std::to_string(seed), std::to_string(seed), "", ""};
}

class HttpEnvAdapter final : public TaskAdapter {
 public:
  HttpEnvAdapter(EnvOptions o, std::optional<EnvService> env, std::vector<Prompt> held_out)
      : opts_(std::move(o)), env_(std::move(env)), held_out_(std::move(held_out)) {}

  std::string name() const override { return "http-env"; }

  // Printable ASCII and newline: what a character tokenizer can take from an environment's text.
  std::string Alphabet() const override {
    std::string a = "\n";
    for (char c = 0x20; c < 0x7f; ++c) a += c;
    return a;
  }

  Status ReadyToTrain() const override {
    if (!env_) return FailedPrecondition("http-env task: set task.server (the environment's http://HOST:PORT)");
    return Status::Ok();
  }

  // A training episode's seed: from the run's secret (below the held-out seeds), so a worker
  // cannot know the episode of a group it plays; without one, from the seed.
  Prompt TrainPrompt(uint64_t group_id) const override {
    const uint64_t seed = opts_.secret ? opts_.secret->Draw("environment seed", group_id) % kEvalSeedBase
                                       : (opts_.seed + group_id) & kMaxSeed;
    return PromptOfSeed(group_id, seed);
  }

  const std::vector<Prompt>& HeldOut() const override { return held_out_; }

  bool EvalPlaysEpisodes() const override { return true; }
  size_t MaxTurns() const override { return opts_.max_turns; }

  // The G episodes start from the prompt's seed and advance together: one policy call per turn
  // for every episode still going.
  Result<std::vector<Episode>> RunGroup(const Prompt& prompt, int group_size, Policy& policy,
                                        uint64_t seed) const override {
    ECHELON_RETURN_IF_ERROR(ReadyToTrain());
    struct Live {
      json session;
      std::string observation;
      bool done = false;
    };
    std::vector<Live> live(std::max(group_size, 0));
    std::vector<Episode> episodes(live.size());
    for (Live& l : live) {
      ECHELON_ASSIGN_OR_RETURN(std::tie(l.session, l.observation), env_->Reset(SeedOf(prompt)));
    }
    for (uint64_t turn = 0; turn < opts_.max_turns; ++turn) {
      std::vector<size_t> going;
      std::vector<PolicyPrompt> prompts;
      for (size_t i = 0; i < live.size(); ++i)
        if (!live[i].done) {
          going.push_back(i);
          prompts.push_back(live[i].observation);
        }
      if (going.empty()) break;
      ECHELON_ASSIGN_OR_RETURN(std::vector<Turn> turns, policy.Sample(prompts, StableHash(seed, turn, 0, 0)));
      if (turns.size() != prompts.size())
        return Internal("http-env: the policy returned " + std::to_string(turns.size()) + " completions for " +
                        std::to_string(prompts.size()) + " prompts");
      for (size_t k = 0; k < going.size(); ++k) {
        Live& l = live[going[k]];
        Episode& e = episodes[going[k]];
        ECHELON_ASSIGN_OR_RETURN(StepAnswer s, env_->Step(l.session, turns[k].text));
        e.reward += s.reward;
        e.turns.push_back(std::move(turns[k]));
        l.done = s.done;
        l.observation = std::move(s.observation);
        if (s.done) e.metrics = std::move(s.metrics);
      }
    }
    for (size_t i = 0; i < live.size(); ++i) {
      if (!live[i].done) env_->Close(live[i].session);
      episodes[i].success = episodes[i].reward >= 1.0;
    }
    return episodes;
  }

  Result<Scored> Reward(const Prompt& prompt, const std::string& completion) const override {
    ECHELON_ASSIGN_OR_RETURN(std::optional<Replay> r, ReplayEpisode(prompt, {completion}));
    return std::move(r->scored);
  }

  // Replays the actions from the prompt's seed, up to the environment's done or max_turns; the
  // prompts are the observations the environment answered with.
  Result<std::optional<Replay>> ReplayEpisode(const Prompt& prompt, const std::vector<std::string>& actions) const override {
    ECHELON_RETURN_IF_ERROR(ReadyToTrain());
    json session;
    std::string observation;
    ECHELON_ASSIGN_OR_RETURN(std::tie(session, observation), env_->Reset(SeedOf(prompt)));
    Replay out;
    bool done = false;
    for (size_t i = 0; i < actions.size() && i < opts_.max_turns && !done; ++i) {
      out.prompts.push_back(std::move(observation));
      ECHELON_ASSIGN_OR_RETURN(StepAnswer s, env_->Step(session, actions[i]));
      out.scored.reward += s.reward;
      observation = std::move(s.observation);
      done = s.done;
      if (done) out.scored.metrics = std::move(s.metrics);
    }
    if (!done) env_->Close(session);
    out.success = out.scored.reward >= 1.0;
    return std::optional<Replay>(std::move(out));
  }

  // An environment has no demonstrations: the warm-start refuses it.
  std::string Demonstration(const Prompt&) const override { return ""; }

  Status ExportHeldOut(const std::string& path) const override {
    std::string text;
    for (const Prompt& p : held_out_) text += json{{"seed", SeedOf(p)}}.dump() + "\n";
    return WriteFileAtomic(path, text);
  }

 private:
  const EnvOptions opts_;
  const std::optional<EnvService> env_;  // empty without `server`
  const std::vector<Prompt> held_out_;
};

Result<std::vector<Prompt>> ReadSeeds(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<Prompt> out;
  ECHELON_RETURN_IF_ERROR(ForEachJsonlLine(path, text, [&](uint64_t, const std::string& line) -> Status {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("seed") || !j["seed"].is_number_unsigned() || j["seed"].get<uint64_t>() > kMaxSeed)
      return InvalidArgument("expected {\"seed\": N} with N an integer in 0..2^53-1");
    out.push_back(PromptOfSeed(out.size(), j["seed"].get<uint64_t>()));
    return Status::Ok();
  }));
  if (out.empty()) return InvalidArgument(path + ": no seeds; a line is {\"seed\": N}");
  return out;
}

}  // namespace

const OptionTable& HttpEnvOptionTable() {
  static const OptionTable table = {
      {"server", "", "the environment service, http://HOST:PORT (the learner reaches it and plays each group for its actors)"},
      {"max_turns", "8", "turns of one episode before it is cut off"},
      {"eval_size", "32", "held-out episodes (seeds the service is asked for); exclusive with eval_file"},
      {"eval_file", "", "JSONL held-out episodes"},
      {"seed", "0", "held-out episode seeds, and training ones without a secret (`echelon train` sets the run's seed)"},
      SecretOptionRow("training episode seeds"),
      {"timeout", "30", "seconds per request to the service"},
  };
  return table;
}

Result<std::unique_ptr<TaskAdapter>> CreateHttpEnvAdapter(const AdapterOptions& options) {
  ECHELON_RETURN_IF_ERROR(CheckOptionNames("http-env", options, HttpEnvOptionTable()));
  EnvOptions o;
  o.server = OptionOr(options, HttpEnvOptionTable(), "server");
  o.eval_file = OptionOr(options, HttpEnvOptionTable(), "eval_file");
  ECHELON_ASSIGN_OR_RETURN(o.max_turns, ParseUnsignedOption("http-env", "max_turns", OptionOr(options, HttpEnvOptionTable(), "max_turns"), 1, 1000));
  ECHELON_ASSIGN_OR_RETURN(o.eval_size, ParseUnsignedOption("http-env", "eval_size", OptionOr(options, HttpEnvOptionTable(), "eval_size"), 1, 1000000));
  ECHELON_ASSIGN_OR_RETURN(o.seed, ParseUnsignedOption("http-env", "seed", OptionOr(options, HttpEnvOptionTable(), "seed"), 0, uint64_t{1} << 40));
  ECHELON_ASSIGN_OR_RETURN(o.secret, ParseSecretOption("http-env", options));
  ECHELON_ASSIGN_OR_RETURN(const uint64_t timeout,
                           ParseUnsignedOption("http-env", "timeout", OptionOr(options, HttpEnvOptionTable(), "timeout"), 1, 86400));
  o.timeout_seconds = static_cast<double>(timeout);
  if (!o.eval_file.empty() && options.count("eval_size"))
    return InvalidArgument("http-env task options eval_size and eval_file are exclusive");
  std::optional<EnvService> env;
  if (!o.server.empty()) {
    ECHELON_ASSIGN_OR_RETURN(JsonHttp http, JsonHttp::Create(o.server, o.timeout_seconds, "environment"));
    env.emplace(std::move(http));
  }
  std::vector<Prompt> held_out;
  if (!o.eval_file.empty()) {
    ECHELON_ASSIGN_OR_RETURN(held_out, ReadSeeds(o.eval_file));
  } else {
    for (uint64_t i = 0; i < o.eval_size; ++i) held_out.push_back(PromptOfSeed(i, kEvalSeedBase + o.seed + i));
  }
  return std::unique_ptr<TaskAdapter>(std::make_unique<HttpEnvAdapter>(std::move(o), std::move(env), std::move(held_out)));
}

}  // namespace echelon::data
