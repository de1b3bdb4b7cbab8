// EXL3 large-m linear kernel (m > 8): one block per (128-column group, k-split, 64-row block); the
// last block of a group (ticket counter) sums the k-split partials in split order and applies the
// output Hadamard, svh and bias. The small-m paths are the stream kernels (exl3_stream.cuh).
#pragma once
#include "exl3/exl3_block.cuh"

namespace dsv41::exl3::dev {

struct GemmArgs {
  cuda::Exl3Matrix w;
  const __half* xh;  // x_had [m][k]
  void* y;
  int y_type;
  int64_t y_cols, y_stride;
  int m, m_pad, splits, kt_per_split;
  bool round_bf16;
  float* part;    // [splits][m_pad][n] when splits > 1
  int* counters;  // [m_blocks][n/128]
};

// Reduces split partials (if any) into red and writes the finished rows. Returns false in blocks
// that are not the last of their group.
__device__ __forceinline__ bool finish_group(const GemmArgs& a, float* red, int ng, int split,
                                             int mb, int tok0, int ntok) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = a.w.n;
  if (a.splits > 1) {
    __shared__ int s_last;
    float* part = a.part + (static_cast<size_t>(split) * a.m_pad + tok0) * n + ng * 128;
    for (int i = tid; i < ntok * 128; i += kThreads) part[static_cast<size_t>(i >> 7) * n + (i & 127)] = red[i];
    __threadfence();
    __syncthreads();
    int* ctr = a.counters + mb * (n / 128) + ng;  // [m_blocks][n/128]
    if (tid == 0) s_last = atomicAdd(ctr, 1) == a.splits - 1;
    __syncthreads();
    if (!s_last) return false;
    __threadfence();
    for (int i = tid; i < ntok * 128; i += kThreads)
      red[i] = sum_splits(a.part + static_cast<size_t>(tok0 + (i >> 7)) * n + ng * 128 + (i & 127),
                          static_cast<size_t>(a.m_pad) * n, a.splits);
    if (tid == 0) *ctr = 0;  // ready for the next launch (all splits have arrived)
    __syncthreads();
  }
  for (int r = warp; r < ntok; r += kWarps) {
    float v[4];
    out_transform(red + r * 128, a.w.svh, ng * 128, v);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = ng * 128 + 4 * lane + e;
      float o = v[e];
      if (a.w.bias) o += __half2float(__ushort_as_half(a.w.bias[col]));
      if (a.round_bf16) o = __bfloat162float(__float2bfloat16_rn(o));
      if (col < a.y_cols) store_act(a.y, a.y_type, static_cast<int64_t>(tok0 + r) * a.y_stride + col, o);
    }
  }
  return true;
}

template <int K, int CB>
__global__ void __launch_bounds__(kThreads) gemm_kernel(const GemmArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  // Row blocks vary fastest so that the blocks sharing a column group's trellis run together
  // (the trellis then comes from DRAM once and from L2 for the other row blocks).
  const int mb = blockIdx.x, ng = blockIdx.y, split = blockIdx.z;
  const int kt_total = a.w.k / 16;
  const int kt0 = split * a.kt_per_split;
  const int kt1 = min(kt_total, kt0 + a.kt_per_split);
  const int tok0 = mb * cuda::kLargeRows;
  const int ntok = min(cuda::kLargeRows, a.m - tok0);
  float* red = reinterpret_cast<float*>(smem + ring_bytes(K));
  large_block<K, CB, 4>(a.w, a.xh, a.m, tok0, ng, kt0, kt1, (ntok + 15) / 16, smem, red);
  finish_group(a, red, ng, split, mb, tok0, ntok);
}

}  // namespace dsv41::exl3::dev
