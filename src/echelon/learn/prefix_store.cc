#include "echelon/learn/prefix_store.h"

#include <algorithm>

namespace echelon::learn {

std::vector<size_t> PrefixStore::Lengths(const Entry& e) const {
  std::vector<size_t> lengths;
  for (const data::Turn& t : e.samples) lengths.push_back(t.tokens.size());
  return lengths;
}

void PrefixStore::Truncate(Entry* e, const std::vector<size_t>& lengths) {
  e->tokens = 0;
  for (size_t j = 0; j < e->samples.size(); ++j) {
    data::Turn& t = e->samples[j];
    const size_t n = j < lengths.size() ? std::min(lengths[j], t.tokens.size()) : 0;
    t.tokens.resize(n);
    t.logprobs.resize(n);
    t.versions.resize(n);
    e->tokens += static_cast<int64_t>(n);
  }
}

PrefixStore::ReportResult PrefixStore::Report(const std::string& actor, uint64_t group, uint64_t lease,
                                              const std::vector<contract::PrefixPart>& parts,
                                              const std::function<bool()>& holds) {
  std::lock_guard<std::mutex> lock(mu_);
  // Under the lock, so that no hand-out moves the entry to a newer lease in between.
  if (!holds()) return {};
  auto it = entries_.find(group);
  if (it != entries_.end() && it->second.lease_id > lease) return {};  // an older lease's report
  // Checked on a copy, kept whole or not at all.
  Entry next;
  if (it != entries_.end() && it->second.lease_id == lease) {
    next = it->second;
  } else {  // this lease's first report: what an earlier lease left was not handed to it
    next.lease_id = lease;
    next.actor = actor;
    next.samples.resize(static_cast<size_t>(limits_.group_size));
  }
  for (const contract::PrefixPart& p : parts) {
    data::Turn& kept = next.samples[static_cast<size_t>(p.sample)];
    const auto from = static_cast<size_t>(p.from);
    if (from > kept.tokens.size()) return {};  // a gap: a report before it was lost
    if (static_cast<int64_t>(from + p.tokens.size()) > limits_.max_tokens) return {false, "too_long"};
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      const size_t at = from + i;
      if (at < kept.tokens.size()) {  // a resend (its reply was lost): must be what was kept
        if (kept.tokens[at] != p.tokens[i] || kept.logprobs[at] != p.logprobs[i] || kept.versions[at] != p.versions[i])
          return {false, "rewritten"};
        continue;
      }
      if (!kept.versions.empty() && p.versions[i] < kept.versions.back()) return {false, "bad_token_version"};
      kept.tokens.push_back(p.tokens[i]);
      kept.logprobs.push_back(p.logprobs[i]);
      kept.versions.push_back(p.versions[i]);
      ++next.tokens;
    }
  }
  const int64_t tokens = next.tokens;
  int64_t oldest = -1;
  for (const data::Turn& s : next.samples)  // versions never decrease along a sample
    if (!s.versions.empty() && (oldest < 0 || s.versions.front() < oldest)) oldest = s.versions.front();
  entries_[group] = std::move(next);
  return {true, "", tokens, oldest};
}

std::optional<PrefixStore::Handed> PrefixStore::Hand(uint64_t group, uint64_t lease, const std::string& actor,
                                                     const std::function<bool(int64_t, int64_t)>& usable) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(group);
  if (it == entries_.end()) return std::nullopt;
  Entry& e = it->second;
  int64_t oldest = -1, newest = -1;
  for (const data::Turn& t : e.samples)
    for (int64_t v : t.versions) {
      oldest = oldest < 0 ? v : std::min(oldest, v);
      newest = std::max(newest, v);
    }
  if (e.lease_id >= lease || e.tokens == 0 || !usable(oldest, newest)) {
    entries_.erase(it);
    return std::nullopt;
  }
  const std::vector<size_t> lengths = Lengths(e);
  if (e.authors.empty() || e.authors.back().second != lengths) e.authors.emplace_back(e.actor, lengths);
  e.lease_id = lease;
  e.actor = actor;
  return Handed{e.samples, e.tokens};
}

std::string PrefixStore::CheckSplice(const contract::GroupRollout& g) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(g.group_id);
  if (it == entries_.end() || it->second.lease_id != g.lease_id || it->second.authors.empty()) return "";
  const Entry& e = it->second;
  const std::vector<size_t>& handed = e.authors.back().second;
  if (g.episodes.size() != handed.size()) return "prefix_altered";
  for (size_t j = 0; j < handed.size(); ++j) {
    if (g.episodes[j].turns.empty()) return "prefix_altered";
    const data::Turn& kept = e.samples[j];
    const data::Turn& t = g.episodes[j].turns[0];
    if (t.tokens.size() < handed[j] || t.logprobs.size() < handed[j] ||
        (!t.versions.empty() && t.versions.size() < handed[j]))
      return "prefix_altered";
    for (size_t i = 0; i < handed[j]; ++i) {
      const int64_t v = t.versions.empty() ? g.behavior_version : t.versions[i];
      if (t.tokens[i] != kept.tokens[i] || t.logprobs[i] != kept.logprobs[i] || v != kept.versions[i])
        return "prefix_altered";
    }
  }
  return "";
}

bool PrefixStore::WasHanded(uint64_t group, uint64_t lease) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(group);
  return it != entries_.end() && it->second.lease_id == lease && !it->second.authors.empty();
}

std::vector<std::pair<std::string, std::vector<data::Turn>>> PrefixStore::Authors(uint64_t group,
                                                                                    uint64_t lease) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::vector<data::Turn>>> out;
  auto it = entries_.find(group);
  if (it == entries_.end() || it->second.lease_id != lease) return out;
  for (const auto& [author, lengths] : it->second.authors) {
    Entry cut = it->second;
    Truncate(&cut, lengths);
    out.emplace_back(author, std::move(cut.samples));
  }
  return out;
}

void PrefixStore::Refused(uint64_t group, uint64_t lease) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(group);
  if (it == entries_.end() || it->second.lease_id != lease) return;
  if (it->second.authors.empty()) {
    entries_.erase(it);
    return;
  }
  Truncate(&it->second, it->second.authors.back().second);
}

void PrefixStore::Erase(uint64_t group) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(group);
}

}  // namespace echelon::learn
