#include "echelon/sched/pipeline_formation.h"

#include <algorithm>
#include <set>

namespace echelon::sched {

StageMembers ChooseStageMembers(int stages, const std::vector<std::string>& previous,
                                const std::vector<StageCandidate>& candidates) {
  const size_t n = stages > 0 ? static_cast<size_t>(stages) : 0;
  // The earliest registration of each stage, and who is still registered.
  std::vector<const StageCandidate*> first(n, nullptr);
  std::set<std::string> registered;
  for (const StageCandidate& c : candidates) {
    if (c.stage < 0 || static_cast<size_t>(c.stage) >= n) continue;
    registered.insert(c.id);
    const StageCandidate*& f = first[static_cast<size_t>(c.stage)];
    if (f == nullptr || c.registered_at < f->registered_at || (c.registered_at == f->registered_at && c.id < f->id))
      f = &c;
  }
  StageMembers out;
  out.active.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const bool stays = i < previous.size() && !previous[i].empty() && registered.count(previous[i]) != 0;
    out.active[i] = stays ? previous[i] : (first[i] != nullptr ? first[i]->id : "");
  }
  out.changed = out.active != previous;
  out.complete = n > 0 && std::none_of(out.active.begin(), out.active.end(),
                                        [](const std::string& id) { return id.empty(); });
  if (!out.changed || previous.empty() || previous[0].empty() || out.active.empty() || out.active[0] != previous[0])
    return out;
  for (size_t i = 1; i < n && i < previous.size(); ++i) {
    if (!previous[i].empty() && out.active[i] != previous[i]) {
      out.reissue_head = previous[0];
      break;
    }
  }
  return out;
}

}  // namespace echelon::sched
