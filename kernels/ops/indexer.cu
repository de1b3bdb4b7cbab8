// Indexer scoring (MODEL.md §5.4): s_u = bf16( Σ_h bf16( relu(bf16(q_h·K_u)) · w_h ) ) for visible
// entries, -inf beyond the query's visible count. The tiled kernel stages a tile of keys (fp32,
// k-major) and the query's heads in shared memory; each thread runs the dot.h fma chains of BH heads
// x BK keys side by side (k ascending, one chain per 256-wide K block, blocks added in order; 4 x 4
// on 64-key tiles for long scans, 2 x 2 on 16-key tiles for short decode scans), then one thread
// per key adds the head terms in head order. The warp kernel (one warp per entry, lanes
// take heads) remains for shapes the tiled one does not take.
// Plus the level-1 candidate blocks of the candidate source and their mask on later layers.
#include <algorithm>
#include <cmath>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kEntriesPerWarp = 8;
constexpr int kMaxHeadsPerLane = 4;  // up to 128 heads

__global__ void indexer_kernel(IndexerArgs a) {
  dev::pdl_enter();
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

// ---- tiled kernel ---------------------------------------------------------------------------------
// Template parameters: TILE keys per tile, each thread runs BH heads x BK keys of chains. Large
// scans take 64-key tiles of 4 x 4 (few shared-memory loads per fma); short decode scans take
// 16-key tiles of 2 x 2, so that a few thousand keys still spread over most SMs and each thread's
// serial work (BH·BK chains of head_dim fmas) is short.
constexpr int kTileHeadsMax = 128;
constexpr size_t kTiledMaxSmem = 200 * 1024;

struct TiledLayout {
  int64_t hp, qs, ts, threads;  // padded heads, q row stride, term row stride, block size
  size_t q, kt, terms, total;   // byte offsets
};
template <int TILE, int BH, int BK>
__host__ __device__ inline TiledLayout tiled_layout(int64_t heads, int64_t hd) {
  constexpr int kKeyGroups = TILE / BK;  // threads per head group of BH
  TiledLayout L;
  L.hp = (heads + BH - 1) / BH * BH;
  L.qs = hd + 4;  // 16-byte rows; two head groups in one warp land on different banks
  L.ts = L.hp + 1;
  L.threads = L.hp / BH * kKeyGroups < 64 ? 64 : L.hp / BH * kKeyGroups;
  L.q = 0;
  L.kt = L.q + static_cast<size_t>(L.hp * L.qs) * 4;
  L.terms = L.kt;  // the head terms reuse the key tile once every dot is in registers
  const size_t kt_bytes = static_cast<size_t>(hd * TILE) * 4, terms_bytes = static_cast<size_t>(TILE * L.ts) * 4;
  L.total = L.kt + (kt_bytes > terms_bytes ? kt_bytes : terms_bytes);
  return L;
}

template <int BK>
__device__ __forceinline__ void load_keys(const float* p, float (&kv)[BK]) {
  if constexpr (BK == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    kv[0] = v.x, kv[1] = v.y, kv[2] = v.z, kv[3] = v.w;
  } else if constexpr (BK == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    kv[0] = v.x, kv[1] = v.y;
  } else {
#pragma unroll
    for (int j = 0; j < BK; ++j) kv[j] = p[j];
  }
}

template <int TILE, int BH, int BK>
__global__ void __launch_bounds__(512) indexer_tiled_kernel(IndexerArgs a) {
  constexpr int kKeyGroups = TILE / BK;
  static_assert(TILE % BK == 0 && (BK == 2 || BK == 4) && BH >= 1, "key groups of 2 or 4");
  dev::pdl_enter();
  extern __shared__ __align__(16) unsigned char raw_smem[];
  const int64_t hd = a.head_dim, H = a.heads;
  const TiledLayout L = tiled_layout<TILE, BH, BK>(H, hd);
  float* q = reinterpret_cast<float*>(raw_smem + L.q);          // [hp][qs]
  float* kt = reinterpret_cast<float*>(raw_smem + L.kt);        // [hd][TILE]
  float* terms = reinterpret_cast<float*>(raw_smem + L.terms);  // [TILE][ts]
  const int64_t t = blockIdx.y;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  {
    // The query's heads, 4 values per load, 8 loads in flight per thread (a plain loop would wait
    // for every load in turn).
    const int hd4 = static_cast<int>(hd / 4), total = static_cast<int>(L.hp) * hd4, qs = static_cast<int>(L.qs);
    const float4* src = reinterpret_cast<const float4*>(a.qi + t * H * hd);
    for (int base = tid; base < total; base += 8 * nthreads) {
      float4 r[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * nthreads;
        r[u] = i < total && i / hd4 < H ? src[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * nthreads;
        if (i < total) *reinterpret_cast<float4*>(q + (i / hd4) * qs + (i % hd4) * 4) = r[u];
      }
    }
  }
  const int64_t n_vis = (a.start + t + 1) / a.ratio;
  const int64_t ntiles = (a.T + TILE - 1) / TILE;
  const int hg = tid / kKeyGroups, ug = tid % kKeyGroups;
  const bool computes = hg < L.hp / BH;
  // Key tile staging: vector v (8 values) of the tile is key v % TILE, values 8·(v / TILE)..
  // The first kPrefetch·nthreads vectors of the next tile are loaded into registers while this tile
  // computes; any further ones (long head_dim, few heads) are loaded when stored.
  constexpr int kPrefetch = 8;
  const int64_t vecs = TILE * hd / 8;
  auto load_vec = [&](int64_t u0, int64_t v) {
    const int64_t u = u0 + v % TILE;
    if (v < vecs && a.keys && u < a.n_keys && u0 < n_vis)
      return __ldg(reinterpret_cast<const uint4*>(a.keys + u * hd + (v / TILE) * 8));
    return make_uint4(0, 0, 0, 0);  // rows past n_keys are zeros (their dots are replaced by 0 below)
  };
  auto store_vec = [&](int64_t v, uint4 raw) {
    const int64_t uu = v % TILE, k0 = (v / TILE) * 8;
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      kt[(k0 + 2 * e) * TILE + uu] = __uint_as_float(w[e] << 16);
      kt[(k0 + 2 * e + 1) * TILE + uu] = __uint_as_float(w[e] & 0xffff0000u);
    }
  };
  uint4 pre[kPrefetch];
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) pre[i] = load_vec(static_cast<int64_t>(blockIdx.x) * TILE, tid + i * nthreads);
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int64_t u0 = tile * TILE;
    if (u0 >= n_vis) {  // nothing visible in this tile (uniform over the block)
      for (int64_t uu = tid; uu < TILE && u0 + uu < a.T; uu += nthreads) a.scores[t * a.T + u0 + uu] = -INFINITY;
      continue;
    }
    __syncthreads();  // previous tile's readers of kt and terms are done
#pragma unroll
    for (int i = 0; i < kPrefetch; ++i)
      if (tid + i * nthreads < vecs) store_vec(tid + i * nthreads, pre[i]);
    for (int64_t v = tid + kPrefetch * nthreads; v < vecs; v += nthreads) store_vec(v, load_vec(u0, v));
    const int64_t next_u0 = (tile + gridDim.x) * TILE;
#pragma unroll
    for (int i = 0; i < kPrefetch; ++i) pre[i] = load_vec(next_u0, tid + i * nthreads);
    __syncthreads();
    float dot[BH][BK];
#pragma unroll
    for (int i = 0; i < BH; ++i)
#pragma unroll
      for (int j = 0; j < BK; ++j) dot[i][j] = 0.0f;
    if (computes) {
      const float* qh = q + (BH * hg) * L.qs;
      for (int64_t kb = 0; kb < hd; kb += dev::kGemmKBlock) {
        const int64_t ke = kb + dev::kGemmKBlock < hd ? kb + dev::kGemmKBlock : hd;
        float acc[BH][BK];
#pragma unroll
        for (int i = 0; i < BH; ++i)
#pragma unroll
          for (int j = 0; j < BK; ++j) acc[i][j] = 0.0f;
        for (int64_t k = kb; k < ke; k += 4) {
          float qv[BH][4];
#pragma unroll
          for (int i = 0; i < BH; ++i) {
            const float4 v = *reinterpret_cast<const float4*>(qh + i * L.qs + k);
            qv[i][0] = v.x, qv[i][1] = v.y, qv[i][2] = v.z, qv[i][3] = v.w;
          }
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            float kv[BK];
            load_keys<BK>(kt + (k + kk) * TILE + BK * ug, kv);
#pragma unroll
            for (int i = 0; i < BH; ++i)
#pragma unroll
              for (int j = 0; j < BK; ++j) acc[i][j] = fmaf(qv[i][kk], kv[j], acc[i][j]);
          }
        }
#pragma unroll
        for (int i = 0; i < BH; ++i)
#pragma unroll
          for (int j = 0; j < BK; ++j) dot[i][j] = __fadd_rn(dot[i][j], acc[i][j]);
      }
    }
    __syncthreads();  // the key tile is read: its space takes the head terms
    if (computes) {
#pragma unroll
      for (int i = 0; i < BH; ++i) {
        const int64_t h = BH * hg + i;
        if (h >= H) continue;
        const float wh = a.w[t * H + h];
#pragma unroll
        for (int j = 0; j < BK; ++j) {
          const int64_t uu = BK * ug + j;
          const float bd = dev::bf16_round(u0 + uu < a.n_keys ? dot[i][j] : 0.0f);
          const float rl = bd < 0.0f ? 0.0f : bd;  // std::max(bd, 0): -0 and NaN pass through
          terms[uu * L.ts + h] = dev::bf16_round(__fmul_rn(rl, wh));
        }
      }
    }
    __syncthreads();
    for (int64_t uu = tid; uu < TILE; uu += nthreads) {
      const int64_t u = u0 + uu;
      if (u >= a.T) continue;
      float acc = -INFINITY;
      if (u < n_vis) {
        acc = 0.0f;
        for (int64_t h = 0; h < H; ++h) acc = __fadd_rn(acc, terms[uu * L.ts + h]);
        acc = dev::bf16_round(acc);
      }
      a.scores[t * a.T + u] = acc;
    }
  }
}

// The score of block b of query t: the maximum of its scores (std::max's rule: a NaN never
// replaces the running value), the block holding entry n_vis-1 pinned to +inf.
__device__ __forceinline__ float block_score(const CandidateArgs& a, int64_t t, int64_t b) {
  float m = -INFINITY;
  for (int64_t u = b * a.block_size; u < (b + 1) * a.block_size && u < a.T; ++u) {
    const float v = a.scores[t * a.T + u];
    m = m < v ? v : m;
  }
  const int64_t n_vis = (a.start + t + 1) / a.ratio;
  if (n_vis > 0 && (n_vis - 1) / a.block_size == b) m = INFINITY;
  return m;
}

__global__ void block_scores_kernel(CandidateArgs a, int64_t nb) {
  dev::pdl_enter();
  const int64_t total = a.n * nb;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    a.block_scores[idx] = block_score(a, idx / nb, idx % nb);
  }
  const int64_t words = a.n * keep_words(nb);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < words;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    a.keep[idx] = 0;
}

// A selected block is kept unless its score is -inf (recomputed from the scores: the selection
// may have written keys over the block scores).
__global__ void keep_kernel(CandidateArgs a, int64_t nb, int64_t k) {
  dev::pdl_enter();
  const int64_t total = a.n * k;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / k;
    const int32_t b = a.block_sel[idx];
    if (b >= 0 && block_score(a, t, b) > -INFINITY) atomicOr(&a.keep[t * keep_words(nb) + b / 32], 1u << (b % 32));
  }
}

__global__ void candidate_mask_kernel(CandidateMaskArgs a) {
  dev::pdl_enter();
  const int64_t lim = a.T < a.width ? a.T : a.width, nb = (a.width + a.block_size - 1) / a.block_size;
  const int64_t total = a.n * lim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / lim, b = idx % lim / a.block_size;
    if (!(a.keep[t * keep_words(nb) + b / 32] >> (b % 32) & 1u)) a.scores[t * a.T + idx % lim] = -INFINITY;
  }
}

unsigned elem_grid(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

// One tiled variant at about blocks_per_sm blocks per SM in all; each block loops over its share of
// the tiles (the query's heads staged once per block, the next tile's keys loaded while this one
// computes).
template <int TILE, int BH, int BK>
cudaError_t indexer_tiled_launch(const IndexerArgs& a, int blocks_per_sm, cudaStream_t s) {
  if (a.n == 0 || a.T == 0) return cudaSuccess;
  if (a.heads < 1 || a.heads > kTileHeadsMax || a.head_dim < 8 || a.head_dim % 8 != 0 || a.n > 65535 ||
      reinterpret_cast<uintptr_t>(a.qi) % 16 != 0)
    return cudaErrorNotSupported;
  static int sms[64] = {};
  static int configured[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64) return cudaErrorNotSupported;
  if (sms[dev] == 0) {
    e = cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  const TiledLayout L = tiled_layout<TILE, BH, BK>(a.heads, a.head_dim);
  // The shared-memory opt-in is raised once to the largest supported layout, or to all the device
  // gives a block where that is less (GB10), at the first launch, so later launches, e.g. inside a
  // graph capture, never change it.
  const size_t most = std::min(kTiledMaxSmem, max_dynamic_smem(indexer_tiled_kernel<TILE, BH, BK>));
  if (L.total > most) return cudaErrorNotSupported;
  if (!configured[dev]) {
    e = raise_dynamic_smem(indexer_tiled_kernel<TILE, BH, BK>, most);
    if (e != cudaSuccess) return e;
    configured[dev] = 1;
  }
  const int64_t ntiles = (a.T + TILE - 1) / TILE;
  int64_t gx = (blocks_per_sm * static_cast<int64_t>(sms[dev]) + a.n - 1) / a.n;
  gx = gx < ntiles ? gx : ntiles;
  const dim3 grid(static_cast<unsigned>(gx < 1 ? 1 : gx), static_cast<unsigned>(a.n));
  launch_pdl(indexer_tiled_kernel<TILE, BH, BK>, grid, static_cast<unsigned>(L.threads), L.total, s, a);
  return cudaGetLastError();
}

// Variant 0: 64-key tiles of 4 x 4 chains per thread, about eight blocks per SM (two waves at the
// real shapes' four resident blocks); 1: the same at four blocks per SM (one resident wave, two or
// more tiles per block); 2: 16-key tiles of 2 x 2 chains (short decode scans).
constexpr int kIndexerVariants = 3;
const char* const kIndexerVariantNames[kIndexerVariants] = {"tile64x4x4", "tile64x4x4-wave", "tile16x2x2"};
cudaError_t indexer_variant_launch(const IndexerArgs& a, int v, cudaStream_t s) {
  switch (v) {
    case 0: return indexer_tiled_launch<64, 4, 4>(a, 8, s);
    case 1: return indexer_tiled_launch<64, 4, 4>(a, 4, s);
    case 2: return indexer_tiled_launch<16, 2, 2>(a, 8, s);
    default: return cudaErrorNotSupported;
  }
}
// The variant for a scan of n queries x T keys (bench_gpu_attention measures all of them).
int indexer_choice(const IndexerArgs& a) { return a.n * a.T <= 8192 ? 2 : 0; }

}  // namespace

namespace raw {
cudaError_t indexer_scores_tiled(const IndexerArgs& a, cudaStream_t s) { return indexer_variant_launch(a, indexer_choice(a), s); }
int indexer_scores_tiled_variants() { return kIndexerVariants; }
const char* indexer_scores_tiled_variant_name(int v) { return v >= 0 && v < kIndexerVariants ? kIndexerVariantNames[v] : "?"; }
cudaError_t indexer_scores_tiled_variant(const IndexerArgs& a, int v, cudaStream_t s) { return indexer_variant_launch(a, v, s); }

cudaError_t indexer_scores(const IndexerArgs& a, cudaStream_t s) {
  const cudaError_t e = indexer_scores_tiled(a, s);
  if (e != cudaErrorNotSupported) return e;
  return indexer_scores_warp(a, s);
}

cudaError_t indexer_scores_warp(const IndexerArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.T == 0) return cudaSuccess;
  const int64_t per_block = kWarps * kEntriesPerWarp;
  const dim3 grid(static_cast<unsigned>((a.T + per_block - 1) / per_block), static_cast<unsigned>(a.n));
  const size_t smem = static_cast<size_t>(a.heads * a.head_dim + a.heads) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e = raise_dynamic_smem(indexer_kernel, smem);
    if (e != cudaSuccess) return e;
  }
  launch_pdl(indexer_kernel, grid, kWarps * 32, smem, s, a);
  return cudaGetLastError();
}
cudaError_t candidate_blocks(const CandidateArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.T == 0) return cudaSuccess;
  const int64_t nb = (a.T + a.block_size - 1) / a.block_size;
  const int64_t k = a.topk_blocks < nb ? a.topk_blocks : nb;
  launch_pdl(block_scores_kernel, elem_grid(a.n * nb), 256, 0, s, a, nb);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  TopkReplayArgs tk;  // the reference's block selection, ties included
  tk.values = a.block_scores;
  tk.idx = a.block_idx;
  tk.rows = a.n;
  tk.n = nb;
  tk.stride = nb;
  tk.k = k;
  tk.out = a.block_sel;
  e = topk_replay(tk, s);
  if (e != cudaSuccess) return e;
  launch_pdl(keep_kernel, elem_grid(a.n * k), 256, 0, s, a, nb, k);
  return cudaGetLastError();
}
cudaError_t candidate_mask(const CandidateMaskArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.T == 0 || a.width == 0) return cudaSuccess;
  launch_pdl(candidate_mask_kernel, elem_grid(a.n * (a.T < a.width ? a.T : a.width)), 256, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
