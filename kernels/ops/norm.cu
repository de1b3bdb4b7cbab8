// RMSNorm (MODEL.md §4): bf16( w · (x · rsqrt(mean(x²) + eps)) ). The mean of squares is summed in
// the reference's order (warp_torch_sum), so the result is bit-identical.
//
// One block per row: the block stages the row and the weight in shared memory with 16-byte loads,
// the warps sum the reference's chains from there (block_torch_sum: the chains' steps in parallel,
// then the fold cascade), and the whole block writes the output. (A warp reading its chain straight from global memory waits a memory latency per step:
// 37 µs for a 5120-wide row.) Rows too wide for shared memory take the unstaged warp-per-row form.
//
// A few rows (decode) take a cluster of blocks per row instead (rms_norm_cluster_kernel, below): the
// reference's sum splits into independent partial sums over 512-element spans, so each block loads
// and sums only its spans, the partials meet in every block's shared memory, and each block writes
// its spans' outputs; the same kernel can form its input rows as the mHC collapse of the streams
// (hc_collapse_rms_norm: one launch in place of hc_collapse and rms_norm).
//
// With codes/scales set, the kernel also writes ActQuant8 of its bf16-rounded output rows (the
// input of the FP8/FP4 linears that read the normed rows): in both forms a warp writes 32
// consecutive outputs of one row at a time, which is exactly one 32-block (d % 32 == 0). The same
// holds for the optional RoPE of the row's tail and QDQ8 (the attention's kv rows: one launch in
// place of three), whose pairs and blocks lie within a warp's 32 outputs.
#include <cooperative_groups.h>

#include <atomic>

#include "ops/act_quant.cuh"
#include "ops/collapse_norm.h"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/rope_qdq.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWideThreads = 512;  // staged form, rows wider than kWideRow
constexpr int64_t kWideRow = 1024;
constexpr int kWarps = 4;  // unstaged form: one warp per row

// The optional RoPE of the row's tail and QDQ8 of the normed value v at column i of row `row`
// (RmsNormArgs::rope, qdq8). The whole warp calls it with 32 consecutive columns (d % 32 == 0).
__device__ __forceinline__ float finish(const RmsNormArgs& a, float v, int64_t row, int64_t i) {
  if (a.rope.freqs) v = dev::rope_tail_lane(a.rope, v, row, i, a.d);
  if (a.qdq8) v = dev::qdq_lane(QdqKind::Q8, v);
  return v;
}

// kT threads per row: wide rows take more, so that each warp quantises fewer 32-blocks one after
// another (the output loop's per-block chain of shuffles and roundings is latency-bound).
template <int kT>
__global__ void __launch_bounds__(kT) rms_norm_staged_kernel(RmsNormArgs a) {
  dev::pdl_enter();
  extern __shared__ float4 smem_f4[];
  float* sx = reinterpret_cast<float*>(smem_f4);
  float* sw = sx + (a.d + 3) / 4 * 4;
  float* scratch = sw + (a.d + 3) / 4 * 4;
  __shared__ float s_sum;
  const int64_t row = blockIdx.x;
  const float* x = a.x + row * a.x_stride;
  float* out = a.out + row * a.out_stride;
  {
    float* const dst[2] = {sx, sw};
    const float* const src[2] = {x, a.w};
    dev::block_stage<2>(dst, src, a.d);
  }
  __syncthreads();  // out may alias x: every read of x is done before the first write below
  const float sum = dev::block_torch_sum([&](int64_t i) { return __fmul_rn(sx[i], sx[i]); }, a.d, scratch, &s_sum);
  const float var = __fdiv_rn(sum, static_cast<float>(a.d));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));
  for (int64_t i = threadIdx.x; i < a.d; i += kT) {
    const float v = finish(a, dev::bf16_round(__fmul_rn(sw[i], __fmul_rn(sx[i], r))), row, i);
    out[i] = v;
    if (a.codes) dev::act_quant8_store(v, row, i, a.d, a.codes, a.scales);
    if (a.bf16_out) a.bf16_out[row * a.bf16_stride + i] = dev::f32_to_bf16_bits(v);
  }
}

// ---- few rows: a cluster of blocks per row ----
// torch_sum_f32's full steps of 16 chain positions ("units" here: the `groups` steps and the
// tail step) each cover consecutive elements: chain position i of lane l = 8k + j is element
// 32i + l, so unit u holds elements [32*step*u, 32*min(step*(u+1), size_ilp)). A unit's 32 partial
// sums (torch_sum_partials) therefore need only its own elements. Block `rank` of the row's
// cluster of C blocks owns units rank, rank + C, ...: it loads (or collapses) just those
// elements, forms their partials, and stores them into the scratch of every block of the cluster;
// after the cluster barrier each block replays the fold cascade and the end (torch_sum_cascade,
// the same order as block_torch_sum) and writes the outputs of its own units. The elements past
// the last unit (n % 32 of them; none when d % 32 == 0) are loaded by every block for the end of
// the sum and written by rank 0.
constexpr int kClusterThreads = 512;
constexpr int kClusterMaxBlocks = 8;  // the portable cluster size
constexpr int kClusterUnitsPerBlock = kClusterThreads / 32;  // one warp per unit's partial sums
// Up to this many rows (decode batches) take the cluster form; larger passes keep one block per row.
constexpr int64_t kClusterMaxRows = 32;
// Rows of fewer units keep the one-block form: the cluster form's fixed costs (the loads' round
// trips, two cluster barriers) outweigh the split there (H200, one row with codes: 1280 wide
// 3.87 us one block against 4.74 us over a cluster of 3; 5120 wide 6.27 -> 4.38 us over 5).
constexpr int64_t kClusterMinUnits = 4;
constexpr int kMaxCollapseWeights = 16;  // hc_collapse's hc limit
constexpr int kMaxCollapseHc = 8;        // streams loaded as 16-byte vectors at once

struct NormUnits {
  int64_t units, step, size_ilp, covered;  // covered = 32 * size_ilp: the elements in units
};
__host__ __device__ inline NormUnits norm_units(int64_t d) {
  const dev::TorchSumShape s = dev::torch_sum_shape(d);
  NormUnits u;
  u.step = s.step;
  u.size_ilp = s.size_ilp;
  u.units = s.groups + (s.size_ilp > s.groups * s.step ? 1 : 0);
  u.covered = 32 * s.size_ilp;
  return u;
}
// Blocks per row: each block gets the same number of units (the last ones maybe one fewer).
__host__ __device__ inline int cluster_blocks(int64_t units) {
  const int64_t per = (units + kClusterMaxBlocks - 1) / kClusterMaxBlocks;
  return static_cast<int>((units + per - 1) / per);
}

// The input value of element e of row `row`: x itself, or the mHC collapse of the row's streams
// (hc_collapse_kernel's arithmetic: bf16(sum_j w[j] * h[j][e]) from zero in j order).
template <bool kCollapse>
struct NormInput {
  const float* x;    // plain: the row
  const float* h;    // collapse: the row's streams [hc][dim]
  const float* w;    // collapse: hc weights (shared memory)
  int64_t hc, dim;
  __device__ __forceinline__ float at(int64_t e) const {
    if constexpr (!kCollapse) {
      return x[e];
    } else {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s = __fadd_rn(s, __fmul_rn(w[j], h[j * dim + e]));
      return dev::bf16_round(s);
    }
  }
  // four consecutive values from e (e % 4 == 0, 16-byte aligned rows)
  __device__ __forceinline__ float4 at4(int64_t e) const {
    if constexpr (!kCollapse) {
      return *reinterpret_cast<const float4*>(x + e);
    } else {
      float4 hv[kMaxCollapseHc];
#pragma unroll
      for (int j = 0; j < kMaxCollapseHc; ++j)
        if (j < hc) hv[j] = *reinterpret_cast<const float4*>(h + j * dim + e);
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < kMaxCollapseHc; ++j)
        if (j < hc) {
          s.x = __fadd_rn(s.x, __fmul_rn(w[j], hv[j].x));
          s.y = __fadd_rn(s.y, __fmul_rn(w[j], hv[j].y));
          s.z = __fadd_rn(s.z, __fmul_rn(w[j], hv[j].z));
          s.w = __fadd_rn(s.w, __fmul_rn(w[j], hv[j].w));
        }
      return make_float4(dev::bf16_round(s.x), dev::bf16_round(s.y), dev::bf16_round(s.z), dev::bf16_round(s.w));
    }
  }
};

// One cluster of C blocks per row (blockIdx.y); see the comment above NormUnits. kCollapse: the
// input row is the collapse of c's streams (c.out is not written; a.x is not read).
template <bool kCollapse>
__global__ void __launch_bounds__(kClusterThreads) rms_norm_cluster_kernel(RmsNormArgs a, HcCollapseArgs c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  extern __shared__ float4 smem_f4[];
  __shared__ float s_cw[kMaxCollapseWeights];
  __shared__ float s_r;
  // Remote blocks must be running before their shared memory is written: arrive now, wait before
  // the first remote store.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), C = static_cast<int>(cluster.num_blocks());
  const NormUnits nu = norm_units(a.d);
  const int64_t d = a.d, row = blockIdx.y, padded = (d + 3) / 4 * 4;
  float* sx = reinterpret_cast<float*>(smem_f4);
  float* sw = sx + padded;
  float* scratch = sw + padded;  // torch_sum_scratch_floats(d)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const int64_t my_units = rank < nu.units ? (nu.units - 1 - rank) / C + 1 : 0;
  auto unit_begin = [&](int64_t u) { return 32 * nu.step * u; };
  auto unit_end = [&](int64_t u) { return 32 * (nu.step * (u + 1) < nu.size_ilp ? nu.step * (u + 1) : nu.size_ilp); };
  // The norm weight (no kernel writes it) is read before the wait for the previous kernel.
  const bool w_vec = (reinterpret_cast<uintptr_t>(a.w) & 15) == 0;
  for (int64_t j = 0; j < my_units; ++j) {
    const int64_t u = rank + j * C, e0 = unit_begin(u), e1 = unit_end(u);
    if (w_vec) {
      for (int64_t e = e0 + 4 * tid; e < e1; e += 4 * kClusterThreads)
        *reinterpret_cast<float4*>(sw + e) = *reinterpret_cast<const float4*>(a.w + e);
    } else {
      for (int64_t e = e0 + tid; e < e1; e += kClusterThreads) sw[e] = a.w[e];
    }
  }
  if (rank == 0)
    for (int64_t e = nu.covered + tid; e < d; e += kClusterThreads) sw[e] = a.w[e];
  dev::pdl_enter();
  NormInput<kCollapse> in{};
  bool in_vec;
  if (kCollapse) {
    if (tid < c.hc) s_cw[tid] = c.w[row * c.w_stride + tid];
    __syncthreads();
    in.h = c.h + row * c.hc * c.dim;
    in.w = s_cw;
    in.hc = c.hc;
    in.dim = c.dim;
    in_vec = c.hc <= kMaxCollapseHc && (reinterpret_cast<uintptr_t>(in.h) & 15) == 0 && c.dim % 4 == 0;
  } else {
    in.x = a.x + row * a.x_stride;
    in_vec = (reinterpret_cast<uintptr_t>(in.x) & 15) == 0;
  }
  // This block's spans (units start at multiples of 32: quads never straddle two), then the
  // elements past the last unit, which every block needs for the end of the sum.
  for (int64_t j = 0; j < my_units; ++j) {
    const int64_t u = rank + j * C, e0 = unit_begin(u), e1 = unit_end(u);
    if (in_vec) {
      for (int64_t e = e0 + 4 * tid; e < e1; e += 4 * kClusterThreads) *reinterpret_cast<float4*>(sx + e) = in.at4(e);
    } else {
      for (int64_t e = e0 + tid; e < e1; e += kClusterThreads) sx[e] = in.at(e);
    }
  }
  for (int64_t e = nu.covered + tid; e < d; e += kClusterThreads) sx[e] = in.at(e);
  __syncthreads();
  auto square = [&](int64_t e) {
    const float v = sx[e];
    return __fmul_rn(v, v);
  };
  // torch_sum_partials' sum of each unit, one warp per unit (lane = chain); every block of the
  // cluster gets it in its scratch.
  // (the launcher gives a block at most one unit per warp)
  float part = 0.0f;
  const int64_t j_mine = warp;
  if (j_mine < my_units) {
    const int64_t j = j_mine;
    const int64_t u = rank + j * C, i0 = u * nu.step, i1 = i0 + nu.step < nu.size_ilp ? i0 + nu.step : nu.size_ilp;
    float acc = 0.0f;
    int64_t i = i0;
    for (; i + 16 <= i1; i += 16) {
      float v[16];
#pragma unroll
      for (int q = 0; q < 16; ++q) v[q] = square((i + q) * 32 + lane);
#pragma unroll
      for (int q = 0; q < 16; ++q) acc = __fadd_rn(acc, v[q]);
    }
    for (; i < i1; ++i) acc = __fadd_rn(acc, square(i * 32 + lane));
    part = acc;
  }
  const dev::TorchSumShape ts = dev::torch_sum_shape(d);
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  if (j_mine < my_units) {
    const int64_t u = rank + j_mine * C;
    for (int r = 0; r < C; ++r) cluster.map_shared_rank(scratch, r)[u * 32 + lane] = part;
  }
  // without a tail step its slot (read by the cascade) is zero
  if (nu.units == ts.groups && tid < 32) scratch[ts.groups * 32 + tid] = 0.0f;
  cluster.sync();
  if (warp == 0) {
    const float sum = dev::torch_sum_cascade(square, d, scratch);
    if (lane == 0) {
      const float var = __fdiv_rn(sum, static_cast<float>(d));
      s_r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));
    }
  }
  __syncthreads();
  const float r = s_r;
  float* out = a.out + row * a.out_stride;
  // a warp writes 32 consecutive outputs at a time: one 32-block (units are whole 32-blocks)
  for (int64_t j = 0; j < my_units; ++j) {
    const int64_t u = rank + j * C, e1 = unit_end(u);
    for (int64_t e = unit_begin(u) + warp * 32; e < e1; e += kClusterThreads) {
      const int64_t i = e + lane;
      const float v = finish(a, dev::bf16_round(__fmul_rn(sw[i], __fmul_rn(sx[i], r))), row, i);
      out[i] = v;
      if (a.codes) dev::act_quant8_store(v, row, i, d, a.codes, a.scales);
      if (a.bf16_out) a.bf16_out[row * a.bf16_stride + i] = dev::f32_to_bf16_bits(v);
    }
  }
  // the elements past the last unit (d % 32 != 0: no codes, rope or qdq8 then)
  if (rank == 0)
    for (int64_t i = nu.covered + tid; i < d; i += kClusterThreads) {
      const float v = dev::bf16_round(__fmul_rn(sw[i], __fmul_rn(sx[i], r)));
      out[i] = v;
      if (a.bf16_out) a.bf16_out[row * a.bf16_stride + i] = dev::f32_to_bf16_bits(v);
    }
#else
  __trap();  // code built for a pre-sm_90 target has no clusters: fail loudly rather than write nothing
#endif
}

__global__ void rms_norm_kernel(RmsNormArgs a) {
  dev::pdl_enter();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= a.rows) return;
  const float* x = a.x + row * a.x_stride;
  float* out = a.out + row * a.out_stride;
  const float sum = dev::warp_torch_sum([&](int64_t i) { return __fmul_rn(x[i], x[i]); }, a.d);
  const float var = __fdiv_rn(sum, static_cast<float>(a.d));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));
  __syncwarp();
  for (int64_t i = threadIdx.x & 31; i < a.d; i += 32) {
    const float v = finish(a, dev::bf16_round(__fmul_rn(a.w[i], __fmul_rn(x[i], r))), row, i);
    out[i] = v;
    if (a.codes) dev::act_quant8_store(v, row, i, a.d, a.codes, a.scales);
    if (a.bf16_out) a.bf16_out[row * a.bf16_stride + i] = dev::f32_to_bf16_bits(v);
  }
}

// Whether this device launches clusters (once per device).
bool clusters_supported() {
  static std::atomic<int> state[64] = {};  // 0 unknown, 1 yes, 2 no (threads may race to fill it)
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  if (state[dev].load() == 0) {
    // (a query, no stream work: allowed in the relaxed capture mode should a capture be running)
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const bool swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    int v = 0;
    const bool ok = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev) == cudaSuccess && v != 0;
    if (swapped) (void)cudaThreadExchangeStreamCaptureMode(&mode);
    (void)cudaGetLastError();
    state[dev].store(ok ? 1 : 2);
  }
  return state[dev].load() == 1;
}

size_t cluster_smem(int64_t d) {
  return static_cast<size_t>(2 * ((d + 3) / 4 * 4) + dev::torch_sum_scratch_floats(d)) * sizeof(float);
}

// Blocks per row of the cluster form for rows of d, or 0 where it does not apply (too few units;
// too wide for shared memory or for one unit per warp; too many rows).
template <bool kCollapse>
int cluster_form_blocks(int64_t rows, int64_t d) {
  const NormUnits nu = norm_units(d);
  if (rows > kClusterMaxRows || nu.units < kClusterMinUnits ||
      !staged_smem_fits<rms_norm_cluster_kernel<kCollapse>>(cluster_smem(d)))
    return 0;
  const int C = cluster_blocks(nu.units);
  if ((nu.units + C - 1) / C > kClusterUnitsPerBlock || !clusters_supported()) return 0;
  return C;
}

template <bool kCollapse>
cudaError_t launch_cluster(const RmsNormArgs& a, const HcCollapseArgs& c, int C, cudaStream_t s) {
  const size_t smem = cluster_smem(a.d);
  cudaError_t e = allow_dynamic_smem<rms_norm_cluster_kernel<kCollapse>>(smem);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(C), static_cast<unsigned>(a.rows), 1);
  cfg.blockDim = dim3(kClusterThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = add_pdl_attribute(attr, 1);  // programmatic dependent launch, as launch_pdl
  e = cudaLaunchKernelEx(&cfg, rms_norm_cluster_kernel<kCollapse>, a, c);
  if (e == cudaErrorNotSupported && cfg.numAttrs > 1) {  // a stream that rejects PDL with clusters (as launch_pdl)
    (void)cudaGetLastError();
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, rms_norm_cluster_kernel<kCollapse>, a, c);
  }
  return e;
}

}  // namespace

namespace raw {
cudaError_t rms_norm(const RmsNormArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  if (const int C = cluster_form_blocks<false>(a.rows, a.d); C > 0)
    return launch_cluster<false>(a, HcCollapseArgs{}, C, s);
  const size_t smem = static_cast<size_t>(2 * ((a.d + 3) / 4 * 4) + dev::torch_sum_scratch_floats(a.d)) * sizeof(float);
  // 256 threads up to rows of 1024 (four 32-blocks per warp at most), 512 above: the model's
  // hidden rows of 5120 then quantise 10 blocks per warp instead of 20 (H200, one row with codes:
  // 9.9 -> 6.9 us). (1024 threads would cap the kernel at 64 registers: it spills.)
  const int threads = a.d > kWideRow ? kWideThreads : kThreads;
  const bool staged = threads == kWideThreads ? staged_smem_fits<rms_norm_staged_kernel<kWideThreads>>(smem)
                                              : staged_smem_fits<rms_norm_staged_kernel<kThreads>>(smem);
  if (staged && a.rows <= 0x7fffffff) {
    cudaError_t e = threads == kWideThreads ? allow_dynamic_smem<rms_norm_staged_kernel<kWideThreads>>(smem)
                                            : allow_dynamic_smem<rms_norm_staged_kernel<kThreads>>(smem);
    if (e != cudaSuccess) return e;
    const unsigned grid = static_cast<unsigned>(a.rows);
    if (threads == kWideThreads) launch_pdl(rms_norm_staged_kernel<kWideThreads>, grid, kWideThreads, smem, s, a);
    else launch_pdl(rms_norm_staged_kernel<kThreads>, grid, kThreads, smem, s, a);
    return cudaGetLastError();
  }
  const unsigned blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  launch_pdl(rms_norm_kernel, blocks, kWarps * 32, 0, s, a);
  return cudaGetLastError();
}

cudaError_t hc_collapse_rms_norm(const HcCollapseArgs& c, const RmsNormArgs& n, cudaStream_t s) {
  if (n.rows == 0) return cudaSuccess;
  if (const int C = cluster_form_blocks<true>(n.rows, n.d); C > 0 && c.hc <= kMaxCollapseWeights)
    return launch_cluster<true>(n, c, C, s);
  const cudaError_t e = hc_collapse(c, s);
  return e != cudaSuccess ? e : rms_norm(n, s);
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
