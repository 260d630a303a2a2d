#include "echelon/learn/behaviour_verifier.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include "echelon/common/fs.h"
#include "echelon/common/mapped_file.h"
#include "echelon/contract/group_seed.h"
#include "echelon/learn/learner.h"
#include "echelon/model/snapshot_weights.h"
#include "echelon/model/token_logprobs.h"

namespace echelon::learn {
namespace {

namespace fs = std::filesystem;

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t RandomSalt() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

BehaviourVerifier::BehaviourVerifier(const model::ModelConfig& config, const VerifyOptions& options)
    : options_(options), salt_(RandomSalt()), model_(config) {
  model_->eval();
  for (auto& p : model_->parameters()) p.requires_grad_(false);
}

BehaviourVerifier::~BehaviourVerifier() {
  std::error_code ec;
  for (const auto& [version, k] : kept_)
    if (!k.path.empty()) fs::remove(k.path, ec);
}

void BehaviourVerifier::Remember(const contract::Snapshot& snapshot) {
  if (!snapshot.weights) return;
  std::lock_guard<std::mutex> lock(mu_);
  kept_[snapshot.version] = Kept{snapshot, ""};
  const int64_t oldest = kept_.rbegin()->first - std::max<int64_t>(options_.window, 0);
  std::error_code ec;
  while (kept_.begin()->first < oldest) {
    if (!kept_.begin()->second.path.empty()) fs::remove(kept_.begin()->second.path, ec);
    kept_.erase(kept_.begin());
  }
  // Newest first: the newest stays (the publisher holds it), the next ones while they fit
  // memory_bytes, and the rest go to disk.
  int64_t resident = 0, held = 0, spilled = 0;
  for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
    Kept& k = it->second;
    if (!k.snapshot.weights) {
      spilled += static_cast<int64_t>(fs::file_size(k.path, ec));
      continue;
    }
    const int64_t bytes = static_cast<int64_t>(k.snapshot.weights->size());
    if (options_.spill_dir.empty() || it == kept_.rbegin() || held + bytes <= options_.memory_bytes) {
      if (it != kept_.rbegin()) held += bytes;
      resident += bytes;
      continue;
    }
    const std::string path = (fs::path(options_.spill_dir) / ("v" + std::to_string(it->first) + ".safetensors")).string();
    if (Status st = WriteFileAtomic(path, *k.snapshot.weights, 0600); !st.ok()) {
      spdlog::warn("the verifier keeps snapshot v{} in memory: {}", it->first, st.message());
      resident += bytes;
      continue;
    }
    k.path = path;
    k.snapshot.weights.reset();
    spilled += bytes;
  }
  stats_.resident_bytes = resident;
  stats_.spilled_bytes = spilled;
  ViewNewestIfOnDisk();  // the string of a snapshot just written to disk is freed
}

void BehaviourVerifier::ViewNewestIfOnDisk() {
  if (model_->config().lora.on() || loaded_ < 0) return;
  auto it = kept_.find(loaded_);
  if (it != kept_.end() && it->second.snapshot.weights) return;
  if (Status st = Load(kept_.rbegin()->first); !st.ok())
    spdlog::warn("the verifier's model could not view the newest snapshot: {}", st.message());
}

bool BehaviourVerifier::Drawn(const contract::GroupRollout& g) const {
  if (options_.fraction <= 0) return false;
  if (options_.fraction >= 1) return true;
  const uint64_t h = Mix(salt_ ^ Mix(g.group_id ^ Mix(g.lease_id)));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < options_.fraction;
}

Status BehaviourVerifier::Load(int64_t version) {
  const Kept& kept = kept_.at(version);
  const contract::Snapshot& snap = kept.snapshot;
  if (loaded_ == version && snap.base == loaded_base_) return Status::Ok();
  const std::string where = "snapshot v" + std::to_string(version) + " (verifier)";
  loaded_ = -1;
  if (!model_->config().lora.on()) {
    std::shared_ptr<const void> holder;
    std::string_view bytes;
    if (snap.weights) {
      holder = snap.weights;
      bytes = *snap.weights;
    } else {
      ECHELON_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(kept.path));
      auto mapped = std::make_shared<MappedFile>(std::move(file));
      bytes = mapped->bytes();
      holder = std::move(mapped);
    }
    const std::string source = snap.weights ? where : where + ", " + kept.path;
    ECHELON_ASSIGN_OR_RETURN(model::SafetensorsFile f, model::ViewSafetensors(bytes, source));
    if (!model::AdapterBase(f).empty()) return FailedPrecondition(source + ": LoRA adapters, but this run has no LoRA");
    bound_.push_back(std::move(holder));
    ECHELON_RETURN_IF_ERROR(model_->BindStateDict(f.tensors, source));
    bound_.erase(bound_.begin(), bound_.end() - 1);  // no parameter views an older one now
    loaded_ = version;
    return Status::Ok();
  }
  if (snap.base && snap.base != loaded_base_) {
    ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, *snap.base, &base_sha_, where + " base"));
    loaded_base_ = snap.base;
  }
  if (snap.weights) {
    ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, *snap.weights, &base_sha_, where));
  } else {
    ECHELON_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(kept.path));
    ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, file.bytes(), &base_sha_, where + ", " + kept.path));
  }
  loaded_ = version;
  return Status::Ok();
}

Result<std::string> BehaviourVerifier::Check(const contract::GroupRollout& g, bool suspect,
                                             const model::SamplingParams* sampling_override) {
  if (!suspect && !Drawn(g)) return std::string();
  const model::SamplingParams& sampling = sampling_override != nullptr ? *sampling_override : options_.sampling;
  std::lock_guard<std::mutex> lock(mu_);
  // Every version the tokens claim (partial rollouts: data::Turn::versions), each recomputed
  // under its own snapshot.
  std::set<int64_t> versions = {g.behavior_version};
  for (const data::Episode& e : g.episodes)
    for (const data::Turn& t : e.turns) versions.insert(t.versions.begin(), t.versions.end());
  for (int64_t v : versions) {
    if (kept_.count(v) > 0) continue;
    ++stats_.unverifiable;
    return std::string();
  }
  at::NoGradGuard no_grad;
  struct Unmap {  // however the check ends, a snapshot from disk stays mapped no longer
    BehaviourVerifier* v;
    ~Unmap() { v->ViewNewestIfOnDisk(); }
  } unmap{this};
  double sum = 0;
  double token_gap = 0;  // the largest of any one token's
  int64_t n = 0;
  double miss = 0;  // the largest of any token's draw (options_.draws)
  // Greedy decoding (temperature 0) reports log-probs at temperature 1 (model/generate.h).
  const double lp_temperature = sampling.temperature > 0 ? sampling.temperature : 1.0;
  try {
    for (int64_t v : versions) {
      ECHELON_RETURN_IF_ERROR(Load(v));
      for (size_t j = 0; j < g.episodes.size(); ++j)
        for (const data::Turn& t : g.episodes[j].turns) {
          // The positions of this turn's tokens that `v` drew.
          std::vector<int64_t> mine;
          for (size_t i = 0; i < t.tokens.size(); ++i)
            if ((t.versions.empty() ? g.behavior_version : t.versions[i]) == v) mine.push_back(static_cast<int64_t>(i));
          if (mine.empty()) continue;
          std::vector<int64_t> seq(t.prompt_ids);
          seq.insert(seq.end(), t.tokens.begin(), t.tokens.end());
          const int64_t len = static_cast<int64_t>(seq.size()) - 1;
          const at::Tensor all = at::tensor(seq, at::kLong).unsqueeze(0);
          const at::Tensor input = all.slice(1, 0, len), target = all.slice(1, 1, len + 1);
          const at::Tensor positions = at::arange(len, at::kLong).unsqueeze(0);
          at::Tensor hidden;
          if (t.routes.empty()) {
            hidden = model_->Hidden(input, positions, at::Tensor());
          } else {  // router replay: the turn's routes, where this snapshot trusts them
            model::RouteTape tape = model::ForcingTape({&t.routes}, model_->config().num_hidden_layers,
                                                       options_.route_trust, [](size_t, int64_t p) { return p; });
            const model::RouteTapeScope armed(model_, &tape);
            hidden = model_->Hidden(input, positions, at::Tensor());
          }
          const at::Tensor lp = model::TokenLogProbs(hidden, model_->head(), target, lp_temperature)
                                    .squeeze(0)
                                    .slice(0, static_cast<int64_t>(t.prompt_ids.size()) - 1, len);
          if (options_.turn_draws && t.draw_row >= 0) {
            miss = std::max(miss, DrawMiss(t.draw_seed, t.draw_row, t, mine, hidden[0], sampling));
          } else if (options_.draws && g.episodes[j].turns.size() == 1) {  // sample j of the group's seed
            miss = std::max(miss, DrawMiss(contract::GroupSeed(options_.secret, g.group_id), static_cast<int64_t>(j), t,
                                           mine, hidden[0], sampling));
          }
          const at::Tensor index = at::tensor(mine, at::kLong);
          const at::Tensor claimed = at::tensor(t.logprobs, at::kFloat).index_select(0, index);
          const at::Tensor gaps = (lp.index_select(0, index) - claimed).abs();
          sum += gaps.sum().item<double>();
          token_gap = std::max(token_gap, gaps.max().item<double>());
          n += static_cast<int64_t>(mine.size());
        }
    }
  } catch (const std::exception& ex) {
    return Internal(std::string("behaviour verification failed: ") + ex.what());
  }
  ++stats_.checked;
  // Log-probs first: a version lie fails both checks and is named by the first; a group whose
  // log-probs are right but whose tokens were chosen fails the second alone.
  const double gap = n > 0 ? sum / static_cast<double>(n) : 0.0;
  if (!(gap <= options_.tolerance) || !(token_gap <= options_.token_tolerance)) {
    ++stats_.mismatched;
    spdlog::warn("group {} from {}: behaviour log-probs differ from version {}'s by {:.4g} on average (tolerance {}) and "
                 "by {:.4g} at most (token tolerance {})",
                 g.group_id, g.actor, g.behavior_version, gap, options_.tolerance, token_gap, options_.token_tolerance);
    return std::string("logprob_mismatch");
  }
  if (miss > options_.draw_tolerance) {
    ++stats_.draw_mismatched;
    spdlog::warn("group {} from {}: a token is not the draw its seed gives under version {} (it misses by {:.4g} of "
                 "probability mass; tolerance {})",
                 g.group_id, g.actor, g.behavior_version, miss, options_.draw_tolerance);
    return std::string("sample_not_drawn");
  }
  stats_.max_gap = std::max(stats_.max_gap, gap);
  stats_.max_token_gap = std::max(stats_.max_token_gap, token_gap);
  return std::string();
}

double BehaviourVerifier::DrawMiss(uint64_t seed, int64_t row, const data::Turn& turn,
                                   const std::vector<int64_t>& positions, const at::Tensor& hidden,
                                   const model::SamplingParams& sampling) {
  // Logits of 64 positions at a time: 64 x V fp32 (39 MB at Qwen3's 151,936 tokens).
  constexpr size_t kChunk = 64;
  const int64_t offset = static_cast<int64_t>(turn.prompt_ids.size()) - 1;  // hidden row of completion token 0
  double worst = 0;
  for (size_t begin = 0; begin < positions.size(); begin += kChunk) {
    const size_t end = std::min(positions.size(), begin + kChunk);
    std::vector<int64_t> rows;
    for (size_t k = begin; k < end; ++k) rows.push_back(offset + positions[k]);
    const at::Tensor h = hidden.index_select(0, at::tensor(rows, at::kLong).to(hidden.device()));
    const at::Tensor logits = at::linear(h, model_->head()).to(at::kCPU, at::kFloat);
    if (sampling.temperature <= 0) {
      // Greedy decoding draws the most likely token: a token misses by how much less probable
      // it is than that one (a near-tie of another engine's rounding passes within the tolerance).
      const at::Tensor probs = at::softmax(logits, -1);
      for (size_t k = begin; k < end; ++k) {
        const at::Tensor row = probs[static_cast<int64_t>(k - begin)];
        const double gap = (row.max() - row[turn.tokens[static_cast<size_t>(positions[k])]]).item<double>();
        ++stats_.draws_checked;
        if (gap > 0 && gap <= options_.draw_tolerance) ++stats_.near_ties;
        worst = std::max(worst, gap);
      }
      continue;
    }
    const at::Tensor probs = model::SamplingProbs(logits, sampling);
    for (size_t k = begin; k < end; ++k) {
      const int64_t pos = positions[k];
      const model::DrawCheck c = model::SeededToken(probs[static_cast<int64_t>(k - begin)],
                                                    model::DrawUniform(seed, row, pos),
                                                    turn.tokens[static_cast<size_t>(pos)]);
      ++stats_.draws_checked;
      if (c.miss > 0 && c.miss <= options_.draw_tolerance) ++stats_.near_ties;
      worst = std::max(worst, c.miss);
    }
  }
  return worst;
}

VerifyStats BehaviourVerifier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace echelon::learn
