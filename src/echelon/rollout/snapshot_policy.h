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

// What a running Sample call tells its actor between decoding steps (the builtin backend calls
// it; a backend that cannot, such as an HTTP inference server, never does).
class SampleObserver {
 public:
  virtual ~SampleObserver() = default;
  // `tokens` more tokens were generated (one per row that drew one).
  virtual void Generated(int64_t tokens) = 0;
  // Partial rollouts (rollout.partial): whether a snapshot newer than the policy's waits. The
  // policy then stops decoding, calls Update, and continues its unfinished samples on the new
  // weights, each token recording the version that drew it (data::Turn::versions).
  virtual bool NewerSnapshot() { return false; }
  // Loads the newer snapshot into the policy (through LoadSnapshot); false when it could not
  // (the samples then finish on the weights they have).
  virtual bool Update() { return false; }
};

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
  // Told about every Sample call from now on (nullptr: none); not owned.
  void set_observer(SampleObserver* observer) { observer_ = observer; }

 protected:
  SampleObserver* observer_ = nullptr;
};

}  // namespace echelon::rollout
