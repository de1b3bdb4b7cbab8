// fp32 dot products in the accumulation order of the reference's CPU fp32 GEMM (PyTorch's
// F.linear on MKL): the reduction runs in K blocks of 256, each a sequential fused multiply-add
// chain from zero, and the block results are added in K order. Where the products are exact
// (bf16 x bf16) this only fixes the summation order; for fp32 weights (the mHC projections) the
// fusing matters too. Matching this order removes most last-ulp differences against the golden
// streams, which matter because FP8/FP4 re-quantisation downstream turns ulps into code flips.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dsv41::model {

inline constexpr int64_t kGemmKBlock = 256;

inline float gemm_dot_f32(const float* a, const float* b, int64_t n) {
  float total = 0.0f;
  for (int64_t k0 = 0; k0 < n; k0 += kGemmKBlock) {
    const int64_t k1 = std::min(n, k0 + kGemmKBlock);
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; ++k) acc = std::fma(a[k], b[k], acc);
    total += acc;
  }
  return total;
}

}  // namespace dsv41::model
