// Activation quantisation (ActQuant8) and the quantise-dequantise steps QDQ8 / QDQ4a / QDQ4b of
// MODEL.md §4: one warp per 32-value block (a half-warp pair of 16-blocks for QDQ4b); amax by warp
// max, scales by the reference's bit trick, so codes and scales are exact.
#include "ops/act_quant.cuh"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/rope_qdq.cuh"

namespace dsv41::ops::gpu {
namespace {

// One warp per 32-block; grid-stride over (row, block).
__global__ void act_quant8_kernel(ActQuantArgs a) {
  dev::pdl_enter();
  const int64_t nb = a.k / 32, total = a.rows * nb;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t wi = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; wi < total; wi += warps) {
    const int64_t r = wi / nb, b = wi % nb;
    const float x = a.x[r * a.x_stride + b * 32 + lane];
    dev::act_quant8_store(x, r, b * 32 + lane, a.k, a.codes, a.scales);
  }
}

__global__ void qdq_kernel(QdqArgs a) {
  dev::pdl_enter();
  const int64_t nb = a.k / 32, total = a.rows * nb;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t wi = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; wi < total; wi += warps) {
    const int64_t r = wi / nb, b = wi % nb;
    float* p = a.x + r * a.stride + b * 32 + lane;
    // optional RoPE of the row's tail first (the indexer's queries: one launch in place of two)
    *p = dev::qdq_lane(a.kind, dev::rope_tail_lane(a.rope, *p, r, b * 32 + lane, a.k));
  }
}

unsigned grid_for(int64_t warps_needed) {
  const int64_t blocks = (warps_needed + 7) / 8;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

namespace raw {
cudaError_t act_quant8(const ActQuantArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  launch_pdl(act_quant8_kernel, grid_for(a.rows * (a.k / 32)), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t qdq(const QdqArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  launch_pdl(qdq_kernel, grid_for(a.rows * (a.k / 32)), 256, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
