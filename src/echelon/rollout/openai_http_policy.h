// OpenAiHttpPolicy: the `openai-http` rollout backend. Generates through any OpenAI-compatible
// server (vLLM, SGLang, llama.cpp's server, `echelon serve`) over plain HTTP.
//
//   OpenAiHttpOptions o;
//   o.url = "http://127.0.0.1:8000";
//   OpenAiHttpPolicy policy(o, encode, decode, sampling);     // sampling as for ModelPolicy
//   std::vector<data::Turn> turns = policy.Sample({"37+48="}, seed);
//
// One Sample() is one POST /v1/completions: `prompt` as token ids (encoded here, so the learner
// trains on exactly the ids the server saw), `temperature`, `top_p`, `top_k`, `min_p`,
// `repetition_penalty` 1 (so the server applies none of its own defaults), `max_tokens`, `seed`,
// `stop_token_ids` (the EOS), `logprobs: 0`, `return_token_ids` and
// `return_tokens_as_token_ids` (vLLM's spellings). The sampled ids come from the choice's
// `token_ids` or, failing that, from logprob tokens written "token_id:N"; a server that gives
// neither is refused with an error saying so (it would force a lossy re-tokenization).
// Against `echelon serve` the result is exact: the server runs one Generate over the same
// prompt batch with the same seed, so tokens and log-probs equal ModelPolicy's bit for bit.
// Other engines report log-probs of their own sampler (vLLM: before temperature unless started
// with `--logprobs-mode processed_logprobs`); see docs/ARCHITECTURE.md.
//
// Snapshots: LoadSnapshot writes the bytes as DIR/v<version>/model.safetensors beside
// `snapshot_files` (config.json, tokenizer.json...), then POSTs {"model_path": that directory}
// to `reload_path` (default /update_weights_from_disk: SGLang and echelon serve), so DIR must
// be a path the server can read (same host or shared storage). The previous version's
// directory is removed once the server took the new one.
//
// Errors: Sample throws std::runtime_error (the actor drops the group; its lease expires and it
// is re-issued) naming the URL and what the server said; LoadSnapshot returns a Status.
// Thread contract: owned by one actor thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/model/generate.h"
#include "echelon/rollout/snapshot_policy.h"

namespace echelon::rollout {

struct OpenAiHttpOptions {
  std::string url;    // "http://HOST:PORT", optionally ending in /v1
  std::string model;  // the request's "model"; "" -> the first id of GET /v1/models
  std::string api_key;  // sent as "Authorization: Bearer KEY" when set
  double timeout_seconds = 600;  // per request (a whole group's generation)
  std::string reload_path = "/update_weights_from_disk";
  std::string snapshot_dir;                          // where LoadSnapshot writes model directories
  std::map<std::string, std::string> snapshot_files;  // written beside each snapshot's weights
};

// Prompt text -> the token ids the model sees (ModelPolicy's encoding: BOS + characters).
using PromptEncoder = std::function<Result<std::vector<int64_t>>(const data::PolicyPrompt&)>;
// Sampled ids -> the completion text the task adapter reads.
using TokenDecoder = std::function<std::string(const std::vector<int64_t>&)>;

class OpenAiHttpPolicy : public SnapshotPolicy {
 public:
  OpenAiHttpPolicy(OpenAiHttpOptions options, PromptEncoder encode, TokenDecoder decode,
                   model::SamplingParams params);
  ~OpenAiHttpPolicy() override;

  Result<std::vector<data::Turn>> Sample(const std::vector<data::PolicyPrompt>& prompts, uint64_t seed) override;
  Status LoadSnapshot(const std::string& safetensors_bytes, int64_t version) override;
  int64_t version() const override { return version_; }

  // POSTs {"model_path": dir} to the reload hook; the error carries the server's message.
  Status ReloadWeights(const std::string& dir);
  // The model name requests use (asks GET /v1/models the first time when not configured).
  Result<std::string> ModelName();

 private:
  struct Http;
  OpenAiHttpOptions options_;
  PromptEncoder encode_;
  TokenDecoder decode_;
  model::SamplingParams params_;
  std::unique_ptr<Http> http_;
  std::string base_path_;  // "/v1" prefix of the API routes
  int64_t version_ = -1;
  std::string current_dir_;  // the snapshot directory the server holds
};

}  // namespace echelon::rollout
