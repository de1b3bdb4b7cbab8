// Compressor state step for ratio > 1 (MODEL.md §5.4): each token's fp32 (kv, score) pair goes to
// its slot of the carried state; when a group completes, the per-channel softmax over the group's
// scores pools the kv values into one bf16 latent. One thread per channel walks the tokens in
// order (the state is sequential by nature). Plus the fp32 -> bf16 row store used for caches.
#include <cmath>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kMaxRatio = 16;

__global__ void compress_pool_kernel(CompressPoolArgs a) {
  dev::pdl_enter();
  const int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d >= a.hd) return;
  int64_t g = 0;
  for (int64_t t = 0; t < a.n; ++t) {
    const int64_t p = a.start + t, slot = p % a.ratio;
    a.carry_kv[slot * a.hd + d] = a.av[t * a.hd + d];
    a.carry_score[slot * a.hd + d] = a.gv[t * a.hd + d];
    if ((p + 1) % a.ratio != 0) continue;
    float mx = -INFINITY;
    for (int64_t s = 0; s < a.ratio; ++s) {
      const float v = a.carry_score[s * a.hd + d];
      mx = mx < v ? v : mx;
    }
    float e[kMaxRatio];
    float sum = 0.0f;
    for (int64_t s = 0; s < a.ratio; ++s) {
      e[s] = dev::exp_ref(__fsub_rn(a.carry_score[s * a.hd + d], mx));
      sum = __fadd_rn(sum, e[s]);
    }
    float acc = 0.0f;
    for (int64_t s = 0; s < a.ratio; ++s) acc = __fadd_rn(acc, __fmul_rn(a.carry_kv[s * a.hd + d], __fdiv_rn(e[s], sum)));
    a.pooled[g * a.hd + d] = dev::bf16_round(acc);
    ++g;
  }
}

__global__ void store_bf16_kernel(StoreBf16Args a) {
  dev::pdl_enter();
  const int64_t total = a.rows * a.cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / a.cols, c = idx % a.cols;
    a.dst[r * a.dst_stride + c] = dev::f32_to_bf16_bits(a.x[r * a.x_stride + c]);
  }
}

}  // namespace

namespace raw {
cudaError_t compress_pool(const CompressPoolArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  launch_pdl(compress_pool_kernel, static_cast<unsigned>((a.hd + 127) / 128), 128, 0, s, a);
  return cudaGetLastError();
}
cudaError_t store_bf16(const StoreBf16Args& a, cudaStream_t s) {
  const int64_t total = a.rows * a.cols;
  if (total == 0) return cudaSuccess;
  const int64_t b = (total + 255) / 256;
  launch_pdl(store_bf16_kernel, static_cast<unsigned>(b < 65535 ? b : 65535), 256, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
