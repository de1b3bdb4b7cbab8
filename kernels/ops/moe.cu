// MoE pieces (MODEL.md §5.5): the router (fp32 gate GEMV, sqrtsoftplus or sigmoid scores, biased
// top-k for selection, unbiased weights renormalised and scaled), the clamped SwiGLU with the
// routing weight, and the combine (routed outputs added in increasing expert id, then the shared
// expert, one bf16 rounding).
//
// The gate GEMV stages the gate row and the token in shared memory (chain_swizzle layout) and runs
// each 256-wide K block's fma chain on its own thread (2 to 4 tokens: one block per expert, each
// thread running its K block's chains of all of them; prefill passes of 64 or more tokens: the
// register-tiled chain GEMM of ops/chain_gemm.cuh); selection keeps each lane's candidate
// scores in registers; the combine finds the expert-id order once per block. All keep the
// reference's order and rounding.
#include "ops/act_quant.cuh"
#include "ops/chain_gemm.cuh"
#include "ops/moe_combine.cuh"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/staged_chain.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kRouterWarps = 8;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopk = 32;  // the host check on RouterArgs::top_k (gpu_ops.cpp)
static_assert(kMaxTopk <= 32, "router_select_kernel keeps round i's pick in lane i");
constexpr int kScoreThreads = 128;
constexpr int kCombineThreads = 256;
constexpr int kMaxCombineTopk = 256;

// The router's score of (token t, expert e) from its gate logit z (CpuModel::Impl::moe): written
// unbiased and biased into the token's scratch row.
__device__ __forceinline__ void store_score(const RouterArgs& a, int64_t t, int64_t e, float z) {
  z = __fdiv_rn(z, a.temp);
  float s;
  if (a.scoring == Scoring::Sigmoid) {
    s = dev::sigmoid_ref(z);
  } else {
    const float sp = z > 20.0f ? z : dev::log1p_ref(dev::exp_ref(z));
    s = __fsqrt_rn(sp);
  }
  a.scratch[t * 2 * a.n_experts + e] = s;
  a.scratch[t * 2 * a.n_experts + a.n_experts + e] = __fadd_rn(s, a.gate_bias[e]);
}

// Scores of expert blockIdx.x for tokens_per_block consecutive tokens: the gate row is staged once,
// then each token; thread b runs K block b's chain (gemm_dot_f32), thread 0 adds the blocks in K
// order from zero.
// The gate row (a weight: no kernel writes it) is requested before the wait for the previous
// kernel: with PDL the 384 CTAs of a decode step copy the whole gate while the one-CTA norm before
// them runs (H200 decode step: 7.9 -> 6.3 us from the norm's end; without PDL +0.5 us, two staging
// rounds). Both rows go in by cp.async and the chains run on immediate-offset loads
// (staged_chain.cuh) rather than swizzled_chain_dot's 64-bit per-step address arithmetic.
__global__ void __launch_bounds__(kScoreThreads) router_scores_staged_kernel(RouterArgs a, int64_t tokens_per_block) {
  extern __shared__ float4 smem_f4[];
  const int64_t e = blockIdx.x;
  const int dim = static_cast<int>(a.dim), rows = static_cast<int>(dev::chain_rows_size(a.dim));
  const int blocks = (dim + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  float* sw = reinterpret_cast<float*>(smem_f4);
  float* sx = sw + rows;
  float* part = sx + rows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * tokens_per_block;
  const int64_t t1 = t0 + tokens_per_block < a.n ? t0 + tokens_per_block : a.n;
  dev::stage_swizzled_async(sw, a.gate_w + e * a.dim, dim);
  dev::pdl_enter();
  for (int64_t t = t0; t < t1; ++t) {
    dev::stage_swizzled_async(sx, a.x + t * a.dim, dim);
    dev::cp_async_wait_all();
    __syncthreads();
    for (int b = threadIdx.x; b < blocks; b += kScoreThreads) {
      const int k0 = b * dev::kGemmKBlock, k1 = k0 + dev::kGemmKBlock < dim ? k0 + dev::kGemmKBlock : dim;
      part[b] = dev::staged_chain_dot(sw, sx, k0, k1);
    }
    __syncthreads();  // also: the next token's staging starts after every chain has read sx
    if (threadIdx.x == 0) store_score(a, t, e, dev::ordered_sum(0.0f, part, blocks));
  }
}

// Decode batches of 2 to kScoreMultiMaxTokens tokens: one block per expert for all N tokens (the
// one-token kernel would take N blocks per expert, each staging the gate row again: at N = 4, 1536
// blocks in ~2.3 waves of 5 per SM). The gate row and the N token rows are staged once; thread b
// runs K block b's N chains together (staged_chain_block_multi: each gate value loaded once, the N
// independent chains interleaved), each chain the same fma sequence from zero as the one-token
// kernel's; thread r < N then adds token r's blocks in K order from zero.
constexpr int kScoreMultiMaxTokens = 4;
template <int N>
__global__ void __launch_bounds__(kScoreThreads) router_scores_multi_kernel(RouterArgs a) {
  extern __shared__ float4 smem_f4[];
  const int64_t e = blockIdx.x;
  const int dim = static_cast<int>(a.dim), rows = static_cast<int>(dev::chain_rows_size(a.dim));
  const int blocks = (dim + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  float* sw = reinterpret_cast<float*>(smem_f4);
  float* sx = sw + rows;  // N rows of `rows` floats
  float* part = sx + N * rows;  // [N][blocks]
  dev::stage_swizzled_async(sw, a.gate_w + e * a.dim, dim);
  dev::pdl_enter();
#pragma unroll
  for (int r = 0; r < N; ++r) dev::stage_swizzled_async(sx + r * rows, a.x + r * a.dim, dim);
  dev::cp_async_wait_all();
  __syncthreads();
  for (int b = threadIdx.x; b < blocks; b += kScoreThreads) {
    const int k0 = b * dev::kGemmKBlock, k1 = k0 + dev::kGemmKBlock < dim ? k0 + dev::kGemmKBlock : dim;
    if (k1 - k0 == dev::kGemmKBlock) {
      float acc[N];
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r] = 0.0f;
      dev::staged_chain_block_multi<N>(sw, sx, rows, b, acc);
#pragma unroll
      for (int r = 0; r < N; ++r) part[r * blocks + b] = acc[r];
    } else {
#pragma unroll
      for (int r = 0; r < N; ++r) part[r * blocks + b] = dev::staged_chain_dot(sw, sx + r * rows, k0, k1);
    }
  }
  __syncthreads();
  if (threadIdx.x < N) store_score(a, threadIdx.x, e, dev::ordered_sum(0.0f, part + threadIdx.x * blocks, blocks));
}

// Prefill passes (n >= kScoreTiledMinTokens): the gate logits as one register-tiled chain GEMM
// (ops/chain_gemm.cuh) over tiles of RouterTile::T tokens x RouterTile::R experts: each 256-wide
// K block's fma chain from zero (gemm_dot_f32), the blocks added in K order from zero, then
// store_score.
constexpr int64_t kScoreTiledMinTokens = 64;
constexpr int kScoreTiledMaxWarps = 5;
using RouterTile = dev::ChainTile<4, 4>;
__global__ void router_scores_tiled_kernel(RouterArgs a) {
  dev::pdl_enter();
  extern __shared__ float4 smem_f4[];
  constexpr int T = RouterTile::T, R = RouterTile::R;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * T, e0 = static_cast<int64_t>(blockIdx.y) * R;
  const int64_t blocks = (a.dim + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  auto range = [&](int64_t p, int64_t& k0, int64_t& k1) {
    k0 = p * dev::kGemmKBlock;
    k1 = k0 + dev::kGemmKBlock < a.dim ? k0 + dev::kGemmKBlock : a.dim;
  };
  const float* tot = dev::chain_tile_totals<4, 4>(a.x, a.n, a.gate_w, a.n_experts, a.dim, t0, e0, blocks, range, false,
                                                  reinterpret_cast<float*>(smem_f4));
  for (int o = threadIdx.x; o < T * R; o += blockDim.x) {
    const int64_t t = t0 + o / R, e = e0 + o % R;
    if (t < a.n && e < a.n_experts) store_score(a, t, e, tot[o]);
  }
}

// Scores of every (token, expert): one warp per expert, many blocks per token.
__global__ void router_scores_kernel(RouterArgs a) {
  dev::pdl_enter();
  const int64_t t = blockIdx.y;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kRouterWarps + threadIdx.x / 32;
  if (e >= a.n_experts) return;
  const float* x = a.x + t * a.dim;
  const float* w = a.gate_w + e * a.dim;
  const float z = dev::warp_gemm_dot([&](int64_t k) { return w[k]; }, [&](int64_t k) { return x[k]; }, a.dim);
  if ((threadIdx.x & 31) == 0) store_score(a, t, e, z);
}

// The selection key of a biased score: unsigned order = the selection's order of values (NaN above
// everything, -0 equal to +0, otherwise larger first). 0 is no real value's key (a negative value's
// key is at least ~bits(-inf) = 0x007fffff), so it marks a taken or absent expert.
__device__ __forceinline__ uint32_t select_key(float v) {
  if (isnan(v)) return 0xffffffffu;
  const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Selection of one token: one warp, top-k by repeated warp argmax (larger value first, NaN above
// everything, lower id on ties), then the unbiased weights in selection order.
// Lane l holds the keys (select_key) and unbiased scores of experts l, l+32, ... in registers
// (loaded once, all in flight) and its best untaken candidate (the lowest id among its largest
// keys). A round is two warp reductions (redux.sync: the largest key, then the lowest id holding it)
// in place of five shuffle steps of three values each; only the winner's lane rescans its
// candidates. Lane i keeps round i's expert and score and writes them; the weight sum runs in
// selection order in every lane. (H200, one token of 384 experts, top 6: was 7.3 us own time.)
template <int kPerLane>
__global__ void router_select_kernel(RouterArgs a) {
  dev::pdl_enter();
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const float* score = a.scratch + t * 2 * a.n_experts;
  const float* biased = score + a.n_experts;
  const int n_experts = static_cast<int>(a.n_experts), top_k = static_cast<int>(a.top_k);
  uint32_t key[kPerLane];
  float svals[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    key[j] = e < n_experts ? select_key(biased[e]) : 0u;
    svals[j] = e < n_experts ? score[e] : 0.0f;
  }
  uint32_t best_key = 0;
  int best_j = 0;
  float best_s = 0.0f;
  auto rescan = [&] {  // strict >: the first (lowest id) of equal keys
    best_key = 0;
    best_j = 0;
    best_s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (key[j] > best_key) best_key = key[j], best_j = j, best_s = svals[j];
  };
  rescan();
  int my_sel = -1;
  float my_score = 0.0f, sum = 0.0f;
  for (int i = 0; i < top_k; ++i) {
    const uint32_t top = __reduce_max_sync(dev::kFull, best_key);
    int sel = -1;
    float sel_score = 0.0f;
    if (top != 0) {
      sel = static_cast<int>(__reduce_min_sync(dev::kFull, best_key == top ? static_cast<uint32_t>(lane + 32 * best_j) : 0xffffffffu));
      sel_score = __shfl_sync(dev::kFull, best_s, sel & 31);
      if ((sel & 31) == lane) {
#pragma unroll
        for (int j = 0; j < kPerLane; ++j)
          if (j == best_j) key[j] = 0;
        rescan();
      }
    }
    sum = __fadd_rn(sum, sel_score);
    if (lane == i) my_sel = sel, my_score = sel_score;
  }
  if (lane >= top_k) return;
  float w = my_score;
  if (a.norm_topk && top_k > 1) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
  w = __fmul_rn(w, a.route_scale);
  a.ids[t * a.top_k + lane] = my_sel;
  a.weights[t * a.top_k + lane] = w;
}

__global__ void swiglu_kernel(SwigluArgs a) {
  dev::pdl_enter();
  const int64_t total = a.rows * a.inter;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g = a.g[idx], u = a.u[idx];
    if (a.limit > 0.0f) {
      u = dev::clampf(u, -a.limit, a.limit);
      g = fminf(g, a.limit);
    }
    float act = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, dev::exp_ref(-g))), u);
    if (a.row_weight) act = __fmul_rn(a.row_weight[idx / a.inter], act);
    const float v = dev::bf16_round(act);
    a.out[idx] = v;
    // ActQuant8 of the output row for the down projection: with inter % 32 == 0 and a block size
    // and grid stride that are multiples of 32, a warp's 32 consecutive idx are one 32-block of
    // one row and the whole warp is inside `total` or outside it. The rows are contiguous, so
    // element idx's code is codes[idx] and its block's scale scales[idx / 32].
    if (a.codes) dev::act_quant8_store(v, 0, idx, a.inter, a.codes, a.scales);
  }
}

__global__ void moe_combine_kernel(MoeCombineArgs a) {
  dev::pdl_enter();
  const int64_t total = a.n * a.dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.dim, d = idx % a.dim;
    // slots in increasing expert id
    const float y = dev::combine_routed(a.routed, a.ids + t * a.top_k, a.top_k, a.dim, t, d);
    a.out[idx] = dev::bf16_round(__fadd_rn(y, a.shared[idx]));
  }
}

// Combine of token blockIdx.y, columns of block blockIdx.x: the slot order (distinct expert ids
// >= 0 increasing, the first slot of each id, as the repeated minimum of moe_combine_kernel picks
// them) is found once per block; each thread then adds its column's routed rows in that order.
__global__ void __launch_bounds__(kCombineThreads) moe_combine_ordered_kernel(MoeCombineArgs a) {
  dev::pdl_enter();
  __shared__ int32_t ids[kMaxCombineTopk];
  __shared__ int32_t order[kMaxCombineTopk];
  const int64_t t = blockIdx.y, d = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  const int tk = static_cast<int>(a.top_k);
  for (int i = threadIdx.x; i < tk; i += kCombineThreads) ids[i] = a.ids[t * a.top_k + i];
  __syncthreads();
  int used = 0;
  for (int i = threadIdx.x; i < tk; i += kCombineThreads) {
    const int e = ids[i];
    bool first = e >= 0;
    for (int j = 0; j < i && first; ++j) first = ids[j] != e;
    if (!first) continue;
    ++used;
    int pos = 0;  // distinct ids >= 0 below e
    for (int j = 0; j < tk; ++j) {
      const int o = ids[j];
      if (o < 0 || o >= e) continue;
      bool fo = true;
      for (int q = 0; q < j && fo; ++q) fo = ids[q] != o;
      pos += fo ? 1 : 0;
    }
    order[pos] = i;
  }
  const int count = __syncthreads_count(used);
  if (d >= a.dim) return;
  const float* routed = a.routed + t * a.top_k * a.dim + d;
  float y = 0.0f;
  // a batch's loads all in flight before its adds (the adds in slot order, as one by one)
  constexpr int kBatch = 8;
  for (int s0 = 0; s0 < count; s0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = s0 + u < count ? routed[static_cast<int64_t>(order[s0 + u]) * a.dim] : 0.0f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (s0 + u < count) y = __fadd_rn(y, v[u]);
  }
  a.out[t * a.dim + d] = dev::bf16_round(__fadd_rn(y, a.shared[t * a.dim + d]));
}

unsigned elem_grid(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

// The selection kernel for the expert count (registers for 32 candidates per lane at most).
void launch_select(const RouterArgs& b, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>(b.n);
  if (b.n_experts <= 128) launch_pdl(router_select_kernel<4>, grid, 32, 0, s, b);
  else if (b.n_experts <= 512) launch_pdl(router_select_kernel<16>, grid, 32, 0, s, b);
  else launch_pdl(router_select_kernel<kMaxExperts / 32>, grid, 32, 0, s, b);
}

template <int N>
cudaError_t launch_scores_multi(const RouterArgs& a, size_t smem, cudaStream_t s) {
  const cudaError_t e = allow_dynamic_smem<router_scores_multi_kernel<N>>(smem);
  if (e != cudaSuccess) return e;
  launch_pdl(router_scores_multi_kernel<N>, static_cast<unsigned>(a.n_experts), kScoreThreads, smem, s, a);
  return cudaGetLastError();
}

}  // namespace

namespace raw {
cudaError_t router(const RouterArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  const int64_t rows = (a.dim + 255) / 256 * 256, k_blocks = (a.dim + dev::kGemmKBlock - 1) / dev::kGemmKBlock;  // chain_rows_size
  // 2 to 4 tokens (decode batches): every token's scores from one block per expert
  const size_t multi_smem = static_cast<size_t>((1 + a.n) * rows + a.n * k_blocks) * sizeof(float);
  const bool multi = a.n == 2   ? staged_smem_fits<router_scores_multi_kernel<2>>(multi_smem)
                     : a.n == 3 ? staged_smem_fits<router_scores_multi_kernel<3>>(multi_smem)
                     : a.n == 4 ? staged_smem_fits<router_scores_multi_kernel<4>>(multi_smem)
                                : false;
  static_assert(kScoreMultiMaxTokens == 4);
  if (multi) {
    const cudaError_t e = a.n == 2   ? launch_scores_multi<2>(a, multi_smem, s)
                          : a.n == 3 ? launch_scores_multi<3>(a, multi_smem, s)
                                     : launch_scores_multi<4>(a, multi_smem, s);
    if (e != cudaSuccess) return e;
    launch_select(a, s);
    return cudaGetLastError();
  }
  // other decode-sized batches: one token per block (all in parallel); larger ones share each staged
  // gate row between 8 tokens
  const int64_t tokens_per_block = a.n <= 8 ? 1 : 8;
  const size_t staged_smem = static_cast<size_t>(2 * rows + k_blocks) * sizeof(float);
  const bool staged = staged_smem_fits<router_scores_staged_kernel>(staged_smem);
  const int tiled_warps = dev::chain_warps(k_blocks, kScoreTiledMaxWarps);
  const size_t tiled_smem = static_cast<size_t>(RouterTile::smem_floats(tiled_warps)) * sizeof(float);
  const bool tiled =
      a.n >= kScoreTiledMinTokens && k_blocks > 0 && staged_smem_fits<router_scores_tiled_kernel>(tiled_smem);
  if (tiled) {  // every token's scores in one launch; the selection below per slice
    cudaError_t e = allow_dynamic_smem<router_scores_tiled_kernel>(tiled_smem);
    if (e != cudaSuccess) return e;
    const dim3 grid(static_cast<unsigned>((a.n + RouterTile::T - 1) / RouterTile::T),
                    static_cast<unsigned>((a.n_experts + RouterTile::R - 1) / RouterTile::R));
    launch_pdl(router_scores_tiled_kernel, grid, tiled_warps * 32, tiled_smem, s, a);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (staged && !tiled) {
    const cudaError_t e = allow_dynamic_smem<router_scores_staged_kernel>(staged_smem);
    if (e != cudaSuccess) return e;
  }
  // grid.y is limited to 65535 tokens: longer batches run in slices
  for (int64_t t0 = 0; t0 < a.n; t0 += 65535) {
    RouterArgs b = a;
    b.n = a.n - t0 < 65535 ? a.n - t0 : 65535;
    b.x = a.x + t0 * a.dim;
    b.ids = a.ids + t0 * a.top_k;
    b.weights = a.weights + t0 * a.top_k;
    b.scratch = a.scratch + t0 * 2 * a.n_experts;
    if (tiled) {
      // scores made above
    } else if (staged) {
      const dim3 grid(static_cast<unsigned>(a.n_experts), static_cast<unsigned>((b.n + tokens_per_block - 1) / tokens_per_block));
      launch_pdl(router_scores_staged_kernel, grid, kScoreThreads, staged_smem, s, b, tokens_per_block);
    } else {
      const dim3 grid(static_cast<unsigned>((a.n_experts + kRouterWarps - 1) / kRouterWarps), static_cast<unsigned>(b.n));
      launch_pdl(router_scores_kernel, grid, kRouterWarps * 32, 0, s, b);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    launch_select(b, s);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t swiglu(const SwigluArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  launch_pdl(swiglu_kernel, elem_grid(a.rows * a.inter), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t moe_combine(const MoeCombineArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  if (a.top_k > kMaxCombineTopk) {
    launch_pdl(moe_combine_kernel, elem_grid(a.n * a.dim), 256, 0, s, a);
    return cudaGetLastError();
  }
  for (int64_t t0 = 0; t0 < a.n; t0 += 65535) {  // grid.y limit
    MoeCombineArgs b = a;
    b.n = a.n - t0 < 65535 ? a.n - t0 : 65535;
    b.routed = a.routed + t0 * a.top_k * a.dim;
    b.ids = a.ids + t0 * a.top_k;
    b.shared = a.shared + t0 * a.dim;
    b.out = a.out + t0 * a.dim;
    const dim3 grid(static_cast<unsigned>((a.dim + kCombineThreads - 1) / kCombineThreads), static_cast<unsigned>(b.n));
    launch_pdl(moe_combine_ordered_kernel, grid, kCombineThreads, 0, s, b);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
