#include "echelon/learn/learner_memory_probe.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "echelon/learn/run_checkpoint.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/model/vocabulary.h"

namespace echelon::learn {
namespace {

// Two sequences of micro_batch_tokens per rank (a prompt of 8, the rest completion), random ids,
// rewards 0 and 1 so every sequence has an advantage: each micro-batch is one whole sequence (what
// the estimate assumes), two per rank.
std::vector<LearnerGroup> SyntheticGroups(const model::ModelConfig& c, const LearnerSetup& s, int64_t version,
                                          at::Generator& gen) {
  const int64_t length = s.micro_batch_tokens, prompt = 8;
  std::vector<LearnerGroup> groups(static_cast<size_t>(s.ranks));
  for (LearnerGroup& g : groups) {
    g.behavior_version = version;
    for (int e = 0; e < 2; ++e) {
      const at::Tensor ids = at::randint(1, c.vocab_size, {length}, gen, at::kLong);
      const int64_t* p = ids.data_ptr<int64_t>();
      data::Episode ep;
      ep.reward = e;
      ep.turns.push_back({std::vector<int64_t>(p, p + prompt), std::vector<int64_t>(p + prompt, p + length),
                          std::vector<float>(static_cast<size_t>(length - prompt),
                                             -static_cast<float>(std::log(static_cast<double>(c.vocab_size)))),
                          ""});
      g.episodes.push_back(std::move(ep));
    }
  }
  return groups;
}

LearnerOptions OptionsFor(const LearnerSetup& s) {
  LearnerOptions o;
  o.lr = 1e-5;
  o.precision = s.precision;
  o.shard = s.shard;
  o.activation_checkpointing = s.activation_checkpointing;
  o.micro_batch_tokens = s.micro_batch_tokens;
  return o;
}

// Rank 0's end of a group of `world` ranks; the workers are started once it listens.
Result<std::unique_ptr<LearnerRanks>> Connect(const MemoryProbeOptions& o) {
  RankGroupOptions r;
  r.world = static_cast<int>(o.setup.ranks);
  r.timeout_seconds = 600;
  r.on_listening = [&o, world = r.world](int port) { return o.start_workers(port, world); };
  ECHELON_ASSIGN_OR_RETURN(std::unique_ptr<RankGroup> group, RankGroup::Connect(r));
  return std::make_unique<LearnerRanks>(std::move(group));
}

}  // namespace

Result<std::vector<PhaseMemory>> MeasureLearnerMemory(const model::ModelConfig& config, const MemoryProbeOptions& o,
                                                      std::ostream& progress) {
  if (o.setup.ranks < 1 || o.setup.micro_batch_tokens < 32 || o.updates < 1)
    return InvalidArgument("memory probe: needs ranks >= 1, tokens >= 32 and updates >= 1");
  if (o.setup.ranks > 1 && !o.start_workers) return InvalidArgument("memory probe: several ranks need start_workers");
  if (o.setup.kl_reference) return InvalidArgument("memory probe: the KL reference is not measured");
  const LearnerOptions options = OptionsFor(o.setup);
  const double runtime_mb = TakeOwnMemory().start_mb;  // the runtime's own, before any model
  std::vector<PhaseMemory> phases;
  std::unique_ptr<LearnerRanks> ranks;
  const auto reading = [&](const char* phase) -> Status {
    PhaseMemory p{phase, {}, {}};
    if (ranks) {
      ECHELON_ASSIGN_OR_RETURN(p.measured, ranks->TakeRankMemory());
    } else {
      p.measured = {TakeOwnMemory()};
    }
    for (size_t r = 0; r < p.measured.size(); ++r)
      p.estimate_mb.push_back(
          EstimateHostPeak(config, o.setup, phase, static_cast<int>(r),
                           r == 0 ? runtime_mb : p.measured[r].start_mb) / 1048576.0);
    progress << "memory probe: " << phase << " done; rank 0 peak " << static_cast<int64_t>(p.measured[0].peak_mb)
             << " MiB" << std::endl;
    phases.push_back(std::move(p));
    return Status::Ok();
  };

  const auto stop_workers = [&] {  // they leave on rank 0's stop; the next phase starts fresh ones
    if (!ranks) return;
    ranks->Stop();
    ranks.reset();
    o.wait_workers();
  };
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const std::string ckpt_dir = (std::filesystem::path(o.dir) / "checkpoints").string();
  const model::Vocabulary vocab = model::Vocabulary::Characters("0123456789");
  {
    model::Qwen3Model m(config);
    m->InitWeights(o.seed);
    if (o.setup.lora.on()) {
      ECHELON_ASSIGN_OR_RETURN(m, model::WithLora(m, o.setup.lora, o.seed));
    }
    if (o.setup.ranks > 1) {
      ECHELON_ASSIGN_OR_RETURN(ranks, Connect(o));
    }
    Learner learner(m, options, ranks ? ranks->group() : nullptr);
    m = model::Qwen3Model(nullptr);  // the learner's now
    if (ranks) ECHELON_RETURN_IF_ERROR(ranks->Setup(learner, {}));
    ECHELON_RETURN_IF_ERROR(reading("set-up"));

    for (int64_t u = 0; u < o.updates; ++u) {
      const std::vector<LearnerGroup> groups = SyntheticGroups(config, o.setup, learner.version(), gen);
      if (ranks) ECHELON_RETURN_IF_ERROR(ranks->SendStep(groups, options.lr));
      ECHELON_RETURN_IF_ERROR(learner.Step(groups).status().WithContext("memory probe: update"));
    }
    ECHELON_RETURN_IF_ERROR(reading("updates"));

    if (learner.parameters_sharded()) {  // gathered unit by unit into the snapshot (learner_run.cc)
      ECHELON_RETURN_IF_ERROR(ranks->WeightsBytes(learner, model::StorageDtype(config)).status());
    } else {  // what SnapshotPublisher::Publish makes (a LoRA run's base once, then the adapters)
      std::shared_ptr<const std::string> base;
      if (o.setup.lora.on()) {
        ECHELON_ASSIGN_OR_RETURN(base, MakeBase(learner.model()));
      }
      ECHELON_RETURN_IF_ERROR(MakeSnapshot(learner.model(), learner.version(), base).status());
    }
    ECHELON_RETURN_IF_ERROR(reading("publication"));

    {  // as the run saves one (learner_run.cc)
      model::CheckpointFiles gathered;
      std::filesystem::create_directories(ckpt_dir);
      if (ranks) {
        ECHELON_ASSIGN_OR_RETURN(gathered, GatherCheckpointFiles(*ranks, learner, ckpt_dir));
      }
      RunState state;
      state.version = learner.version();
      state.dispatcher.version = learner.version();
      state.rng_state_hex = CaptureRngState();
      ECHELON_RETURN_IF_ERROR(
          SaveRunCheckpoint(ckpt_dir, learner, vocab, state, 1, std::move(gathered)));
    }
    ECHELON_RETURN_IF_ERROR(reading("checkpoint save"));
    stop_workers();
  }

  // The resume: fresh workers, rank 0 from the checkpoint alone (its peak started over).
  TakeOwnMemory();
  {
    std::vector<std::string> skipped;
    // As a run resumes: rank 0 of sharded parameters maps the checkpoint (learner_run.cc).
    const bool mapped = o.setup.shard == Shard::kParams && o.setup.ranks > 1;
    Result<ResumePoint> loaded = LoadNewestRunCheckpoint(ckpt_dir, &skipped, mapped);
    if (!loaded.ok()) {
      std::string why = loaded.status().message();
      for (const std::string& s : skipped) why += "; skipped " + s;
      return DataLoss("memory probe: " + why);
    }
    ResumePoint point = std::move(loaded).value();
    if (o.setup.ranks > 1) {
      ECHELON_ASSIGN_OR_RETURN(ranks, Connect(o));
    }
    Learner learner(point.checkpoint.model, options, ranks ? ranks->group() : nullptr);
    point.checkpoint.model = model::Qwen3Model(nullptr);
    ECHELON_RETURN_IF_ERROR(learner.Restore(point.state.version, point.optimizer, {}));
    if (ranks) ECHELON_RETURN_IF_ERROR(ranks->Setup(learner, point.optimizer));
    point.optimizer.clear();
    ECHELON_RETURN_IF_ERROR(reading("resume"));
    stop_workers();
  }
  return phases;
}

std::string MeasuredMemoryTable(const std::vector<PhaseMemory>& phases, const model::ModelConfig& model,
                                const LearnerSetup& setup) {
  std::string out = "phase            rank  start MiB  peak MiB  estimate MiB  error\n";
  char line[160];
  std::vector<double> whole, whole_estimate;
  for (const PhaseMemory& p : phases) {
    for (size_t r = 0; r < p.measured.size(); ++r) {
      const RankMemory& m = p.measured[r];
      const double e = p.estimate_mb[r];
      std::snprintf(line, sizeof line, "%-16s %4zu %10.0f %9.0f %13.0f %+6.1f%%\n", p.phase.c_str(), r, m.start_mb,
                    m.peak_mb, e, 100.0 * (e - m.peak_mb) / m.peak_mb);
      out += line;
      if (whole.size() <= r) whole.resize(r + 1, 0), whole_estimate.resize(r + 1, 0);
      whole[r] = std::max(whole[r], m.peak_mb);
      whole_estimate[r] = std::max(whole_estimate[r], e);
    }
  }
  for (size_t r = 0; r < whole.size(); ++r) {
    std::snprintf(line, sizeof line, "%-16s %4zu %10s %9.0f %13.0f %+6.1f%%\n", "whole run", r, "", whole[r],
                  whole_estimate[r], 100.0 * (whole_estimate[r] - whole[r]) / whole[r]);
    out += line;
  }
  // One rank's state (weights, gradients, AdamW) and the AdamW state alone, whole.
  LearnerSetup one = setup;
  one.ranks = 1;
  one.shard = Shard::kNone;
  const LearnerMemory m = EstimateLearnerMemory(model, one);
  const double n = static_cast<double>(std::max<int64_t>(1, setup.ranks)), mib = 1048576.0;
  const double per_rank = (m.weights + m.gradients + m.optimizer) / n / mib, adamw = m.optimizer / mib;
  std::snprintf(line, sizeof line, "state/N %.0f MiB (one rank's weights, gradients and AdamW state over %.0f); "
                "the whole AdamW state %.0f MiB\n", per_rank, n, adamw);
  out += line;
  for (size_t r = 0; r < whole.size(); ++r) {
    const double above = whole[r] - phases.front().measured[r].start_mb;
    std::snprintf(line, sizeof line, "rank %zu: whole-run peak = runtime %.0f + %.2f x state/N; %s the whole AdamW state\n",
                  r, phases.front().measured[r].start_mb, above / per_rank, above >= adamw ? "reached" : "below");
    out += line;
  }
  return out;
}

}  // namespace echelon::learn
