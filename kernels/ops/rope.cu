// RoPE (MODEL.md §4): adjacent pairs (2i, 2i+1) times e^{±i·p·f_i}; the angle is the fp32 product
// p·f_i and cos/sin are taken in double and rounded once, as the CPU reference does.
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void rope_kernel(RopeArgs a) {
  dev::pdl_enter();
  const int64_t half = a.rope_dim / 2;
  const int64_t total = a.rows * a.vecs * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, rv = idx / half, h = rv % a.vecs, r = rv / a.vecs;
    const int64_t p = a.positions ? a.positions[r] : a.pos0 + r * a.pos_step;
    const float angle = __fmul_rn(static_cast<float>(p), a.freqs[i]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    float sn = static_cast<float>(sin(static_cast<double>(angle)));
    if (a.inverse) sn = -sn;
    float* v = a.v + r * a.row_stride + h * a.vec_stride + 2 * i;
    const float x0 = v[0], x1 = v[1];
    v[0] = dev::bf16_round(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
    v[1] = dev::bf16_round(__fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)));
  }
}

}  // namespace

namespace raw {
cudaError_t rope(const RopeArgs& a, cudaStream_t s) {
  const int64_t total = a.rows * a.vecs * (a.rope_dim / 2);
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  launch_pdl(rope_kernel, static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
