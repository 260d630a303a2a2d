// Helpers shared by the rollout plane's unit tests (never by the library).
#pragma once

#include <string>
#include <vector>

#include "echelon/data/adapter.h"

namespace echelon::rollout {

// A single-turn task of one prompt ("1+2=", answer "3") whose every completion scores 1: a
// group is group_size samples of it, one Sample call.
class OneAnswerTask : public data::TaskAdapter {
 public:
  std::string name() const override { return "one-answer"; }
  std::string Alphabet() const override { return "0123456789+="; }
  data::Prompt TrainPrompt(uint64_t id) const override { return data::Prompt{id, "1+2=", "3"}; }
  const std::vector<data::Prompt>& HeldOut() const override { return held_out_; }
  Result<std::vector<data::Episode>> RunGroup(const data::Prompt& prompt, int group_size, data::Policy& policy,
                                              uint64_t seed) const override {
    ECHELON_ASSIGN_OR_RETURN(std::vector<data::Turn> turns,
                             policy.Sample(std::vector<data::PolicyPrompt>(group_size, prompt.text), seed));
    std::vector<data::Episode> out(turns.size());
    for (size_t i = 0; i < turns.size(); ++i) out[i].turns.push_back(turns[i]);
    return out;
  }
  Result<data::Scored> Reward(const data::Prompt&, const std::string&) const override { return data::Scored{1.0, {}}; }
  std::string Demonstration(const data::Prompt&) const override { return "3"; }
  Status ExportHeldOut(const std::string&) const override { return Status::Ok(); }

 private:
  std::vector<data::Prompt> held_out_;
};


}  // namespace echelon::rollout
