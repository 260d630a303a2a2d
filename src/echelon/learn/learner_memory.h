// The learner's memory per rank, from the model's shapes alone: what Learner holds for a model,
// precision, shard mode, rank count and micro-batch, so a user can tell before renting which
// learner set-ups fit a GPU (`echelon plan --learner-memory`).
//
// Weights, gradients and AdamW state follow the code as built (learn/learner.cc,
// learn/layer_units.cc), tensor for tensor:
// - shard none / optimizer: fp32 master weights and their fp32 gradients (4 + 4 bytes per
//   parameter); bf16 adds the compute copy and its gradients (2 + 2); AdamW keeps two fp32
//   moments (8), on every rank or, with `optimizer`, about 1/N of them each.
// - LoRA: the frozen base in the compute dtype (2 or 4 bytes per parameter), and for the
//   adapters alone fp32 weights, gradients and moments (16 bytes per adapter parameter).
// - shard params (N > 1): every unit's fp32 shard, its gradient and moments (16 bytes per
//   parameter / N, each unit padded to a multiple of N), plus the most that is gathered at once:
//   in a layer's backward the outer unit's and the layer's weights (compute dtype), the
//   layer's gradients as autograd gives them (compute dtype) and as one fp32 buffer, and the
//   head's gradients (final norm, and lm_head unless tied; computed first, reduce-scattered at
//   the end of the micro-batch).
// `Learner::PeakTrainingStateBytes` measures the same quantity at run time; learner_memory_test
// checks the two agree within 15% (they agree exactly on the configurations tested).
//
// Activations are an estimate from the shapes: the tensors one micro-batch's forward keeps for
// its backward (every layer's, or with checkpointing each layer's input plus one layer's), all
// linear in the tokens: attention runs in tiles and keeps its output and one log-sum-exp per
// query and head (model/attention.h), and the log-probs come from the final hidden states in
// chunks (model/token_logprobs.h), so nothing is tokens x tokens or tokens x vocab. On top, the
// largest transient of the step: one tile of attention scores and its gradients, or one chunk
// of logits with the head's fp32 gradient. bench/long_sequence.sh checks the estimate against
// the measured peak resident set on the CPU.
//
// The behaviour verifier (learn/behaviour_verifier.h) lives in the host memory of rank 0, beside
// the training state: the newest snapshot (the publisher's, shared) and the older ones of the
// staleness window, in RAM up to rollout.verify_memory_mb and the rest memory-mapped files, one
// of which is mapped while a check of its version runs. Its model holds no weights of its own (its parameters
// view the checked snapshot), except under LoRA: a copy of the base with the adapters.
// EstimateVerifierMemory counts them; tests/verifier_memory_test.sh checks the difference
// between all snapshots in RAM and the older ones on disk against the peak resident set of two
// runs.
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/learn/learner.h"
#include "echelon/model/model_config.h"

namespace echelon::learn {

struct LearnerSetup {
  int64_t ranks = 1;
  Precision precision = Precision::kBf16;
  Shard shard = Shard::kNone;
  bool activation_checkpointing = false;  // implied by Shard::kParams over several ranks
  int64_t micro_batch_tokens = 4096;      // tokens of one forward/backward
  bool kl_reference = false;              // the KL term (kl_coef > 0): a frozen copy, sharded under params; LoRA needs none
  // LoRA adapters (learner.lora): the base frozen in the compute dtype, only the adapters
  // fp32 with gradients and AdamW state (shard none or optimizer).
  model::LoraConfig lora;
};

struct LearnerMemory {
  double weights = 0, gradients = 0, optimizer = 0;  // held between updates, bytes per rank
  double gathered = 0;     // Shard::kParams: the most gathered weights and unreduced gradients at once
  double reference = 0;    // the KL reference: a copy, or this rank's shards of it
  double activations = 0;  // estimate (see above), the step's largest transient included
  double state() const { return weights + gradients + optimizer + gathered; }
  double total() const { return state() + reference + activations; }
};

LearnerMemory EstimateLearnerMemory(const model::ModelConfig& model, const LearnerSetup& setup);

// The peak resident set (bytes) of rank `rank` during `phase` of a run on the CPU ("set-up",
// "updates", "publication", "checkpoint save", "resume"; learn/learner_memory_probe.h), with
// `runtime_mb` the rank's resident set before any model (the runtime's own).
double EstimateHostPeak(const model::ModelConfig& model, const LearnerSetup& setup, const std::string& phase, int rank,
                        double runtime_mb);

struct VerifierMemory {
  double model = 0;     // LoRA: the model's own fp32 copy (base and adapters); else none
  double base = 0;      // LoRA: the frozen base snapshot, held once
  double newest = 0;    // the newest snapshot (shared with the publisher)
  double older = 0;     // older snapshots of the window kept in RAM
  double mapped = 0;    // a snapshot from disk while its check runs (its pages resident once read)
  double on_disk = 0;   // older snapshots written to RUN_DIR/verifier and memory-mapped when checked
  double ram() const { return model + base + newest + older + mapped; }
};

// `window`: rl.staleness (the snapshots kept besides the newest; rl.staleness_max under auto);
// `memory_bytes`: rollout.verify_memory_mb in bytes, or < 0 for every snapshot in RAM.
// Snapshots hold the storage weights in fp32 (the adapters alone under LoRA).
VerifierMemory EstimateVerifierMemory(const model::ModelConfig& model, int64_t window, double memory_bytes);
// Parameters of `lora`'s adapters on `model` (rank x (in + out) per adapted projection).
int64_t LoraParameters(const model::ModelConfig& model, const model::LoraConfig& lora);

// One line per set-up: ranks, precision, shard, checkpointing, LoRA rank, micro-batch tokens, the
// terms in GiB and whether the total fits `gpu_gib` with `headroom` (fraction kept free for the
// allocator and CUDA context).
// One line: the verifier's terms in GiB for `window` and `memory_bytes`.
std::string VerifierMemoryLine(const model::ModelConfig& model, int64_t window, double memory_bytes);

std::string LearnerMemoryTable(const model::ModelConfig& model, const std::vector<LearnerSetup>& setups,
                               const std::vector<std::pair<std::string, double>>& gpus, double headroom = 0.1);

}  // namespace echelon::learn
