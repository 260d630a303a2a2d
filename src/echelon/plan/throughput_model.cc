#include "echelon/plan/throughput_model.h"

#include <algorithm>
#include <cmath>

namespace echelon::plan {

double ModelProfile::weight_bytes_read(int64_t batch) const {
  if (experts <= 0 || experts_per_token <= 0 || experts_per_token >= experts || active_params <= 0)
    return weight_bytes();
  const double routed = static_cast<double>(experts_per_token) / static_cast<double>(experts);
  const double expert_params = std::min(params, (params - active_params) / (1 - routed));
  const double touched = 1 - std::pow(1 - routed, static_cast<double>(std::max<int64_t>(batch, 1)));
  return bytes_per_param * (params - expert_params + expert_params * touched);
}

DecodeEstimate EstimateDecode(const GpuSpec& gpu, const ModelProfile& model, const RolloutShape& shape,
                              int64_t stages, double link_seconds) {
  DecodeEstimate d;
  const double c_avg = shape.prompt_tokens + shape.completion_tokens / 2;
  const double free_bytes = stages * kUsableMemoryFraction * gpu.memory_gb * 1e9 - model.weight_bytes();
  const double per_seq = std::max(1.0, model.kv_bytes_per_token * c_avg);
  int64_t b = free_bytes > 0 ? static_cast<int64_t>(std::floor(free_bytes / per_seq)) : 0;
  b = std::min(b, kMaxDecodeBatch);
  b = (b / shape.group_size) * shape.group_size;
  if (b < shape.group_size) return d;
  d.feasible = true;
  d.batch = b;
  d.slots = b / shape.group_size;
  // One round decodes a token of every sequence (see the header for pipelines).
  d.iter_seconds = stages > 1 ? DecodeIterSeconds(gpu, model, shape, std::max<int64_t>(1, b / stages)) +
                                    static_cast<double>(stages) * link_seconds
                              : DecodeIterSeconds(gpu, model, shape, b);
  d.tokens_per_s = b / d.iter_seconds;
  d.group_seconds = shape.completion_tokens * d.iter_seconds;
  return d;
}

double DecodeIterSeconds(const GpuSpec& gpu, const ModelProfile& model, const RolloutShape& shape, int64_t batch) {
  const double c_avg = shape.prompt_tokens + shape.completion_tokens / 2;
  const double bw = kDecodeBandwidthEfficiency * gpu.memory_bandwidth_gbs * 1e9;
  const double fl = kDecodeFlopsEfficiency * gpu.bf16_tflops * 1e12;
  const double t_mem = (model.weight_bytes_read(batch) + batch * model.kv_bytes_per_token * c_avg) / bw;
  const double t_flop = 2 * model.compute_params() * batch / fl;
  return std::max(t_mem, t_flop);
}

DecodeEstimate MeasuredDecode(double tokens_per_s, int64_t slots, const RolloutShape& shape) {
  DecodeEstimate d;
  if (tokens_per_s <= 0 || slots <= 0) return d;
  d.feasible = true;
  d.slots = slots;
  d.batch = slots * shape.group_size;
  d.tokens_per_s = tokens_per_s;
  d.iter_seconds = d.batch / tokens_per_s;
  d.group_seconds = shape.completion_tokens * d.iter_seconds;
  return d;
}

double EstimateTrainSeconds(const GpuSpec& gpu, int64_t count, double mfu, const ModelProfile& model, double tokens) {
  return kTrainFlopsPerTokenPerParam * model.compute_params() * tokens / (count * gpu.bf16_tflops * 1e12 * mfu);
}

}  // namespace echelon::plan
