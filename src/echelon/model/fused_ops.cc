#include "echelon/model/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "echelon/model/cpu_clones.h"

namespace echelon::model {
namespace {

// 1 / sqrt(mean(x^2) + eps) over d values (eight partial sums, so the loop vectorises).
ECHELON_CPU_CLONES
float InverseRms(const float* x, int64_t d, float eps) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * x[i + j];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < d; ++i) sum += x[i] * x[i];
  return 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
}

ECHELON_CPU_CLONES
void NormRow(const float* x, const float* w, float inv, float* out, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] = w[i] * (x[i] * inv);
}

// out = y * cos + rotate_half(y) * sin, rotate_half(y) = [-y2, y1].
ECHELON_CPU_CLONES
void RopeRow(const float* y, const float* c, const float* s, float* out, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = y[i] * c[i] - y[i + half] * s[i];
    out[i + half] = y[i + half] * c[i + half] + y[i] * s[i + half];
  }
}

void CheckFloatCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), "fused ops: ", what,
              " must be a contiguous fp32 CPU tensor");
}

}  // namespace

bool FusedOpsApply(const at::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && !at::GradMode::is_enabled();
}

at::Tensor RmsNormFused(const at::Tensor& x, const at::Tensor& w, double eps) {
  CheckFloatCpu(x, "x");
  CheckFloatCpu(w, "the norm weight");
  const int64_t d = x.size(-1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == d, "RmsNormFused: weight ", w.sizes(), " for rows of ", d);
  at::Tensor out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      NormRow(xp + r * d, wp, InverseRms(xp + r * d, d, static_cast<float>(eps)), op + r * d, d);
  });
  return out;
}

at::Tensor NormRopeFused(const at::Tensor& x, const at::Tensor& norm_w, double eps, const at::Tensor& cos,
                         const at::Tensor& sin) {
  CheckFloatCpu(x, "x");
  CheckFloatCpu(cos, "cos");
  CheckFloatCpu(sin, "sin");
  TORCH_CHECK(x.dim() == 3, "NormRopeFused: x must be [N, heads, D], got ", x.sizes());
  const int64_t n = x.size(0), heads = x.size(1), d = x.size(2);
  TORCH_CHECK(d % 2 == 0 && cos.sizes() == at::IntArrayRef({n, d}) && sin.sizes() == cos.sizes(),
              "NormRopeFused: cos and sin must be [", n, ", ", d, "], got ", cos.sizes(), " and ", sin.sizes());
  if (norm_w.defined()) {
    CheckFloatCpu(norm_w, "the norm weight");
    TORCH_CHECK(norm_w.dim() == 1 && norm_w.size(0) == d, "NormRopeFused: norm weight ", norm_w.sizes());
  }
  at::Tensor out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = norm_w.defined() ? norm_w.data_ptr<float>() : nullptr;
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n * heads, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> normed(static_cast<size_t>(d));
    for (int64_t row = begin; row < end; ++row) {
      const float* y = xp + row * d;
      if (wp != nullptr) {
        NormRow(y, wp, InverseRms(y, d, static_cast<float>(eps)), normed.data(), d);
        y = normed.data();
      }
      const int64_t token = row / heads;
      RopeRow(y, cp + token * d, sp + token * d, op + row * d, d);
    }
  });
  return out;
}

}  // namespace echelon::model
