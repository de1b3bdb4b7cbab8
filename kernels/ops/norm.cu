// RMSNorm (MODEL.md §4): bf16( w · (x · rsqrt(mean(x²) + eps)) ), one warp per row; the mean of
// squares is summed in the reference's order (warp_torch_sum), so the result is bit-identical.
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 4;

__global__ void rms_norm_kernel(RmsNormArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= a.rows) return;
  const float* x = a.x + row * a.x_stride;
  float* out = a.out + row * a.out_stride;
  const float sum = dev::warp_torch_sum([&](int64_t i) { return __fmul_rn(x[i], x[i]); }, a.d);
  const float var = __fdiv_rn(sum, static_cast<float>(a.d));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));
  __syncwarp();
  for (int64_t i = threadIdx.x & 31; i < a.d; i += 32) out[i] = dev::bf16_round(__fmul_rn(a.w[i], __fmul_rn(x[i], r)));
}

}  // namespace

namespace raw {
cudaError_t rms_norm(const RmsNormArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  rms_norm_kernel<<<blocks, kWarps * 32, 0, s>>>(a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
