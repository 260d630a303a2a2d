// BehaviourVerifier: checks that a group's behaviour log-probs are what the policy version it
// claims gives, by recomputing them (the idea of INTELLECT-2's TOPLOC, paid for in learner
// forward passes instead of proofs). It keeps the snapshots of the last versions a group may
// claim; for a fraction of groups, drawn by a keyed hash the actors cannot predict, and for
// every group of an actor already caught forging, it recomputes the log-prob of each completion
// token under the claimed version (each token's own, with partial rollouts) and refuses the group (`logprob_mismatch`) when the mean
// absolute difference exceeds the tolerance, or one token's exceeds the token tolerance (a
// sparse lie: one token claimed 20 nats low hides under a group mean over 1,000 tokens). That
// catches a worker that lies about its version, samples from other weights, or makes its
// log-probs up.
// With `draws` (single-turn tasks, whose groups are sampled with their group seed), it also
// checks that every token is the draw the seed gives: model/generate.h draws the token at
// completion position t of sample j at the uniform DrawUniform(GroupSeed(secret, group), j, t)
// from the filtered probabilities, so the verifier recomputes those probabilities by teacher
// forcing and refuses the group (`sample_not_drawn`) when a token misses its draw by more than
// `draw_tolerance` of probability mass. That catches a worker that samples many completions and
// submits the ones it likes, teacher-forces text of its own or biases its sampler, all of which
// the log-probs alone let through. A token within the tolerance but not the exact draw (another
// engine's rounding at a near-tie) passes and is counted (VerifyStats::near_ties). With
// `turn_draws`, a turn the learner asked for itself (a multi-turn group it played for the
// actor: data::Turn::draw_seed and draw_row, the seed and row of that Sample call) is checked
// the same way, whatever the task.
//
//   BehaviourVerifier v(model_config, {.fraction = 0.1, .tolerance = 0.02, .window = S,
//                                      .sampling = rollout_sampling, .secret = run_secret});
//   v.Remember(snapshot);                          // every published snapshot
//   ECHELON_ASSIGN_OR_RETURN(std::string why, v.Check(group, /*suspect=*/false));
//
// Memory: with `spill_dir`, only the newest snapshot (the one the publisher holds anyway) and
// older ones within `memory_bytes` stay in RAM; the others are written to spill_dir (owner-only
// files, deleted as they leave the window) and memory-mapped when a check needs them, so a run
// with a large staleness bound holds S snapshots on disk instead of in the learner's memory.
// The verifier's model holds no weights of its own: its parameters are views of the checked
// version's snapshot (Qwen3ModelImpl::BindStateDict), in memory or mapped, whose pages are read
// layer by layer as the forward reaches them; a mapped one only while its check runs. (Under
// LoRA the adapters are copied over a base copy: an adapter snapshot is small.)
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
#include <vector>

#include "echelon/common/run_secret.h"
#include "echelon/common/status.h"
#include "echelon/contract/transport.h"
#include "echelon/model/generate.h"
#include "echelon/model/qwen3.h"

namespace echelon::learn {

struct VerifyOptions {
  double fraction = 0.0;      // of groups checked at random (0: only suspects; 1: all)
  double tolerance = 0.02;    // largest mean |recomputed - claimed| log-prob of a group
  int64_t window = 2;         // snapshots kept: versions at most this many behind the newest (the
                              // run's largest staleness: an older group cannot enter an update)
  model::SamplingParams sampling;  // the actors' temperature, top_k, top_p, min_p
  RunSecret secret;           // the run's secret (contract::GroupSeed)
  bool draws = false;         // check each token's seeded draw (see the top)
  // Check the draws of turns that carry their own (data::Turn::draw_row: the turns of a
  // multi-turn group the learner played for an actor), whatever the task.
  bool turn_draws = false;
  double draw_tolerance = 0.02;  // probability mass a token may miss its draw by
  double token_tolerance = 1.0;  // largest |recomputed - claimed| log-prob of any one token
  std::string spill_dir;      // where older snapshots go (see the top); empty: all kept in RAM
  int64_t memory_bytes = 0;   // with spill_dir: bytes of snapshots besides the newest kept in RAM
  // Router replay: a turn's routes (data::Turn::routes, checked on intake) are forced where the
  // snapshot's own router finds them within this much probability mass of its own choice
  // (model::RouteTape), as the learner trains them, so an engine's near-tie flips are no gap.
  double route_trust = 0.1;
};

struct VerifyStats {
  int64_t checked = 0;        // groups recomputed
  int64_t mismatched = 0;     // of which refused
  int64_t unverifiable = 0;   // drawn, but the claimed version is not kept (older than the window)
  double max_gap = 0;         // the largest mean gap among the groups that passed
  double max_token_gap = 0;   // the largest one token's gap among the groups that passed
  int64_t draws_checked = 0;  // tokens whose seeded draw was recomputed
  int64_t near_ties = 0;      // of which passed within draw_tolerance without being the exact draw
  int64_t draw_mismatched = 0;  // groups refused as sample_not_drawn
  int64_t resident_bytes = 0;   // snapshot bytes kept in RAM (the newest included)
  int64_t spilled_bytes = 0;    // snapshot bytes kept on disk (VerifyOptions::spill_dir)
};

class BehaviourVerifier {
 public:
  BehaviourVerifier(const model::ModelConfig& config, const VerifyOptions& options);

  // Keeps `snapshot` (and forgets versions older than the window); with spill_dir, writes the
  // older ones past memory_bytes to disk (one it cannot write, a full disk, stays in RAM, with
  // a warning).
  void Remember(const contract::Snapshot& snapshot);
  ~BehaviourVerifier();
  // "" when the group passes or is not drawn; "logprob_mismatch" when it fails. An error is the
  // learner's own (a snapshot it cannot load). `sampling`: the group's sampling when it is not
  // the actors' (an evaluation set's temperature); nullptr: VerifyOptions::sampling.
  Result<std::string> Check(const contract::GroupRollout& g, bool suspect,
                            const model::SamplingParams* sampling = nullptr);
  const model::SamplingParams& sampling() const { return options_.sampling; }
  VerifyStats stats() const;

 private:
  bool Drawn(const contract::GroupRollout& g) const;
  // Puts `version`'s weights (a kept snapshot) into model_: bound to the snapshot's bytes in
  // memory or its mapped file (no copy), or under LoRA copied over the base.
  Status Load(int64_t version);
  // Without LoRA, when model_ views a snapshot that is not in memory (a mapped file, or a string
  // just written to disk and dropped), has it view the newest instead, so that nothing but a
  // running check keeps a spilled snapshot's pages resident.
  void ViewNewestIfOnDisk();
  // The largest miss of the tokens at `positions` of `turn`, drawn as row `row` of a Sample call
  // with `seed` and `sampling` (at temperature 0: each token's probability below the most
  // likely one's), whose final hidden states `hidden` [len, H] the loaded model gave; counts
  // into stats_.
  double DrawMiss(uint64_t seed, int64_t row, const data::Turn& turn, const std::vector<int64_t>& positions,
                  const at::Tensor& hidden, const model::SamplingParams& sampling);

  const VerifyOptions options_;
  const uint64_t salt_;  // random per process: which groups are drawn is not predictable
  mutable std::mutex mu_;  // guards everything below
  model::Qwen3Model model_;
  int64_t loaded_ = -1;  // the version model_ holds
  std::shared_ptr<const std::string> loaded_base_;  // and its LoRA base (contract::Snapshot::base)
  std::string base_sha_;
  // What model_'s parameters are views of, without LoRA: the snapshot's bytes in memory (the
  // publisher's) or its MappedFile; the last one, and any before it until a bind succeeds (a
  // bind that failed part-way leaves some parameters viewing the previous one).
  std::vector<std::shared_ptr<const void>> bound_;
  // A kept version: its snapshot, whose weights are null once written to `path`.
  struct Kept {
    contract::Snapshot snapshot;
    std::string path;
  };
  std::map<int64_t, Kept> kept_;
  VerifyStats stats_;
};

}  // namespace echelon::learn
