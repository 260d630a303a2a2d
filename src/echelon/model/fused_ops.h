// RMSNorm and rotary embedding as one pass each, for inference in fp32 on the CPU. A decoding
// step of a small model runs a few dozen rows through every layer, so its time goes to the
// number of ATen operations rather than to arithmetic: the generic RmsNorm is six of them,
// norm + rotary embedding of q or k twelve; here each is one. Numerically the same as the
// generic ops up to float summation order.
//
//   if (FusedOpsApply(x)) h = RmsNormFused(x, weight, eps);
//
// Thread contract: pure functions; rows are split over ATen's intra-op threads.
#pragma once

#include <ATen/core/Tensor.h>

namespace echelon::model {

// Whether the fused ops serve `x`: fp32, on the CPU, contiguous, and no gradient being
// recorded (they have no backward).
bool FusedOpsApply(const at::Tensor& x);

// w * x / sqrt(mean(x^2, last dim) + eps), x [..., D], w [D].
at::Tensor RmsNormFused(const at::Tensor& x, const at::Tensor& w, double eps);

// For x [N, heads, D] (N = B x T tokens): an optional per-head RMSNorm (norm_w [D], undefined:
// none), then the rotary embedding in the rotate-half layout with the token's cos, sin [N, D].
at::Tensor NormRopeFused(const at::Tensor& x, const at::Tensor& norm_w, double eps, const at::Tensor& cos,
                         const at::Tensor& sin);

}  // namespace echelon::model
