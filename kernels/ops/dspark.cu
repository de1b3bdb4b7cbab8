// The two DSpark pieces (MODEL.md §6) no other op covers, with the CPU reference engine's exact
// arithmetic (src/model/cpu_model.cpp):
//  - stream_mean: a target layer's tap, bf16((h_0 + h_1 + .. + h_{hc-1}) / hc) with the streams
//    added left to right from zero in fp32;
//  - markov_bias: the Markov head's bias fp32(W[v]) · fp32(embed[id]) as one unfused multiply-add
//    chain over the rank in k order, added to the drafter's fp32 logits (no bf16 rounding).
#include <cmath>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void stream_mean_kernel(StreamMeanArgs a) {
  dev::pdl_enter();
  const int64_t total = a.n * a.dim;
  const float count = static_cast<float>(a.hc);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.dim, d = idx % a.dim;
    const float* h = a.h + t * a.hc * a.dim + d;
    float s = 0.0f;
    for (int64_t j = 0; j < a.hc; ++j) s = __fadd_rn(s, h[j * a.dim]);
    a.out[t * a.out_stride + d] = dev::bf16_round(__fdiv_rn(s, count));
  }
}

constexpr int kMarkovRows = 8;
constexpr int kMarkovThreads = 256;

template <class W>
__device__ __forceinline__ float wv(const W* w, int64_t i);
template <>
__device__ __forceinline__ float wv<uint16_t>(const uint16_t* w, int64_t i) { return dev::bf16_bits_to_f32(w[i]); }
template <>
__device__ __forceinline__ float wv<float>(const float* w, int64_t i) { return w[i]; }

// Thread v of block (x, y) owns vocabulary entry v for up to kMarkovRows rows y*kMarkovRows..: the
// transposed head [rank][vocab] is read coalesced once for all of them; the rows' embedding
// vectors sit in shared memory.
template <class HW, class EW>
__global__ void markov_bias_kernel(MarkovBiasArgs a) {
  dev::pdl_enter();
  extern __shared__ float e_sm[];  // [kMarkovRows][rank]
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kMarkovRows;
  const int nr = static_cast<int>(a.rows - r0 < kMarkovRows ? a.rows - r0 : kMarkovRows);
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(nr) * a.rank; i += blockDim.x) {
    const int64_t r = i / a.rank, k = i % a.rank;
    const int32_t id = a.ids[r0 + r];
    e_sm[r * a.rank + k] = (id < 0 || id >= a.vocab) ? NAN : wv(static_cast<const EW*>(a.embed), id * a.rank + k);
  }
  __syncthreads();
  const int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= a.vocab) return;
  const HW* w = static_cast<const HW*>(a.head_t);
  float acc[kMarkovRows];
#pragma unroll
  for (int r = 0; r < kMarkovRows; ++r) acc[r] = 0.0f;
  for (int64_t k = 0; k < a.rank; ++k) {
    const float wk = wv(w, k * a.vocab + v);
#pragma unroll
    for (int r = 0; r < kMarkovRows; ++r)
      if (r < nr) acc[r] = __fadd_rn(acc[r], __fmul_rn(wk, e_sm[r * a.rank + k]));
  }
  for (int r = 0; r < nr; ++r) {
    float* l = a.logits + (r0 + r) * a.logits_stride + v;
    *l = __fadd_rn(*l, acc[r]);
  }
}

template <class HW>
cudaError_t launch_markov(const MarkovBiasArgs& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.vocab + kMarkovThreads - 1) / kMarkovThreads),
                  static_cast<unsigned>((a.rows + kMarkovRows - 1) / kMarkovRows));
  const size_t smem = static_cast<size_t>(kMarkovRows * a.rank) * sizeof(float);
  if (a.embed_type == DenseType::BF16) launch_pdl(markov_bias_kernel<HW, uint16_t>, grid, kMarkovThreads, smem, s, a);
  else launch_pdl(markov_bias_kernel<HW, float>, grid, kMarkovThreads, smem, s, a);
  return cudaGetLastError();
}

}  // namespace

namespace raw {
cudaError_t stream_mean(const StreamMeanArgs& a, cudaStream_t s) {
  const int64_t total = a.n * a.dim;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  launch_pdl(stream_mean_kernel, static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t markov_bias(const MarkovBiasArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  return a.head_type == DenseType::BF16 ? launch_markov<uint16_t>(a, s) : launch_markov<float>(a, s);
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
