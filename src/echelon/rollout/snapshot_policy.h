// SnapshotPolicy: what an actor drives. A data::Policy (samples completions for the task
// adapter) that also takes the learner's weight snapshots. Backends: ModelPolicy (builtin
// LibTorch, model_policy.h) and OpenAiHttpPolicy (any OpenAI-compatible server,
// openai_http_policy.h).
//
// Thread contract: owned by one actor thread; every method on that thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // What that step drew: sample `samples[i]` (its index among the call's prompts) drew
  // `tokens[i]` with `logprobs[i]`, under the policy's `version` (resumable groups report them).
  virtual void Drew(const std::vector<int64_t>& samples, const std::vector<int64_t>& tokens,
                    const std::vector<float>& logprobs, int64_t version) {
    (void)samples;
    (void)tokens;
    (void)logprobs;
    (void)version;
  }
  // Partial rollouts (rollout.partial): whether a snapshot newer than the policy's waits. The
  // policy then stops decoding, calls Update, and continues its unfinished samples on the new
  // weights, each token recording the version that drew it (data::Turn::versions).
  virtual bool NewerSnapshot() { return false; }
  // Loads the newer snapshot into the policy (through LoadSnapshot); false when it could not
  // (the samples then finish on the weights they have).
  virtual bool Update() { return false; }
  // The actor is stopping (a signal: a spot instance's preemption notice): the policy ends the
  // call after this step, its samples unfinished, with kCancelled.
  virtual bool Stopping() { return false; }
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
  // Whether Continue works (the builtin backend: it draws a continued sample's tokens as the
  // uninterrupted sample would have).
  virtual bool ContinuesPrefixes() const { return false; }
  // Sample as Sample does, each prompt's completion continuing from `prefixes[i]` (its tokens,
  // log-probs and versions: contract::Assignment::prefix; one per prompt) as if this call had
  // drawn them: the completion returned holds the prefix and what follows. A prefix ending in a
  // stop token or at the token limit is returned as it is.
  virtual Result<std::vector<data::Turn>> Continue(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed,
                                                   const std::vector<data::Turn>& prefixes) {
    (void)prompts;
    (void)seed;
    (void)prefixes;
    return FailedPrecondition("this backend cannot continue a sample from its prefix");
  }
  // Whether the backend samples evaluation groups (contract::Assignment::eval_version): it takes
  // another temperature for them (SetTemperature) and any snapshot it is handed, an older one too.
  virtual bool Evaluates() const { return false; }
  // The temperature of Sample calls from now on (an evaluation set's; the actor sets the run's
  // back after the group).
  virtual void SetTemperature(double temperature) { (void)temperature; }
  virtual double temperature() const { return 0.0; }
  // The version of the weights in use; -1 before the first snapshot.
  virtual int64_t version() const = 0;
  // Told about every Sample call from now on (nullptr: none); not owned.
  void set_observer(SampleObserver* observer) { observer_ = observer; }

 protected:
  SampleObserver* observer_ = nullptr;
};

}  // namespace echelon::rollout
