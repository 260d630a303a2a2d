#include "echelon/model/fused_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace echelon::model {
namespace {

at::Tensor NormByOps(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps));
}

at::Tensor RopeByOps(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {  // x [N, H, D]
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

TEST(FusedOpsTest, EqualTheGenericOps) {
  at::NoGradGuard no_grad;
  at::manual_seed(5);
  for (int64_t d : {32, 6}) {  // 6: not a multiple of the 8-wide sums
    const at::Tensor x = at::randn({7, 3, d}) * 3, w = at::randn({d});
    EXPECT_LT((RmsNormFused(x, w, 1e-6) - NormByOps(x, w, 1e-6)).abs().max().item<float>(), 1e-5) << d;
    const at::Tensor angles = at::randn({7, d / 2}) * 10;
    const at::Tensor cos = at::cat({angles, angles}, -1).cos(), sin = at::cat({angles, angles}, -1).sin();
    EXPECT_LT((NormRopeFused(x, w, 1e-6, cos, sin) - RopeByOps(NormByOps(x, w, 1e-6), cos, sin)).abs().max().item<float>(),
              1e-5)
        << d;
    EXPECT_LT((NormRopeFused(x, at::Tensor(), 1e-6, cos, sin) - RopeByOps(x, cos, sin)).abs().max().item<float>(), 1e-5)
        << "without the norm, d=" << d;
  }
}

TEST(FusedOpsTest, ApplyOnlyToInferenceInFp32OnTheCpu) {
  const at::Tensor x = at::randn({2, 4});
  EXPECT_FALSE(FusedOpsApply(x)) << "gradients are recorded outside a NoGradGuard";
  at::NoGradGuard no_grad;
  EXPECT_TRUE(FusedOpsApply(x));
  EXPECT_FALSE(FusedOpsApply(x.to(at::kBFloat16)));
  EXPECT_FALSE(FusedOpsApply(x.t()));
  EXPECT_THROW(RmsNormFused(x, at::ones({3}), 1e-6), c10::Error);
  EXPECT_THROW(NormRopeFused(at::randn({2, 1, 4}), at::Tensor(), 1e-6, at::ones({2, 2}), at::ones({2, 2})), c10::Error);
}

}  // namespace
}  // namespace echelon::model
