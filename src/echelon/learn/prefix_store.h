// PrefixStore: what the learner keeps of running single-turn groups for resumable groups
// (rollout.resume): each sample's tokens, log-probs and versions so far, as the holders of the
// group's leases reported them (contract::WorkSource::ReportPrefix), and who drew which part.
// TrajectoryIntake owns one; it checks each report's content (vocabulary, log-probs, published
// versions) before Report, and the verifier checks a resumed group when it is submitted.
//
// Per group, one entry, tied to one lease at a time:
//   - Report: a part must continue its sample from what was kept (`from` its length, or a
//     resend whose overlap equals what was kept), its versions never older than the last kept
//     one's, the sample within max_tokens. A report from a lease other than the entry's is kept
//     only from a newer lease that holds the group now (`holds`); it starts the entry afresh.
//   - Hand: a new lease of the group continues from the entry when the caller says it may
//     (`usable`: the actor continues prefixes, its snapshot is new enough, the group can still be
//     consumed); the entry then belongs to that lease, and what it was handed is remembered
//     (CheckSplice). Otherwise the entry is dropped.
//   - Refused: a submission of the entry's lease was refused: what that lease reported itself is
//     dropped (what it was handed stays, for the next holder).
//
//   PrefixStore store({group_size, vocab_size, max_new_tokens});
//   store.Report("w#1", group, lease, parts, holds);          // while the group runs
//   std::optional<PrefixStore::Handed> h = store.Hand(group, new_lease, "v#2", usable);
//   std::string why = store.CheckSplice(submission);           // "" or "prefix_altered"
//
// Thread contract: every method is safe for concurrent use (one internal mutex; `holds` and
// `usable` are called under it and must not call back into the store).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "echelon/contract/transport.h"

namespace echelon::learn {

struct PrefixLimits {
  int64_t group_size = 0;  // samples of a group
  int64_t max_tokens = 0;  // of one sample (rollout.max_new_tokens)
};

class PrefixStore {
 public:
  explicit PrefixStore(const PrefixLimits& limits) : limits_(limits) {}

  struct ReportResult {
    bool kept = false;
    std::string refusal;  // a report no honest actor sends ("rewritten", "bad_token_version", ...); "" otherwise
    int64_t tokens = 0;   // the entry's tokens once kept
    int64_t oldest = -1;  // the version of its oldest token (-1: none)
  };
  // Keeps `parts` (each part's fields already checked for content by the caller) from `actor`,
  // holder of `lease` on `group` when `holds()` says so. All of it or nothing.
  ReportResult Report(const std::string& actor, uint64_t group, uint64_t lease,
                      const std::vector<contract::PrefixPart>& parts, const std::function<bool()>& holds);

  struct Handed {
    std::vector<data::Turn> samples;  // tokens, logprobs, versions (one per token) of each sample
    int64_t tokens = 0;
  };
  // The prefix a new lease of `group` continues from, if `usable(oldest, newest)` (the versions
  // of its oldest and newest tokens) says it may; else the entry is dropped and nullopt.
  std::optional<Handed> Hand(uint64_t group, uint64_t lease, const std::string& actor,
                             const std::function<bool(int64_t oldest, int64_t newest)>& usable);
  // "" when `g` does not come from a lease that was handed a prefix, or begins with exactly that
  // prefix (tokens, log-probs, versions); else "prefix_altered".
  std::string CheckSplice(const contract::GroupRollout& g) const;
  // Whether `lease` was handed a prefix of `group` (its submission is a resumed group).
  bool WasHanded(uint64_t group, uint64_t lease) const;
  // The prefix handed to `lease` by the holders that drew it, in order: each holder and the
  // samples as far as its reports reached (cumulative). Empty when `lease` was handed none.
  std::vector<std::pair<std::string, std::vector<data::Turn>>> Authors(uint64_t group, uint64_t lease) const;
  // A submission of `lease` was refused: what it reported itself is dropped.
  void Refused(uint64_t group, uint64_t lease);
  void Erase(uint64_t group);

 private:
  struct Entry {
    uint64_t lease_id = 0;  // the lease whose reports extend it
    std::string actor;      // that lease's holder
    std::vector<data::Turn> samples;
    int64_t tokens = 0;
    // Earlier holders whose tokens it holds, each with the samples' lengths its reports reached;
    // the last one's lengths are what `lease_id` was handed.
    std::vector<std::pair<std::string, std::vector<size_t>>> authors;
  };
  std::vector<size_t> Lengths(const Entry& e) const;
  // `e` cut to `lengths`.
  static void Truncate(Entry* e, const std::vector<size_t>& lengths);

  const PrefixLimits limits_;
  mutable std::mutex mu_;  // guards entries_
  std::map<uint64_t, Entry> entries_;  // by group id
};

}  // namespace echelon::learn
