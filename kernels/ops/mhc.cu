// mHC (MODEL.md §5.2): the per-site mix (stream rsqrt, fp32 GEMV, Sinkhorn split), collapse and
// expand. Sums follow the CPU reference's order; exp goes through double like libm's expf, and the
// pre/post sigmoids use PyTorch's vectorised exp where the reference's elementwise kernel does.
//
// The mix dots stage the token's streams and the mix row in shared memory and run every K part's
// fma chain on its own thread (hc_mix_dots_staged_kernel); prefill passes of 64 or more tokens
// take the register-tiled chain GEMM (hc_mix_dots_tiled_kernel, ops/chain_gemm.cuh). The Sinkhorn
// split runs one warp per token with one comb entry per lane. All keep each sum's order and every
// rounding.
#include "ops/chain_gemm.cuh"
#include "ops/cp_async.cuh"
#include "ops/moe_combine.cuh"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/staged_chain.cuh"
#include "dsv41/model/mix_gemm_parts.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kMaxHc = 16;
constexpr int kStagedThreads = 512;
// P-part K partitions (prefill only) give each block a few long chains: above this many tokens the
// unstaged form's many small blocks overlap those latencies better. Parts of 256 stay staged at any
// size: the unstaged form took 1.09 ms for 256 tokens on the H200, while one wave of staged blocks
// (with the split) took under 15 µs at 1-4 tokens, and 256 tokens are 47 such waves.
constexpr int64_t kStagedMaxTokensPartsP = 32;
constexpr int kSplitWarps = 4;
// The fused split (HcMixArgs::counters) serves decode steps and batched decode: a few tokens,
// where launches dominate. Larger passes keep the separate split kernel.
constexpr int64_t kMaxFusedTokens = 64;

// hc_split_sinkhorn (src/model/ops/mhc.cpp), one thread.
// The first `vec` pre/post elements take torch.sigmoid's vector path (HcMixArgs::rows_ref).
__device__ void split_sinkhorn(const float* m, int hc, const float* base, const float* scale, int64_t iters, float eps,
                               int vec, float* out) {
  float* pre = out;
  float* post = out + hc;
  float* c = out + 2 * hc;
  for (int i = 0; i < hc; ++i) {
    const bool v = i < vec;
    pre[i] = __fadd_rn(dev::torch_sigmoid(__fadd_rn(__fmul_rn(m[i], scale[0]), base[i]), v), eps);
    post[i] = __fmul_rn(2.0f, dev::torch_sigmoid(__fadd_rn(__fmul_rn(m[hc + i], scale[1]), base[hc + i]), v));
  }
  for (int i = 0; i < hc * hc; ++i) c[i] = __fadd_rn(__fmul_rn(m[2 * hc + i], scale[2]), base[2 * hc + i]);
  auto row_norm = [&](bool softmax) {
    for (int r = 0; r < hc; ++r) {
      float* row = c + r * hc;
      if (softmax) {
        float mx = row[0];
        for (int k = 1; k < hc; ++k) mx = row[k] > mx ? row[k] : mx;
        for (int k = 0; k < hc; ++k) row[k] = dev::exp_ref(__fsub_rn(row[k], mx));
      }
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) s = __fadd_rn(s, row[k]);
      for (int k = 0; k < hc; ++k)
        row[k] = softmax ? __fadd_rn(__fdiv_rn(row[k], s), eps) : __fdiv_rn(row[k], __fadd_rn(s, eps));
    }
  };
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int r = 0; r < hc; ++r) s = __fadd_rn(s, c[r * hc + k]);
      for (int r = 0; r < hc; ++r) c[r * hc + k] = __fdiv_rn(c[r * hc + k], __fadd_rn(s, eps));
    }
  };
  row_norm(true);
  col_norm();
  for (int64_t it = 0; it + 1 < iters; ++it) {
    row_norm(false);
    col_norm();
  }
}

// One block per (mix row, token): warp 0 the stream rsqrt statistic (recomputed per row: h is
// small and L2-resident), warp 1 the row's fp32 GEMV; the scaled mix goes to a.mix (raw).
__global__ void hc_mix_dots_kernel(HcMixArgs a) {
  dev::pdl_enter();
  __shared__ float part[2];
  const int64_t i = blockIdx.x, t = blockIdx.y;
  const int64_t k = a.hc * a.dim, n_mix = (2 + a.hc) * a.hc;
  const float* h = a.h + t * k;
  const int warp = threadIdx.x / 32;
  if (warp == 0) {
    const float sum = dev::warp_torch_sum([&](int64_t j) { return __fmul_rn(h[j], h[j]); }, k);
    if (threadIdx.x == 0) part[0] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, static_cast<float>(k)), a.norm_eps)));
  } else {
    const float* w = a.fn + i * k;
    if (a.k_parts != 0) {
      // hc_gemm_dot (src/model/ops/mhc.cpp): each lane runs the fma chains of parts lane, lane+32, ..
      // (dsv41/model/mix_gemm_parts.h); lane 0 adds them in K order.
      __shared__ float part_sum[kMaxMixParts];
      const int lane = threadIdx.x & 31;
      const int64_t parts = model::mix_gemm_part_count(k, a.k_parts);
      for (int64_t p = lane; p < parts; p += 32) {
        int64_t k0, k1;
        model::mix_gemm_part_range(k, a.k_parts, p, k0, k1);
        float acc = 0.0f;
        for (int64_t j = k0; j < k1; ++j) acc = fmaf(w[j], h[j], acc);
        part_sum[p] = acc;
      }
      __syncwarp();
      if (lane == 0) {
        float total = 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
          int64_t k0, k1;
          model::mix_gemm_part_range(k, a.k_parts, p, k0, k1);
          if (k0 >= k) break;  // the reference stops once K is covered
          total = p == 0 ? part_sum[p] : __fadd_rn(total, part_sum[p]);
        }
        part[1] = total;
      }
    } else {
      const float d = dev::warp_gemm_dot([&](int64_t j) { return w[j]; }, [&](int64_t j) { return h[j]; }, k);
      if (threadIdx.x == 32) part[1] = d;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) a.mix[t * n_mix + i] = __fmul_rn(part[1], part[0]);
}

// Sinkhorn split of one token's raw mix, in place.
__global__ void hc_split_kernel(HcMixArgs a) {
  dev::pdl_enter();
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= a.n) return;
  const int hc = static_cast<int>(a.hc);
  const int64_t n_mix = (2 + a.hc) * a.hc;
  float m[(2 + kMaxHc) * kMaxHc], out[(2 + kMaxHc) * kMaxHc];
  for (int64_t i = 0; i < n_mix; ++i) m[i] = a.mix[t * n_mix + i];
  int vec = hc;
  if (a.rows_ref >= 0) {
    const int64_t v = (a.rows_ref * a.hc) / 16 * 16 - (a.t_ref0 + t) * a.hc;
    vec = static_cast<int>(v < 0 ? 0 : (v > a.hc ? a.hc : v));
  }
  split_sinkhorn(m, hc, a.base, a.scale, a.iters, a.hc_eps, vec, out);
  for (int64_t i = 0; i < n_mix; ++i) a.mix[t * n_mix + i] = out[i];
}

// split_sinkhorn of one token per warp, in place: lane i < hc computes pre[i], lane hc+i post[i],
// lane r*hc+c comb entry (r, c); row and column sums gather their hc entries by shuffles in the
// reference's order. Needs hc*hc <= 32.
// The whole warp calls it for token t. The mix is read with L1-bypassing loads: in the fused form
// (hc_mix_dots_staged_kernel with counters) other blocks of the same launch wrote it.
template <int HC>
__device__ __forceinline__ void split_warp(const HcMixArgs& a, int64_t t, int lane) {
  constexpr int kNm = (2 + HC) * HC;
  float* mix = a.mix + t * kNm;
  int vec = HC;
  if (a.rows_ref >= 0) {
    const int64_t v = (a.rows_ref * HC) / 16 * 16 - (a.t_ref0 + t) * HC;
    vec = static_cast<int>(v < 0 ? 0 : (v > HC ? HC : v));
  }
  const float eps = a.hc_eps;
  // every read of the token's mix happens before any write
  const int pl = lane < 2 * HC ? lane : 0;
  const float pp = __ldcg(mix + pl);
  const int cl = lane < HC * HC ? lane : 0;
  float c = __fadd_rn(__fmul_rn(__ldcg(mix + 2 * HC + cl), a.scale[2]), a.base[2 * HC + cl]);
  // pre (lanes < HC) and post (the next HC lanes) in one path, so that their sigmoid overlaps the
  // comb's softmax below (lanes past 2*HC compute a value nobody stores)
  const bool is_pre = pl < HC;
  const int pi = is_pre ? pl : pl - HC;
  const float sg = dev::torch_sigmoid(__fadd_rn(__fmul_rn(pp, a.scale[is_pre ? 0 : 1]), a.base[pl]), pi < vec);
  const float out_pp = is_pre ? __fadd_rn(sg, eps) : __fmul_rn(2.0f, sg);
  const int r = cl / HC, col = cl % HC;
  // The reference's sums start from 0.0f; 0.0f + g[0] is g[0] for every g[0] but -0.0f, and the
  // comb entries summed here are never -0.0f (exp results, >= +0, and quotients of them by
  // positive sums, plus eps > 0), so each sum starts at g[0]: one add less per half round of the
  // Sinkhorn's dependent chain (shuffles, the adds, eps, the division, the next shuffles).
  auto row_sum = [&](float v) {
    float g[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) g[j] = __shfl_sync(dev::kFull, v, r * HC + j);
    float s = g[0];
#pragma unroll
    for (int j = 1; j < HC; ++j) s = __fadd_rn(s, g[j]);
    return s;
  };
  auto col_norm = [&] {
    float g[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) g[j] = __shfl_sync(dev::kFull, c, j * HC + col);
    float s = g[0];
#pragma unroll
    for (int j = 1; j < HC; ++j) s = __fadd_rn(s, g[j]);
    c = __fdiv_rn(c, __fadd_rn(s, eps));
  };
  {  // softmax row normalisation
    float g[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) g[j] = __shfl_sync(dev::kFull, c, r * HC + j);
    float mx = g[0];
#pragma unroll
    for (int j = 1; j < HC; ++j) mx = g[j] > mx ? g[j] : mx;
    c = dev::exp_ref(__fsub_rn(c, mx));
    c = __fadd_rn(__fdiv_rn(c, row_sum(c)), eps);
  }
  col_norm();
  const int iters = static_cast<int>(a.iters);
  for (int it = 1; it < iters; ++it) {
    c = __fdiv_rn(c, __fadd_rn(row_sum(c), eps));
    col_norm();
  }
  if (lane < 2 * HC) mix[lane] = out_pp;
  if (lane < HC * HC) mix[2 * HC + lane] = c;
}

template <int HC>
__global__ void hc_split_warp_kernel(HcMixArgs a) {
  dev::pdl_enter();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kSplitWarps + threadIdx.x / 32;
  if (t >= a.n) return;  // uniform per warp
  split_warp<HC>(a, t, threadIdx.x & 31);
}

// split_warp for a runtime hc of at most kMaxFusedSplitHc.
constexpr int kMaxFusedSplitHc = 5;
__device__ __forceinline__ void split_warp_any(const HcMixArgs& a, int64_t t, int lane) {
  switch (a.hc) {
    case 1: split_warp<1>(a, t, lane); break;
    case 2: split_warp<2>(a, t, lane); break;
    case 3: split_warp<3>(a, t, lane); break;
    case 4: split_warp<4>(a, t, lane); break;
    case 5: split_warp<5>(a, t, lane); break;
    default: break;
  }
}

// K range [k0, k1) of part p of the mixes GEMM (HcMixArgs::k_parts; 0 = parts of 256).
__device__ __forceinline__ void mix_part_range(const HcMixArgs& a, int64_t k, int64_t p, int64_t& k0, int64_t& k1) {
  model::mix_gemm_part_range(k, a.k_parts, p, k0, k1);
}
__host__ __device__ __forceinline__ int64_t mix_parts(const HcMixArgs& a) {
  return model::mix_gemm_part_count(a.hc * a.dim, a.k_parts);
}

// ---- pieces of the staged kernel ----
// cp.async copy of row src[0, n) into the chain_swizzle layout at dst (16-byte pieces, every copy
// in flight at once; a row element by element where it is not 16-byte aligned, and the last n % 4
// elements), then one commit group. (H200, 24 blocks staging two 80 KB rows: 1.9 against 3.8 µs
// for register-batched copies from DRAM, 1.3 against 2.9 µs from L2.)
__device__ __forceinline__ void stage_swizzled_async(float* dst, const float* src, int64_t n) {
  const int tid = threadIdx.x, nt = blockDim.x;
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int64_t n4 = n >> 2;
    for (int64_t q = tid; q < n4; q += nt) {
      // Written out rather than dev::cp_async16, which would form the source address before the
      // shared one: the same copy in another instruction order.
      const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + dev::chain_swizzle(q << 2)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src + (q << 2)) : "memory");
    }
    done = n4 << 2;
  }
  for (int64_t i = done + tid; i < n; i += nt) dst[dev::chain_swizzle(i)] = src[i];
  dev::cp_async_commit();
}

// ---- the mix chains from the staged rows ----
// hc_gemm_dot's part chains (acc = fmaf(w[j], h[j], acc) from zero, j in element order) over two
// rows in the chain_swizzle layout: dev::staged_chain_dot (ops/staged_chain.cuh: whole 256-element
// blocks unrolled, every load one LDS.128 at a register plus an immediate offset, no per-step
// address arithmetic or bound check).

// ---- the stream rsqrt statistic from the staged stream row ----
// dev::torch_sum_partials of the squares of the staged row sh (chain_swizzle layout), the same
// adds in the same order: warp w of nw forms the partials of steps w, w+nw, ... (step `groups` =
// the tail) of the 32 chains (lane = chain). A batch of 16 chain elements (i + u) * 32 + lane,
// u < 16, with i a multiple of 16 covers the 512 elements from i * 32: blocks s0 = i / 8 (even)
// and s0 + 1, where element u * 32 + lane of a block sits at u * 32 + (((lane / 4) ^ (s & 7)) * 4
// + lane % 4) - one per-lane offset per block plus compile-time multiples of 32, so the batch's
// loads need no per-element address arithmetic.
__device__ __forceinline__ void staged_square_partials(const float* sh, int n, int w, int nw, float* scratch) {
  const dev::TorchSumShape shape = dev::torch_sum_shape(n);
  const int step = static_cast<int>(shape.step), size_ilp = static_cast<int>(shape.size_ilp);
  const int groups = static_cast<int>(shape.groups);
  const int lane = threadIdx.x & 31;
  auto square = [&](int j) {
    const float v = sh[dev::chain_swizzle_i32(j)];
    return __fmul_rn(v, v);
  };
  for (int g = w; g <= groups; g += nw) {
    const int i0 = g * step, i1 = i0 + step < size_ilp ? i0 + step : size_ilp;
    float acc = 0.0f;
    int i = i0;
    for (; i + 16 <= i1; i += 16) {  // i0 is a multiple of step, itself of 16
      const int s0 = i >> 3;
      const float* p0 = sh + (s0 << 8) + ((((lane >> 2) ^ (s0 & 7)) << 2) | (lane & 3));
      const float* p1 = sh + ((s0 + 1) << 8) + ((((lane >> 2) ^ ((s0 + 1) & 7)) << 2) | (lane & 3));
      float v[16];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        v[u] = p0[u * 32];
        v[8 + u] = p1[u * 32];
      }
#pragma unroll
      for (int u = 0; u < 16; ++u) acc = __fadd_rn(acc, __fmul_rn(v[u], v[u]));
    }
    for (; i < i1; ++i) acc = __fadd_rn(acc, square(i * 32 + lane));
    scratch[g * 32 + lane] = acc;
  }
}

// dev::torch_sum_cascade over those partials by one warp, in 32-bit arithmetic (a staged row has
// far fewer than 2^31 elements), the partials read in batches ahead of the adds: dev::TorchCascade's
// fold - step g's partial joins level 1; a level passes its sum up and restarts when the chain
// position after the step is a multiple of that level's span - then the tail, the levels from the
// lowest, and dev::torch_sum_finish. Every lane returns the total.
__device__ float staged_square_cascade(const float* sh, int n, const float* scratch) {
  const dev::TorchSumShape shape = dev::torch_sum_shape(n);
  const int lp = static_cast<int>(shape.lp), groups = static_cast<int>(shape.groups);
  const unsigned mask = static_cast<unsigned>(shape.step) - 1u;
  const unsigned mask1 = mask << lp, mask2 = mask << (2 * lp);
  const int lane = threadIdx.x & 31;
  float acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
  constexpr int kBatch = 8;
  for (int g0 = 0; g0 < groups; g0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = g0 + u < groups ? scratch[(g0 + u) * 32 + lane] : 0.0f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (g0 + u >= groups) break;
      const unsigned i = static_cast<unsigned>(g0 + u + 1) << lp;  // the chain position after the step
      acc1 = __fadd_rn(acc1, v[u]);
      if ((i & mask1) != 0) continue;
      acc2 = __fadd_rn(acc2, acc1);
      acc1 = 0.0f;
      if ((i & mask2) != 0) continue;
      acc3 = __fadd_rn(acc3, acc2);
      acc2 = 0.0f;
    }
  }
  float acc0 = __fadd_rn(scratch[groups * 32 + lane], acc1);
  acc0 = __fadd_rn(acc0, acc2);
  acc0 = __fadd_rn(acc0, acc3);
  auto square = [&](int64_t j) {
    const float x = sh[dev::chain_swizzle_i32(static_cast<int>(j))];
    return __fmul_rn(x, x);
  };
  return dev::torch_sum_finish(square, n, acc0);
}

// Named barrier 1 among `count` warps of the block (each of them calls it).
__device__ __forceinline__ void warps_barrier(int count) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(count * 32) : "memory");
}

// One block per (mix row, token): the token's streams and the fn row are staged in shared memory
// (chain_swizzle layout, cp.async); thread p runs part p's fma chain while the warps without a part
// form the step partials of the stream rsqrt statistic (torch_sum order) and then, among themselves,
// its fold cascade, so the statistic is ready when the chains are; lane 0 of the first of those
// warps adds the parts in K order as the unstaged kernel does (from zero for parts of 256; from
// part 0, stopping once K is covered, for P parts).
// With counters (the fused split), that lane then counts the token's finished entries with one
// acquire-release atomic; the warp whose count completes the token runs its Sinkhorn split at once
// (no block barrier: the other warps have left).
// Where the time goes (H200, one token of the real shapes, mix rows from DRAM, phase stamps):
// staging 3.4 µs, the 80 fma chains of 256 3.7 µs (about 28 cycles per fma), the K-ordered sum
// 0.6, the count 0.8, the split 3.4 (19 Sinkhorn rounds 2.2 of it). The chains then computed every
// swizzled address in 64-bit arithmetic and loaded each step just before its fmas, and the
// statistic's warps spent ~6 integer instructions per element on addresses, taking issue slots
// from the chains; with dev::staged_chain_dot (immediate-offset loads, no per-step address or
// bound work) and staged_square_partials (immediate-offset loads) a mix call takes 9.4 against
// 10.7 µs (m = 1, CUDA graph; 10.1 against 11.3 at m = 4). A variant with the loads a whole 4-step
// set ahead (104 registers) measured the same alone and no better inside decode steps.
// kWGlobal: the mix row is read in place from global memory (L2: the layer's mix rows are ~2 MB)
// and only the streams are staged, half the shared memory (GB10's 99 KB a block holds one row of
// hc·dim = 20,480 floats, not two); the same chains.
template <bool kWGlobal>
__global__ void __launch_bounds__(kStagedThreads) hc_mix_dots_staged_kernel(HcMixArgs a) {
  extern __shared__ float4 smem_f4[];
  const int64_t i = blockIdx.x, t = blockIdx.y;
  const int64_t k = a.hc * a.dim, n_mix = (2 + a.hc) * a.hc, rows = dev::chain_rows_size(k), parts = mix_parts(a);
  float* sh = reinterpret_cast<float*>(smem_f4);
  float* sw = kWGlobal ? nullptr : sh + rows;
  float* part = sh + (kWGlobal ? 1 : 2) * rows;
  float* scratch = part + (parts + 3) / 4 * 4;  // torch_sum_scratch_floats(k)
  __shared__ float s_rsqrt;
  // The mix row (a weight: no kernel writes it) is requested before the wait for the previous
  // kernel, so with PDL its copy overlaps that kernel's tail; the streams only after the wait.
  if constexpr (!kWGlobal) stage_swizzled_async(sw, a.fn + i * k, k);
  const float* w = kWGlobal ? a.fn + i * k : sw;
  dev::pdl_enter();
  stage_swizzled_async(sh, a.h + t * k, k);
  dev::cp_async_wait_all();
  __syncthreads();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const int sum_warp = static_cast<int>((parts + 31) / 32);  // the first warp without a part
  if (tid < parts) {
    int64_t k0, k1;
    mix_part_range(a, k, tid, k0, k1);
    part[tid] = dev::staged_chain_dot<kWGlobal>(w, sh, static_cast<int>(k0), static_cast<int>(k1));
  } else if (warp >= sum_warp) {
    const int stat_warps = kStagedThreads / 32 - sum_warp;
    staged_square_partials(sh, static_cast<int>(k), warp - sum_warp, stat_warps, scratch);
    warps_barrier(stat_warps);  // the statistic's warps only: the chains run on
    if (warp == sum_warp) {
      const float sum = staged_square_cascade(sh, static_cast<int>(k), scratch);
      if (lane == 0) s_rsqrt = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, static_cast<float>(k)), a.norm_eps)));
    }
  }
  __syncthreads();
  if (warp != sum_warp) return;
  unsigned last = 0;
  if (lane == 0) {
    float total;
    if (a.k_parts == 0) {
      total = dev::ordered_sum(0.0f, part, parts);
    } else {
      total = part[0];
      for (int64_t p = 1; p < parts; ++p) {
        int64_t k0, k1;
        mix_part_range(a, k, p, k0, k1);
        if (k0 >= k) break;  // the reference stops once K is covered
        total = __fadd_rn(total, part[p]);
      }
    }
    a.mix[t * n_mix + i] = __fmul_rn(total, s_rsqrt);
    if (a.counters) {
      // release: this entry is published with the count; acquire: the block that brings the
      // token's count to n_mix sees every entry of the token. It resets the counter for the next
      // launch.
      unsigned old;
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(a.counters + t) : "memory");
      last = old == static_cast<unsigned>(n_mix - 1) ? 1u : 0u;
      if (last) a.counters[t] = 0;
    }
  }
  if (a.counters == nullptr) return;  // uniform: one launch's blocks all take one form
  if (__shfl_sync(dev::kFull, last, 0) == 0) return;
  __syncwarp();  // orders lane 0's acquire before the other lanes' reads of the token's mix
  split_warp_any(a, t, lane);
}

// Prefill passes (n >= kTiledMinTokens): the mix dots as one register-tiled chain GEMM
// (ops/chain_gemm.cuh) over tiles of kMixTile::T tokens x kMixTile::R mix rows, every K part's
// chain in the reference's order, the parts added as hc_mix_dots_kernel adds them (from zero for
// parts of 256; from part 0 for the other orders, `parts` counting only those before K is covered).
// The tile's tokens' rsqrt statistics come first, each by the whole block (torch_sum partials and
// cascade, bit-identical to warp_torch_sum), once per token and row tile (one row tile covers the
// mix rows up to hc = 4).
constexpr int64_t kTiledMinTokens = 64;
constexpr int kMixTiledMaxWarps = 16;
using MixTile = dev::ChainTile<1, 3>;
__host__ __device__ inline int64_t mix_tiled_smem_floats(int64_t k, int nw) {
  return MixTile::smem_floats(nw) + dev::torch_sum_scratch_floats(k) + 2 * MixTile::T;
}

__global__ void hc_mix_dots_tiled_kernel(HcMixArgs a, int64_t parts) {
  dev::pdl_enter();
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  constexpr int T = MixTile::T, R = MixTile::R;
  const int64_t k = a.hc * a.dim, n_mix = (2 + a.hc) * a.hc;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * T, r0 = static_cast<int64_t>(blockIdx.y) * R;
  const int nw = static_cast<int>(blockDim.x / 32);
  float* scratch = smem + MixTile::smem_floats(nw);
  float* sums = scratch + dev::torch_sum_scratch_floats(k);
  float* rsqrt = sums + T;
  for (int tt = 0; tt < T && t0 + tt < a.n; ++tt) {  // uniform over the block
    const float* h = a.h + (t0 + tt) * k;
    auto square = [&](int64_t j) {
      const float v = h[j];
      return __fmul_rn(v, v);
    };
    dev::block_torch_sum(square, k, scratch, sums + tt);
  }
  if (threadIdx.x < T && t0 + threadIdx.x < a.n)
    rsqrt[threadIdx.x] =
        __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sums[threadIdx.x], static_cast<float>(k)), a.norm_eps)));
  auto range = [&](int64_t p, int64_t& k0, int64_t& k1) { model::mix_gemm_part_range(k, a.k_parts, p, k0, k1); };
  // the totals' last barrier also publishes rsqrt
  const float* tot = dev::chain_tile_totals<1, 3>(a.h, a.n, a.fn, n_mix, k, t0, r0, parts, range, a.k_parts != 0, smem);
  for (int o = threadIdx.x; o < T * R; o += blockDim.x) {
    const int64_t t = t0 + o / R, i = r0 + o % R;
    if (t < a.n && i < n_mix) a.mix[t * n_mix + i] = __fmul_rn(tot[o], rsqrt[o / R]);
  }
}

__global__ void hc_collapse_kernel(HcCollapseArgs a) {
  dev::pdl_enter();
  const int64_t total = a.n * a.dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.dim, d = idx % a.dim;
    const float* w = a.w + t * a.w_stride;
    const float* h = a.h + t * a.hc * a.dim + d;
    float s = 0.0f;
    for (int64_t j = 0; j < a.hc; ++j) s = __fadd_rn(s, __fmul_rn(w[j], h[j * a.dim]));
    a.out[idx] = dev::bf16_round(s);
  }
}

__global__ void hc_expand_kernel(HcExpandArgs a) {
  dev::pdl_enter();
  const int64_t total = a.n * a.dim, n_mix = (2 + a.hc) * a.hc;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.dim, d = idx % a.dim;
    const float* mix = a.mix + t * n_mix;
    const float* post = mix + a.hc;
    const float* comb = mix + 2 * a.hc;
    float* h = a.h + t * a.hc * a.dim + d;
    float res[kMaxHc];
    for (int64_t j = 0; j < a.hc; ++j) res[j] = h[j * a.dim];
    float y;
    if (a.routed) {  // moe_combine's value of (t, d)
      y = dev::bf16_round(__fadd_rn(dev::combine_routed(a.routed, a.ids + t * a.top_k, a.top_k, a.dim, t, d), a.shared[idx]));
      if (a.y_out) a.y_out[idx] = y;
    } else {
      y = a.y[idx];
    }
    if (a.pre_out)
      for (int64_t j = d; j < a.hc; j += a.dim) a.pre_out[t * a.hc + j] = mix[j];
    for (int64_t k = 0; k < a.hc; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < a.hc; ++j) s = __fadd_rn(s, __fmul_rn(comb[j * a.hc + k], res[j]));
      h[k * a.dim] = dev::bf16_round(__fadd_rn(__fmul_rn(post[k], y), s));
    }
  }
}

unsigned elem_grid(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

namespace raw {
cudaError_t hc_mix(const HcMixArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  const int64_t k = a.hc * a.dim, parts = mix_parts(a);
  // the parts before K is covered (the reference stops adding there)
  int64_t live_parts = 0;
  for (int64_t p = 0; p < parts; ++p) {
    int64_t k0, k1;
    model::mix_gemm_part_range(k, a.k_parts, p, k0, k1);
    if (k0 >= k) break;
    live_parts = p + 1;
  }
  const int tiled_warps = dev::chain_warps(live_parts, kMixTiledMaxWarps);
  const size_t tiled_smem = static_cast<size_t>(mix_tiled_smem_floats(k, tiled_warps)) * sizeof(float);
  const bool tiled =
      a.n >= kTiledMinTokens && live_parts > 0 && staged_smem_fits<hc_mix_dots_tiled_kernel>(tiled_smem);
  if (tiled) {
    cudaError_t e = allow_dynamic_smem<hc_mix_dots_tiled_kernel>(tiled_smem);
    if (e != cudaSuccess) return e;
    const int64_t n_mix = (2 + a.hc) * a.hc;
    const dim3 grid(static_cast<unsigned>((a.n + MixTile::T - 1) / MixTile::T),
                    static_cast<unsigned>((n_mix + MixTile::R - 1) / MixTile::R));
    HcMixArgs b = a;
    b.counters = nullptr;  // the split launched below
    launch_pdl(hc_mix_dots_tiled_kernel, grid, tiled_warps * 32, tiled_smem, s, b, live_parts);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  const size_t staged_smem =
      static_cast<size_t>(2 * ((k + 255) / 256 * 256) + (parts + 3) / 4 * 4 + dev::torch_sum_scratch_floats(k)) * sizeof(float);
  // The staged chains read float4-aligned starts: the blocked order's second half starts at
  // K - rest/2, a multiple of 4 only when K is a multiple of 8.
  const bool aligned_parts = a.k_parts != model::kMixGemmBlocked || k % 8 == 0;
  const bool stageable =
      (a.k_parts == 0 || a.n <= kStagedMaxTokensPartsP) && parts <= kStagedThreads - 32 && aligned_parts;
  // Both rows staged where they fit (the H200), else the streams alone with the mix row read in
  // place (GB10), which needs 16-byte aligned mix rows.
  const size_t one_row_smem = staged_smem - static_cast<size_t>((k + 255) / 256 * 256) * sizeof(float);
  const bool both = stageable && staged_smem_fits<hc_mix_dots_staged_kernel<false>>(staged_smem);
  const bool one = stageable && !both && reinterpret_cast<uintptr_t>(a.fn) % 16 == 0 && k % 4 == 0 &&
                   staged_smem_fits<hc_mix_dots_staged_kernel<true>>(one_row_smem);
  const bool staged = both || one;
  if (staged && !tiled) {
    const cudaError_t e = both ? allow_dynamic_smem<hc_mix_dots_staged_kernel<false>>(staged_smem)
                               : allow_dynamic_smem<hc_mix_dots_staged_kernel<true>>(one_row_smem);
    if (e != cudaSuccess) return e;
  }
  const bool fused = !tiled && !a.raw_dots && staged && a.counters && a.n <= kMaxFusedTokens && a.hc <= kMaxFusedSplitHc;
  for (int64_t t0 = tiled ? a.n : 0; t0 < a.n; t0 += 65535) {  // grid.y limit
    HcMixArgs b = a;
    if (!fused) b.counters = nullptr;  // the split launched below
    b.n = a.n - t0 < 65535 ? a.n - t0 : 65535;
    b.h = a.h + t0 * a.hc * a.dim;
    b.mix = a.mix + t0 * (2 + a.hc) * a.hc;
    const dim3 grid(static_cast<unsigned>((2 + a.hc) * a.hc), static_cast<unsigned>(b.n));
    if (both) launch_pdl(hc_mix_dots_staged_kernel<false>, grid, kStagedThreads, staged_smem, s, b);
    else if (one) launch_pdl(hc_mix_dots_staged_kernel<true>, grid, kStagedThreads, one_row_smem, s, b);
    else launch_pdl(hc_mix_dots_kernel, grid, 64, 0, s, b);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (fused || a.raw_dots) return cudaSuccess;  // split in the dots' launch, or not wanted
  const unsigned split_blocks = static_cast<unsigned>((a.n + kSplitWarps - 1) / kSplitWarps);
  switch (a.hc) {
    case 1: launch_pdl(hc_split_warp_kernel<1>, split_blocks, kSplitWarps * 32, 0, s, a); break;
    case 2: launch_pdl(hc_split_warp_kernel<2>, split_blocks, kSplitWarps * 32, 0, s, a); break;
    case 3: launch_pdl(hc_split_warp_kernel<3>, split_blocks, kSplitWarps * 32, 0, s, a); break;
    case 4: launch_pdl(hc_split_warp_kernel<4>, split_blocks, kSplitWarps * 32, 0, s, a); break;
    case 5: launch_pdl(hc_split_warp_kernel<5>, split_blocks, kSplitWarps * 32, 0, s, a); break;
    default: launch_pdl(hc_split_kernel, static_cast<unsigned>((a.n + 63) / 64), 64, 0, s, a); break;
  }
  return cudaGetLastError();
}
cudaError_t hc_collapse(const HcCollapseArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  launch_pdl(hc_collapse_kernel, elem_grid(a.n * a.dim), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t hc_expand(const HcExpandArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  launch_pdl(hc_expand_kernel, elem_grid(a.n * a.dim), 256, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
