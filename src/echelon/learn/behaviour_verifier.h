// BehaviourVerifier: checks that a group's behaviour log-probs are what the policy version it
// claims gives, by recomputing them (the idea of INTELLECT-2's TOPLOC, paid for in learner
// forward passes instead of proofs). It keeps the snapshots of the last versions a group may
// claim; for a fraction of groups, drawn by a keyed hash the actors cannot predict, and for
// every group of an actor already caught forging, it recomputes the log-prob of each completion
// token under the claimed version (each token's own, with partial rollouts) and refuses the group (`logprob_mismatch`) when the mean
// absolute difference exceeds the tolerance. That catches a worker that lies about its
// version, samples from other weights, or makes its log-probs up.
//
//   BehaviourVerifier v(model_config, {.fraction = 0.1, .tolerance = 0.02, .window = S,
//                                      .temperature = 1.0});
//   v.Remember(snapshot);                          // every published snapshot
//   ECHELON_ASSIGN_OR_RETURN(std::string why, v.Check(group, /*suspect=*/false));
//
// The tolerance must cover honest differences: an actor on the learner's engine and dtype
// matches within 1e-5 (a run of the default job: 1.05e-6 at most); a bf16 inference server
// differs more. metrics.jsonl's verify_gap_max (VerifyStats::max_gap) is the largest gap that
// passed: run honest actors with rollout.verify_fraction 1 to measure it.
//
// Thread contract: Check and Remember may be called from any thread; one mutex serialises
// them (checks run one at a time on the verifier's own model copy, on the CPU).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "echelon/common/status.h"
#include "echelon/contract/transport.h"
#include "echelon/model/qwen3.h"

namespace echelon::learn {

struct VerifyOptions {
  double fraction = 0.0;      // of groups checked at random (0: only suspects; 1: all)
  double tolerance = 0.02;    // largest mean |recomputed - claimed| log-prob of a group
  int64_t window = 2;         // snapshots kept: versions at most this many behind the newest (the
                              // run's largest staleness: an older group cannot enter an update)
  double temperature = 1.0;   // the actors' sampling temperature
};

struct VerifyStats {
  int64_t checked = 0;        // groups recomputed
  int64_t mismatched = 0;     // of which refused
  int64_t unverifiable = 0;   // drawn, but the claimed version is not kept (older than the window)
  double max_gap = 0;         // the largest mean gap among the groups that passed
};

class BehaviourVerifier {
 public:
  BehaviourVerifier(const model::ModelConfig& config, const VerifyOptions& options);

  void Remember(const contract::Snapshot& snapshot);
  // "" when the group passes or is not drawn; "logprob_mismatch" when it fails. An error is the
  // learner's own (a snapshot it cannot load).
  Result<std::string> Check(const contract::GroupRollout& g, bool suspect);
  VerifyStats stats() const;

 private:
  bool Drawn(const contract::GroupRollout& g) const;
  // Puts `version`'s weights (a kept snapshot) into model_.
  Status Load(int64_t version);

  const VerifyOptions options_;
  const uint64_t salt_;  // random per process: which groups are drawn is not predictable
  mutable std::mutex mu_;  // guards everything below
  model::Qwen3Model model_;
  int64_t loaded_ = -1;  // the version model_ holds
  std::shared_ptr<const std::string> loaded_base_;  // and its LoRA base (contract::Snapshot::base)
  std::string base_sha_;
  std::map<int64_t, contract::Snapshot> snapshots_;
  VerifyStats stats_;
};

}  // namespace echelon::learn
