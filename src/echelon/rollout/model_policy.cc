#include "echelon/rollout/model_policy.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "echelon/model/snapshot_weights.h"

namespace echelon::rollout {

ModelPolicy::ModelPolicy(model::Qwen3Model model, model::Vocabulary vocab, model::SamplingParams params)
    : model_(std::move(model)), vocab_(std::move(vocab)), params_(std::move(params)) {
  vocab_.SetStops(&params_);
}

Result<std::vector<std::vector<int64_t>>> EncodePrompts(const model::Vocabulary& vocab,
                                                        const std::vector<data::PolicyPrompt>& prompts) {
  std::vector<std::vector<int64_t>> ids;
  for (const data::PolicyPrompt& p : prompts) {
    ECHELON_ASSIGN_OR_RETURN(std::vector<int64_t> enc, vocab.EncodePrompt(p.system, p.user));
    ids.push_back(std::move(enc));
  }
  return ids;
}

std::vector<data::Turn> ToTurns(const model::Vocabulary& vocab, std::vector<std::vector<int64_t>> ids,
                                std::vector<model::Completion> completions) {
  std::vector<data::Turn> turns(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    turns[i].prompt_ids = std::move(ids[i]);
    turns[i].text = vocab.DecodeCompletion(completions[i].tokens);
    turns[i].tokens = std::move(completions[i].tokens);
    turns[i].logprobs = std::move(completions[i].logprobs);
    turns[i].routes = std::move(completions[i].routes);
  }
  return turns;
}

Result<std::vector<data::Turn>> ModelPolicy::Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) {
  return SampleFrom(prompts, seed, {});
}

Result<std::vector<data::Turn>> ModelPolicy::Continue(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed,
                                                      const std::vector<data::Turn>& prefixes) {
  if (prefixes.size() != prompts.size())
    return InvalidArgument("continuing " + std::to_string(prompts.size()) + " prompts from " +
                           std::to_string(prefixes.size()) + " prefixes");
  return SampleFrom(prompts, seed, prefixes);
}

Result<std::vector<data::Turn>> ModelPolicy::SampleFrom(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed,
                                                        const std::vector<data::Turn>& prefixes) {
  ECHELON_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> ids, EncodePrompts(vocab_, prompts));
  at::NoGradGuard no_grad;
  model_->eval();
  std::vector<model::Completion> out(ids.size());
  std::vector<std::vector<int64_t>> versions(ids.size());  // of each drawn token
  std::vector<size_t> running;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (!prefixes.empty()) {
      const data::Turn& p = prefixes[r];
      if (p.logprobs.size() != p.tokens.size() || p.versions.size() != p.tokens.size())
        return InvalidArgument("prefix " + std::to_string(r) + " does not hold one log-prob and version a token");
      if (!p.versions.empty() && p.versions.back() > version_)
        return FailedPrecondition("prefix " + std::to_string(r) + " was drawn by v" + std::to_string(p.versions.back()) +
                                  ", newer than this policy's v" + std::to_string(version_));
      out[r].tokens = p.tokens;
      out[r].logprobs = p.logprobs;
      versions[r] = p.versions;
      const std::vector<int64_t>& stops = params_.stop_token_ids;
      out[r].finished_eos = !p.tokens.empty() && (p.tokens.back() == params_.eos_token_id ||
                                                  std::find(stops.begin(), stops.end(), p.tokens.back()) != stops.end());
      if (out[r].finished_eos || static_cast<int64_t>(p.tokens.size()) >= params_.max_new_tokens) continue;
    }
    running.push_back(r);
  }
  // Versions are reported per token when a generation may move between snapshots, or began on
  // another worker's prefix.
  const bool report_versions = observer_ != nullptr || !prefixes.empty();
  bool may_move = observer_ != nullptr;  // to a newer snapshot between steps (SampleObserver)
  try {
    // One segment per snapshot: a segment interrupted by a newer snapshot leaves its unfinished
    // rows to the next, which continues them (prompt + tokens so far) on the new weights.
    for (uint64_t segment = 0; !running.empty(); ++segment) {
      model::SamplingParams sp = params_;
      // A continued row draws as the same sample from the position it reached (generate.h), so
      // its tokens are the seeded draws a verifier recomputes.
      sp.seed = seed;
      std::vector<std::vector<int64_t>> now;
      for (size_t r : running) {
        sp.sample_ids.push_back(static_cast<int64_t>(r));
        sp.first_positions.push_back(static_cast<int64_t>(out[r].tokens.size()));
        now.push_back(ids[r]);
        now.back().insert(now.back().end(), out[r].tokens.begin(), out[r].tokens.end());
        sp.max_new_tokens_per_row.push_back(params_.max_new_tokens - static_cast<int64_t>(out[r].tokens.size()));
      }
      bool interrupted = false, stopping = false;
      const model::StepCallback on_step = [&](const std::vector<int64_t>& rows, const std::vector<int64_t>& drawn,
                                              const std::vector<float>& logprobs) {
        if (observer_ == nullptr) return true;
        observer_->Generated(static_cast<int64_t>(rows.size()));
        std::vector<int64_t> samples(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) samples[i] = static_cast<int64_t>(running[rows[i]]);
        observer_->Drew(samples, drawn, logprobs, version_);
        stopping = observer_->Stopping();
        interrupted = !stopping && may_move && observer_->NewerSnapshot();
        return !interrupted && !stopping;
      };
      std::vector<model::Completion> part = model::Generate(model_, now, sp, on_step);
      if (stopping) return Cancelled("the actor is stopping; its samples were left unfinished");
      std::vector<size_t> unfinished;
      for (size_t i = 0; i < running.size(); ++i) {
        model::Completion& c = out[running[i]];
        c.tokens.insert(c.tokens.end(), part[i].tokens.begin(), part[i].tokens.end());
        c.logprobs.insert(c.logprobs.end(), part[i].logprobs.begin(), part[i].logprobs.end());
        c.finished_eos = part[i].finished_eos;
        // A segment re-prefills the row, so its routes cover every position: the newest stand.
        c.routes = std::move(part[i].routes);
        versions[running[i]].resize(c.tokens.size(), version_);
        if (!c.finished_eos && static_cast<int64_t>(c.tokens.size()) < params_.max_new_tokens)
          unfinished.push_back(running[i]);
      }
      if (!interrupted) break;
      // Without the newer weights the rows finish on these.
      if (!observer_->Update()) may_move = false;
      running = std::move(unfinished);
    }
  } catch (const std::exception& e) {  // LibTorch's errors end here
    return Internal(std::string("generation failed: ") + e.what());
  }
  std::vector<data::Turn> turns = ToTurns(vocab_, std::move(ids), std::move(out));
  if (report_versions)
    for (size_t r = 0; r < turns.size(); ++r) turns[r].versions = std::move(versions[r]);
  return turns;
}

Status ModelPolicy::LoadSnapshot(const std::string& safetensors_bytes, int64_t version) {
  const std::string where = "snapshot v" + std::to_string(version);
  ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, safetensors_bytes, &base_, where));
  version_ = version;
  return Status::Ok();
}

Status ModelPolicy::LoadBase(const std::string& safetensors_bytes) {
  ECHELON_RETURN_IF_ERROR(model::LoadPolicyWeights(*model_, safetensors_bytes, &base_, "LoRA base"));
  version_ = -1;
  return Status::Ok();
}

Result<data::EvalResult> EvaluateModel(const model::Qwen3Model& source, const model::Vocabulary& vocab,
                                       const data::TaskAdapter& task, int64_t max_new_tokens) {
  model::Qwen3Model copy(source->config());
  ECHELON_RETURN_IF_ERROR(copy->LoadStateDict(source->StateDict(), "evaluation copy"));
  model::SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = max_new_tokens;
  ModelPolicy policy(copy, vocab, sp);
  return data::EvaluateGreedy(task, task.HeldOut(), policy);
}

}  // namespace echelon::rollout
