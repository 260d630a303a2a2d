// SnapshotPolicy: what an actor drives. A data::Policy (samples completions for the task
// adapter) that also takes the learner's weight snapshots. Backends: ModelPolicy (builtin
// LibTorch, model_policy.h) and OpenAiHttpPolicy (any OpenAI-compatible server,
// openai_http_policy.h).
//
// Thread contract: owned by one actor thread; every method on that thread.
#pragma once

#include <cstdint>
#include <string>

#include "echelon/common/status.h"
#include "echelon/data/adapter.h"

namespace echelon::rollout {

class SnapshotPolicy : public data::Policy {
 public:
  // Replaces the weights with a snapshot's safetensors bytes; version() becomes `version`.
  virtual Status LoadSnapshot(const std::string& safetensors_bytes, int64_t version) = 0;
  // A LoRA run (contract::Snapshot::base): loads the whole model its adapter snapshots adapt,
  // before the first of them; version() becomes -1 until LoadSnapshot.
  virtual Status LoadBase(const std::string& safetensors_bytes) {
    (void)safetensors_bytes;
    return FailedPrecondition("this backend takes no LoRA adapter snapshots (learner.lora); use the builtin one");
  }
  // The version of the weights in use; -1 before the first snapshot.
  virtual int64_t version() const = 0;
};

}  // namespace echelon::rollout
