#include "echelon/contract/run_spec.h"

namespace echelon::contract {

bool LearnerOnlyTaskOption(const std::string& key) {
  if (key == "seed" || key == "secret" || key == "server") return true;
  for (const std::string suffix : {"_file", "_url"})
    if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  return false;
}

namespace {

data::AdapterOptions WorkerTaskOptions(data::AdapterOptions options) {
  for (auto it = options.begin(); it != options.end();) it = LearnerOnlyTaskOption(it->first) ? options.erase(it) : std::next(it);
  return options;
}

}  // namespace

nlohmann::json RunSpecToJson(const RunSpec& spec) {
  return {{"task", {{"name", spec.task_name}, {"options", WorkerTaskOptions(spec.task_options)}}},
          {"model", spec.model.ToJson()},
          {"vocabulary", spec.vocab.ToJson()},
          {"sampling",
           {{"temperature", spec.sampling.temperature},
            {"top_p", spec.sampling.top_p},
            {"top_k", spec.sampling.top_k},
            {"min_p", spec.sampling.min_p},
            {"max_new_tokens", spec.sampling.max_new_tokens},
            {"slots", spec.sampling.slots},
            {"route_margin", spec.sampling.route_margin}}},
          {"partial", spec.partial},
          {"verify_draws", spec.verify_draws}};
}

Result<ActorSetup> ParseRunSpec(const std::string& json_text) {
  const std::string where = "run spec from the learner";
  try {
    const nlohmann::json j = nlohmann::json::parse(json_text);
    ActorSetup s;
    // An older learner's spec may carry learner-only options: the adapter is built without them.
    const data::AdapterOptions task_options =
        WorkerTaskOptions(j.at("task").at("options").get<data::AdapterOptions>());
    ECHELON_ASSIGN_OR_RETURN(s.task, data::CreateAdapter(j.at("task").at("name").get<std::string>(), task_options));
    ECHELON_ASSIGN_OR_RETURN(s.model, model::ModelConfig::FromJson(j.at("model"), where));
    ECHELON_ASSIGN_OR_RETURN(s.vocab, model::Vocabulary::FromJson(j.at("vocabulary"), where));
    const nlohmann::json& sp = j.at("sampling");
    s.sampling.temperature = sp.at("temperature").get<double>();
    s.sampling.top_p = sp.at("top_p").get<double>();
    s.sampling.top_k = sp.at("top_k").get<int64_t>();
    s.sampling.min_p = sp.at("min_p").get<double>();
    s.sampling.max_new_tokens = sp.at("max_new_tokens").get<int64_t>();
    s.sampling.slots = sp.at("slots").get<int64_t>();
    s.sampling.route_margin = sp.value("route_margin", 0.0);  // absent from older learners' specs
    s.vocab.SetStops(&s.sampling);
    s.partial = j.at("partial").get<bool>();
    s.verify_draws = j.value("verify_draws", false);  // absent from older learners' specs
    return s;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + " is malformed: " + e.what());
  }
}

}  // namespace echelon::contract
