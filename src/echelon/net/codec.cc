#include "echelon/net/codec.h"

namespace echelon::net {

void EncodeRollout(const rollout::GroupRollout& in, const std::string& actor_id, v1::SubmitRequest* out) {
  out->set_actor_id(actor_id);
  out->set_group_id(in.group_id);
  out->set_lease_id(in.lease_id);
  out->set_behavior_version(in.behavior_version);
  out->set_generate_seconds(in.generate_seconds);
  for (const data::Episode& e : in.episodes) {
    v1::Episode* pe = out->add_episodes();
    pe->set_reward(e.reward);
    pe->set_success(e.success);
    for (const data::Turn& t : e.turns) {
      v1::Turn* pt = pe->add_turns();
      pt->mutable_prompt_ids()->Add(t.prompt_ids.begin(), t.prompt_ids.end());
      pt->mutable_tokens()->Add(t.tokens.begin(), t.tokens.end());
      pt->mutable_logprobs()->Add(t.logprobs.begin(), t.logprobs.end());
      pt->set_text(t.text);
    }
  }
}

rollout::GroupRollout DecodeRollout(const v1::SubmitRequest& in, const std::string& actor) {
  rollout::GroupRollout g;
  g.group_id = in.group_id();
  g.lease_id = in.lease_id();
  g.behavior_version = in.behavior_version();
  g.generate_seconds = in.generate_seconds();
  g.actor = actor;
  g.episodes.reserve(in.episodes_size());
  for (const v1::Episode& pe : in.episodes()) {
    data::Episode e;
    e.reward = pe.reward();
    e.success = pe.success();
    for (const v1::Turn& pt : pe.turns()) {
      data::Turn t;
      t.prompt_ids.assign(pt.prompt_ids().begin(), pt.prompt_ids().end());
      t.tokens.assign(pt.tokens().begin(), pt.tokens().end());
      t.logprobs.assign(pt.logprobs().begin(), pt.logprobs().end());
      t.text = pt.text();
      e.turns.push_back(std::move(t));
    }
    g.episodes.push_back(std::move(e));
  }
  return g;
}

}  // namespace echelon::net
