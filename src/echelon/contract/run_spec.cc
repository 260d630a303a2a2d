#include "echelon/contract/run_spec.h"

namespace echelon::contract {

nlohmann::json RunSpecToJson(const RunSpec& spec) {
  return {{"task", {{"name", spec.task_name}, {"options", spec.task_options}}},
          {"model", spec.model.ToJson()},
          {"vocabulary", spec.vocab.ToJson()},
          {"sampling",
           {{"temperature", spec.sampling.temperature},
            {"top_p", spec.sampling.top_p},
            {"top_k", spec.sampling.top_k},
            {"min_p", spec.sampling.min_p},
            {"max_new_tokens", spec.sampling.max_new_tokens},
            {"slots", spec.sampling.slots}}},
          {"seed", spec.seed},
          {"partial", spec.partial},
          {"verify_draws", spec.verify_draws}};
}

Result<ActorSetup> ParseRunSpec(const std::string& json_text) {
  const std::string where = "run spec from the learner";
  try {
    const nlohmann::json j = nlohmann::json::parse(json_text);
    ActorSetup s;
    data::AdapterOptions task_options = j.at("task").at("options").get<data::AdapterOptions>();
    // Data files and reward services are the learner's: an actor gets each prompt (and what
    // its reward needs) with the work, so it builds the adapter without `*_file` / `*_url`.
    auto learner_only = [](const std::string& k) {
      for (const std::string suffix : {"_file", "_url"})
        if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
      return false;
    };
    for (auto it = task_options.begin(); it != task_options.end();)
      it = learner_only(it->first) ? task_options.erase(it) : std::next(it);
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
    s.vocab.SetStops(&s.sampling);
    s.seed = j.at("seed").get<uint64_t>();
    s.partial = j.at("partial").get<bool>();
    s.verify_draws = j.value("verify_draws", false);  // absent from older learners' specs
    return s;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + " is malformed: " + e.what());
  }
}

}  // namespace echelon::contract
