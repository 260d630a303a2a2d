#include "echelon/cli/run_spec.h"

namespace echelon::cli {

model::SamplingParams RolloutSampling(const RunOptions& options) {
  model::SamplingParams sp;
  sp.temperature = options.temperature;
  sp.top_p = options.top_p;
  sp.max_new_tokens = options.max_new_tokens;
  return sp;
}

nlohmann::json MakeRunSpec(const RunOptions& options, const model::ModelConfig& model, const model::Vocabulary& vocab) {
  const model::SamplingParams sp = RolloutSampling(options);
  return {{"task", {{"name", options.task_name}, {"options", options.task_options}}},
          {"model", model.ToJson()},
          {"vocabulary", vocab.ToJson()},
          {"sampling",
           {{"temperature", sp.temperature},
            {"top_p", sp.top_p},
            {"max_new_tokens", sp.max_new_tokens}}},
          {"seed", options.seed}};
}

Result<ActorSetup> ParseRunSpec(const std::string& json_text) {
  const std::string where = "run spec from the learner";
  try {
    const nlohmann::json j = nlohmann::json::parse(json_text);
    ActorSetup s;
    data::AdapterOptions task_options = j.at("task").at("options").get<data::AdapterOptions>();
    // Data files live on the learner's host; an actor gets each prompt (and what its reward
    // needs) with the work, so it builds the adapter without them.
    for (auto it = task_options.begin(); it != task_options.end();)
      it = it->first.size() > 5 && it->first.compare(it->first.size() - 5, 5, "_file") == 0 ? task_options.erase(it)
                                                                                              : std::next(it);
    ECHELON_ASSIGN_OR_RETURN(s.task, data::CreateAdapter(j.at("task").at("name").get<std::string>(), task_options));
    ECHELON_ASSIGN_OR_RETURN(s.model, model::ModelConfig::FromJson(j.at("model"), where));
    ECHELON_ASSIGN_OR_RETURN(s.vocab, model::Vocabulary::FromJson(j.at("vocabulary"), where));
    const nlohmann::json& sp = j.at("sampling");
    s.sampling.temperature = sp.at("temperature").get<double>();
    s.sampling.top_p = sp.at("top_p").get<double>();
    s.sampling.max_new_tokens = sp.at("max_new_tokens").get<int64_t>();
    s.vocab.SetStops(&s.sampling);
    s.seed = j.at("seed").get<uint64_t>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + " is malformed: " + e.what());
  }
}

}  // namespace echelon::cli
