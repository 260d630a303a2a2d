// Throughput model: token rates of a GPU for a given model, derived from public specs
// (memory, DRAM bandwidth, dense bf16 FLOP/s) when no measurement is given.
//
// Decode (rollout generation). One decode iteration of a batch of b sequences reads the
// weights once and each sequence's KV cache, and does 2*P FLOPs per sequence:
//     t_iter(b) = max( (w*P + b*kv*c_avg) / (eta_bw * BW),  2*P*b / (eta_fl * F) )
// with P parameters of w bytes, kv bytes of KV cache per token, c_avg the mean context over
// a sequence's life (prompt + completion/2). The batch is what fits in memory with a paged
// KV cache: b = floor((mem_frac*M - w*P) / (kv*c_avg)), capped at kMaxDecodeBatch, rounded
// down to whole groups. A worker therefore runs b/G groups at once; each takes
// T_gen = completion_tokens * t_iter(b) and the worker makes b / t_iter(b) tokens/s.
// Prefill is ignored (prompt << completion for reasoning RL).
//
// Training. One update on tokens N = R*(prompt+completion) costs 8*P*N FLOPs (6 for forward
// and backward, 2 for recomputing the log-probs under the current policy), at a model-FLOPs
// utilisation `mfu` of the learner's dense bf16 peak.
//
// Mixture of experts. Compute follows the active parameters P_a (what one token computes
// with): 2*P_a FLOPs per decoded token, 8*P_a per trained token. Memory holds all P. A decode
// iteration of b sequences reads the shared weights and, of each layer's X experts, those the
// b tokens were routed to: with k of X per token and uniform routing, the expected share read
// is 1 - (1 - k/X)^b (nearly all of them once b >> X/k). The expert parameters follow from
// P_e * (1 - k/X) = P - P_a.
//
// Pipelines (a worker of k GPUs of one kind, each holding 1/k of the layers; Parallax-style).
// Memory adds up: the batch b is what fits in k GPUs. The batch is split into k micro-batches
// of b/k, one per stage in flight. In one round every micro-batch decodes one token: each
// stage serves k micro-batches over its 1/k of the layers (together t_iter(b/k) of one GPU)
// and each micro-batch crosses k links (the last back to the sampler on stage 0):
//     t_round = t_iter(b/k) + k * link_latency,  tokens/s = b / t_round.
// So a pipeline brings the memory of k GPUs at about one GPU's decode speed (less the links).
//
// These are estimates with stated efficiencies; measured rates override them (plan config
// `tokens_per_second`, `learner.step_seconds`).
//
//   DecodeEstimate d = EstimateDecode(gpu, model, shape);   // d.feasible, d.tokens_per_s ...
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>

#include "echelon/plan/price_catalog.h"

namespace echelon::plan {

// Tunables, with the reason for each default.
// Fraction of peak DRAM bandwidth a decode kernel sustains: vLLM/SGLang-class engines reach
// 60-80% on weight reads; 0.6 stays on the conservative side.
inline constexpr double kDecodeBandwidthEfficiency = 0.6;
// Fraction of peak FLOP/s when decode turns compute-bound at large batch (attention and
// sampling overheads): 0.4.
inline constexpr double kDecodeFlopsEfficiency = 0.4;
// Device memory usable for weights + KV cache (vLLM's default gpu_memory_utilization 0.9).
inline constexpr double kUsableMemoryFraction = 0.9;
// Largest decode batch considered: beyond ~256 sequences engines gain little and latency grows.
inline constexpr int64_t kMaxDecodeBatch = 256;
// FLOPs per trained token per parameter: 6 (forward + backward) + 2 (log-prob recompute).
inline constexpr double kTrainFlopsPerTokenPerParam = 8.0;

struct ModelProfile {
  double params = 0;              // P
  double bytes_per_param = 2;     // w: 2 for bf16 weights
  double kv_bytes_per_token = 0;  // kv: 2 * layers * kv_heads * head_dim * 2 bytes
  // Mixture of experts (0: a dense model): P_a, X and k.
  double active_params = 0;
  int64_t experts = 0;
  int64_t experts_per_token = 0;
  double weight_bytes() const { return params * bytes_per_param; }
  double compute_params() const { return active_params > 0 ? active_params : params; }
  // Bytes of weights one decode iteration of `batch` sequences reads (all of them when dense).
  double weight_bytes_read(int64_t batch) const;
};

struct RolloutShape {
  int64_t group_size = 8;          // G: samples per prompt
  double prompt_tokens = 256;
  double completion_tokens = 1024;  // mean generated tokens per rollout (L)
};

struct DecodeEstimate {
  bool feasible = false;      // weights + one group's KV cache fit
  int64_t batch = 0;          // sequences decoded at once (b)
  int64_t slots = 0;          // groups at once: b / G
  double iter_seconds = 0;    // t_iter(b)
  double tokens_per_s = 0;    // b / t_iter
  double group_seconds = 0;   // T_gen = L * t_iter
};

// `stages` GPUs in a pipeline (1: one GPU), `link_seconds` per hop between stages.
DecodeEstimate EstimateDecode(const GpuSpec& gpu, const ModelProfile& model, const RolloutShape& shape,
                              int64_t stages = 1, double link_seconds = 0);
// t_iter for a given batch (no memory check): the baseline's last, partial wave.
double DecodeIterSeconds(const GpuSpec& gpu, const ModelProfile& model, const RolloutShape& shape, int64_t batch);
// From a measured rate and concurrency instead of specs.
DecodeEstimate MeasuredDecode(double tokens_per_s, int64_t slots, const RolloutShape& shape);

// Seconds per learner update over `tokens` trained tokens on `count` GPUs.
double EstimateTrainSeconds(const GpuSpec& gpu, int64_t count, double mfu, const ModelProfile& model, double tokens);

}  // namespace echelon::plan
