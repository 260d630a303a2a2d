#include "echelon/data/adapter_kit.h"

namespace echelon::data {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Result<std::vector<Episode>> SampleSingleTurnGroup(const Prompt& prompt, int group_size, Policy& policy, uint64_t seed) {
  if (group_size <= 0) return std::vector<Episode>();
  ECHELON_ASSIGN_OR_RETURN(std::vector<Turn> turns,
                           policy.Sample(std::vector<PolicyPrompt>(group_size, PolicyPrompt::Of(prompt)), seed));
  std::vector<Episode> episodes(turns.size());
  for (size_t i = 0; i < turns.size(); ++i) episodes[i].turns.push_back(std::move(turns[i]));
  return episodes;
}

Result<std::vector<Episode>> RunSingleTurnGroup(const TaskAdapter& task, const Prompt& prompt, int group_size,
                                                Policy& policy, uint64_t seed) {
  ECHELON_ASSIGN_OR_RETURN(std::vector<Episode> episodes, SampleSingleTurnGroup(prompt, group_size, policy, seed));
  std::vector<std::string> texts;
  for (const Episode& e : episodes) texts.push_back(e.turns[0].text);
  ECHELON_ASSIGN_OR_RETURN(std::vector<Scored> scored, task.RewardGroup(prompt, texts));
  for (size_t i = 0; i < episodes.size(); ++i) {
    episodes[i].reward = scored[i].reward;
    episodes[i].metrics = std::move(scored[i].metrics);
    episodes[i].success = episodes[i].reward >= 1.0;
  }
  return episodes;
}

uint64_t StableHash(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return SplitMix64(SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c) ^ d);
}

Status ForEachJsonlLine(const std::string& path, const std::string& text,
                        const std::function<Status(uint64_t, const std::string&)>& fn) {
  uint64_t line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ECHELON_RETURN_IF_ERROR(fn(line_no, line).WithContext(path + ":" + std::to_string(line_no)));
  }
  return Status::Ok();
}

}  // namespace echelon::data
