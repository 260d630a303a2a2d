#include "echelon/net/codec.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace echelon::net {

void EncodeRollout(const contract::GroupRollout& in, const std::string& actor_id, v1::SubmitRequest* out) {
  out->set_actor_id(actor_id);
  out->set_group_id(in.group_id);
  out->set_lease_id(in.lease_id);
  out->set_behavior_version(in.behavior_version);
  out->set_generate_seconds(in.generate_seconds);
  for (const data::Episode& e : in.episodes) {
    v1::Episode* pe = out->add_episodes();
    pe->set_reward(e.reward);
    pe->set_success(e.success);
    for (const data::Turn& t : e.turns) EncodeTurn(t, pe->add_turns());
  }
}

int FitRoutes(v1::SubmitRequest* request, size_t limit) {
  std::vector<v1::Turn*> routed;
  for (v1::Episode& e : *request->mutable_episodes())
    for (v1::Turn& t : *e.mutable_turns())
      if (t.has_routes()) routed.push_back(&t);
  std::sort(routed.begin(), routed.end(),
            [](const v1::Turn* a, const v1::Turn* b) { return a->routes().ByteSizeLong() > b->routes().ByteSizeLong(); });
  int dropped = 0;
  for (v1::Turn* t : routed) {
    if (request->ByteSizeLong() <= limit) break;
    t->clear_routes();
    ++dropped;
  }
  return dropped;
}

void EncodeTurn(const data::Turn& in, v1::Turn* out) {
  out->mutable_prompt_ids()->Add(in.prompt_ids.begin(), in.prompt_ids.end());
  out->mutable_tokens()->Add(in.tokens.begin(), in.tokens.end());
  out->mutable_logprobs()->Add(in.logprobs.begin(), in.logprobs.end());
  out->mutable_versions()->Add(in.versions.begin(), in.versions.end());
  out->set_text(in.text);
  if (!in.routes.empty()) {
    v1::Routes* r = out->mutable_routes();
    int64_t previous = 0;
    for (int32_t p : in.routes.positions) {
      // Sorted routes give steps >= 0; anything else is sent as it is and refused on intake.
      r->add_position_steps(static_cast<uint32_t>(p - previous));
      previous = p;
    }
    for (int16_t l : in.routes.layers) r->add_layers(static_cast<uint32_t>(l));
    for (int16_t e : in.routes.experts) r->add_experts(static_cast<uint32_t>(e));
  }
}

namespace {

// A decoded number past int16 (or a position past int32) becomes -1, which intake refuses.
int16_t Narrow16(uint32_t v) { return v <= 0x7fff ? static_cast<int16_t>(v) : int16_t{-1}; }

}  // namespace

data::Turn DecodeTurn(const v1::Turn& in) {
  data::Turn t;
  t.prompt_ids.assign(in.prompt_ids().begin(), in.prompt_ids().end());
  t.tokens.assign(in.tokens().begin(), in.tokens().end());
  t.logprobs.assign(in.logprobs().begin(), in.logprobs().end());
  t.versions.assign(in.versions().begin(), in.versions().end());
  t.text = in.text();
  if (in.has_routes()) {
    const v1::Routes& r = in.routes();
    int64_t position = 0;
    for (uint32_t step : r.position_steps()) {
      position = position < 0 ? position : position + step;
      t.routes.positions.push_back(position <= INT32_MAX ? static_cast<int32_t>(position) : -1);
      if (position > INT32_MAX) position = -1;
    }
    for (uint32_t l : r.layers()) t.routes.layers.push_back(Narrow16(l));
    for (uint32_t e : r.experts()) t.routes.experts.push_back(Narrow16(e));
  }
  return t;
}

void EncodePrefixPart(const contract::PrefixPart& in, v1::PrefixPart* out) {
  out->set_sample(in.sample);
  out->set_from(in.from);
  out->mutable_tokens()->Add(in.tokens.begin(), in.tokens.end());
  out->mutable_logprobs()->Add(in.logprobs.begin(), in.logprobs.end());
  out->mutable_versions()->Add(in.versions.begin(), in.versions.end());
}

contract::PrefixPart DecodePrefixPart(const v1::PrefixPart& in) {
  contract::PrefixPart p;
  p.sample = in.sample();
  p.from = in.from();
  p.tokens.assign(in.tokens().begin(), in.tokens().end());
  p.logprobs.assign(in.logprobs().begin(), in.logprobs().end());
  p.versions.assign(in.versions().begin(), in.versions().end());
  return p;
}

contract::GroupRollout DecodeRollout(const v1::SubmitRequest& in, const std::string& actor) {
  contract::GroupRollout g;
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
    for (const v1::Turn& pt : pe.turns()) e.turns.push_back(DecodeTurn(pt));
    g.episodes.push_back(std::move(e));
  }
  return g;
}

}  // namespace echelon::net
