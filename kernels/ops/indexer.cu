// Indexer scoring (MODEL.md §5.4): s_u = bf16( Σ_h bf16( relu(bf16(q_h·K_u)) · w_h ) ) for visible
// entries, -inf beyond the query's visible count. One warp per entry; lanes take heads, each head
// dot is the reference's fma chain, the head terms are added in head order through shuffles.
// Plus the level-1 candidate blocks of the candidate source and their mask on later layers.
#include <cmath>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kEntriesPerWarp = 8;
constexpr int kMaxHeadsPerLane = 4;  // up to 128 heads

__global__ void indexer_kernel(IndexerArgs a) {
  extern __shared__ float smem[];
  float* q = smem;                         // [heads][head_dim]
  float* w = smem + a.heads * a.head_dim;  // [heads]
  const int64_t t = blockIdx.y;
  for (int64_t i = threadIdx.x; i < a.heads * a.head_dim; i += blockDim.x) q[i] = a.qi[t * a.heads * a.head_dim + i];
  for (int64_t i = threadIdx.x; i < a.heads; i += blockDim.x) w[i] = a.w[t * a.heads + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t n_vis = (a.start + t + 1) / a.ratio;
  const int64_t u0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kEntriesPerWarp;
  for (int64_t u = u0; u < u0 + kEntriesPerWarp && u < a.T; ++u) {
    if (u >= n_vis) {
      if (lane == 0) a.scores[t * a.T + u] = -INFINITY;
      continue;
    }
    float term[kMaxHeadsPerLane];
    for (int r = 0; r < kMaxHeadsPerLane; ++r) {
      const int64_t h = lane + 32 * r;
      term[r] = 0.0f;
      if (h >= a.heads) continue;
      float dot = 0.0f;
      if (u < a.n_keys) {
        const float* qh = q + h * a.head_dim;
        const uint16_t* key = a.keys + u * a.head_dim;
        for (int64_t k0 = 0; k0 < a.head_dim; k0 += dev::kGemmKBlock) {
          const int64_t k1 = k0 + dev::kGemmKBlock < a.head_dim ? k0 + dev::kGemmKBlock : a.head_dim;
          dot = __fadd_rn(dot, dev::dot_block([&](int64_t k) { return qh[k]; },
                                              [&](int64_t k) { return dev::bf16_bits_to_f32(key[k]); }, k0, k1));
        }
      }
      const float bd = dev::bf16_round(dot);
      const float rl = bd < 0.0f ? 0.0f : bd;  // std::max(bd, 0): -0 and NaN pass through
      term[r] = dev::bf16_round(__fmul_rn(rl, w[h]));
    }
    float acc = 0.0f;
    for (int64_t h = 0; h < a.heads; ++h) {
      float v = 0.0f;
      for (int r = 0; r < kMaxHeadsPerLane; ++r) {
        const float x = __shfl_sync(dev::kFull, term[r], static_cast<int>(h & 31));
        if (r == h / 32) v = x;
      }
      acc = __fadd_rn(acc, v);
    }
    if (lane == 0) a.scores[t * a.T + u] = dev::bf16_round(acc);
  }
}

// Block maxima of the candidate source's scores, the block holding entry n_vis-1 pinned to +inf.
__global__ void block_scores_kernel(CandidateArgs a, int64_t nb) {
  const int64_t total = a.n * nb;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / nb, b = idx % nb;
    float m = -INFINITY;
    for (int64_t u = b * a.block_size; u < (b + 1) * a.block_size && u < a.T; ++u) {
      const float v = a.scores[t * a.T + u];
      m = m < v ? v : m;
    }
    const int64_t n_vis = (a.start + t + 1) / a.ratio;
    if (n_vis > 0 && (n_vis - 1) / a.block_size == b) m = INFINITY;
    a.block_scores[idx] = m;
    a.keep[idx] = 0;
  }
}

__global__ void keep_kernel(CandidateArgs a, int64_t nb, int64_t k) {
  const int64_t total = a.n * k;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / k;
    const int32_t b = a.block_sel[idx];
    if (b >= 0 && a.block_scores[t * nb + b] > -INFINITY) a.keep[t * nb + b] = 1;
  }
}

__global__ void candidate_mask_kernel(CandidateMaskArgs a) {
  const int64_t lim = a.T < a.width ? a.T : a.width, nb = (a.width + a.block_size - 1) / a.block_size;
  const int64_t total = a.n * lim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / lim, u = idx % lim;
    if (!a.keep[t * nb + u / a.block_size]) a.scores[t * a.T + u] = -INFINITY;
  }
}

unsigned elem_grid(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

namespace raw {
cudaError_t indexer_scores(const IndexerArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.T == 0) return cudaSuccess;
  const int64_t per_block = kWarps * kEntriesPerWarp;
  const dim3 grid(static_cast<unsigned>((a.T + per_block - 1) / per_block), static_cast<unsigned>(a.n));
  const size_t smem = static_cast<size_t>(a.heads * a.head_dim + a.heads) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  indexer_kernel<<<grid, kWarps * 32, smem, s>>>(a);
  return cudaGetLastError();
}
cudaError_t candidate_blocks(const CandidateArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.T == 0) return cudaSuccess;
  const int64_t nb = (a.T + a.block_size - 1) / a.block_size;
  const int64_t k = a.topk_blocks < nb ? a.topk_blocks : nb;
  block_scores_kernel<<<elem_grid(a.n * nb), 256, 0, s>>>(a, nb);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  TopkArgs tk;
  tk.values = a.block_scores;
  tk.rows = a.n;
  tk.n = nb;
  tk.stride = nb;
  tk.k = k;
  tk.out = a.block_sel;
  e = topk_sorted(tk, s);
  if (e != cudaSuccess) return e;
  keep_kernel<<<elem_grid(a.n * k), 256, 0, s>>>(a, nb, k);
  return cudaGetLastError();
}
cudaError_t candidate_mask(const CandidateMaskArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.T == 0 || a.width == 0) return cudaSuccess;
  candidate_mask_kernel<<<elem_grid(a.n * (a.T < a.width ? a.T : a.width)), 256, 0, s>>>(a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
