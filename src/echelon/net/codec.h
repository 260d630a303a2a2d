// Conversions between the wire messages and the rollout plane's types. Decoding never trusts
// the actor for what the learner knows itself: the prompt of a group comes from the learner's
// task adapter by group id, not from the message.
//
// Thread contract: free functions over values.
#pragma once

#include "echelon/contract/transport.h"
#include "echelon/v1/learner.pb.h"

namespace echelon::net {

void EncodeRollout(const contract::GroupRollout& in, const std::string& actor_id, v1::SubmitRequest* out);
// Router replay's routes are optional (the learner routes a turn without them itself): while the
// request is over `limit` bytes, the largest remaining turn's routes are dropped (all of them if
// even that is too much: the tokens are never touched). Returns how many turns' routes went.
int FitRoutes(v1::SubmitRequest* request, size_t limit);
// The prompt is left empty for the caller to fill; `actor` becomes the rollout's actor.
contract::GroupRollout DecodeRollout(const v1::SubmitRequest& in, const std::string& actor);
void EncodeTurn(const data::Turn& in, v1::Turn* out);
data::Turn DecodeTurn(const v1::Turn& in);
void EncodePrefixPart(const contract::PrefixPart& in, v1::PrefixPart* out);
contract::PrefixPart DecodePrefixPart(const v1::PrefixPart& in);

}  // namespace echelon::net
