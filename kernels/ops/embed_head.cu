// Token embedding into the hc streams (MODEL.md §5.1: every stream starts as the embedding row) and
// the greedy pick over logits (first maximum, as argmax in the reference, or as std::max_element
// for the server's device-side greedy sampling).
#include <cmath>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void embed_kernel(EmbedArgs a) {
  dev::pdl_enter();
  const int64_t total = a.n * a.hc * a.dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / (a.hc * a.dim), d = idx % a.dim;
    const int64_t tok = a.tokens[t];
    a.out[idx] = (tok < 0 || tok >= a.vocab) ? NAN : dev::bf16_bits_to_f32(a.table[tok * a.dim + d]);
  }
  if (a.pre_out)  // written here rather than uploaded: one copy less before a step's first kernel
    for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < a.n * a.hc;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
      a.pre_out[idx] = idx % a.hc == 0 ? 1.0f : 0.0f;
}

// Is (v, i) ahead of (bv, bi)? NaN first, then larger value, then lower index.
__device__ __forceinline__ bool ahead(float v, int64_t i, float bv, int64_t bi) {
  if (bi < 0) return i >= 0;
  if (i < 0) return false;
  if (isnan(v) != isnan(bv)) return isnan(v);
  if (!isnan(v) && v != bv) return v > bv;
  return i < bi;
}

__global__ void argmax_kernel(ArgmaxArgs a) {
  dev::pdl_enter();
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const float* x = a.x + static_cast<int64_t>(blockIdx.x) * a.n;
  float best = 0.0f;
  int64_t bi = -1;
  for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x)
    if (!(a.skip_nan && isnan(x[i])) && ahead(x[i], i, best, bi)) best = x[i], bi = i;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(dev::kFull, best, o);
    const int64_t oi = __shfl_xor_sync(dev::kFull, bi, o);
    if (ahead(ov, oi, best, bi)) best = ov, bi = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) sv[warp] = best, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / 32;
    best = lane < nw ? sv[lane] : 0.0f;
    bi = lane < nw ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(dev::kFull, best, o);
      const int64_t oi = __shfl_xor_sync(dev::kFull, bi, o);
      if (ahead(ov, oi, best, bi)) best = ov, bi = oi;
    }
    // max_element keeps a NaN first element (no number compares above it); an all-NaN row too
    if (a.skip_nan && (bi < 0 || isnan(x[0]))) bi = 0;
    if (lane == 0) a.out[blockIdx.x] = static_cast<int32_t>(bi);
  }
}

}  // namespace

namespace raw {
cudaError_t embed(const EmbedArgs& a, cudaStream_t s) {
  const int64_t total = a.n * a.hc * a.dim;
  if (total == 0) return cudaSuccess;
  const int64_t b = (total + 255) / 256;
  launch_pdl(embed_kernel, static_cast<unsigned>(b < 65535 ? b : 65535), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t argmax(const ArgmaxArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  launch_pdl(argmax_kernel, static_cast<unsigned>(a.rows), 1024, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
