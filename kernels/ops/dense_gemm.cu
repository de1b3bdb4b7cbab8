// Dense LinBF16 / LinF32 (MODEL.md §4) as a register-tiled CUDA-core GEMM, for calls of many
// activation rows (prefill passes).
//
// Arithmetic (src/model/ops/dot.h, the header of lin_dense.cu): per (row, output) the products run
// as fma chains over 256-wide K blocks, each chain from zero in increasing K order; the block
// results are added to a total from zero in K order (__fadd_rn, no contraction); then bf16 rounding
// if asked. Every thread keeps, per output it owns, the running chain and the total in registers,
// so the order is exactly the reference's; only which thread does the work changes. (Prefill
// passes send bf16 calls to the tensor cores instead, kernels/ops/dense_tc_gemm.cu, whose order and
// rounding are the tensor core's; this kernel keeps the rest, and all of them under
// exact_block_sums.)
//
// Layout (follows kernels/ops/lin_gemm.cu): a CTA computes a BM x BN tile of (rows x outputs) and
// walks K 32 (or 16) columns at a time. Each step stages the activations and the weights (bf16 widened
// once) in shared memory K-major ([k][row], [k][output]); the global loads of step s+1 go to
// registers while step s is computed (double-buffered shared memory, one barrier per step). The
// loads are dealt so that the 32 lanes of a warp take 32 consecutive rows of one 16-byte chunk:
// their transposed stores hit 32 distinct banks. Each thread owns 8 rows x 8 outputs (4 + 4 split
// by BM/2, 4 + 4 split by BN/2; a warp spans 4 row quads x 8 output quads), so per k it reads two
// float4 of activations and two of weights for 64 fmas without bank conflicts. The 64 chains and
// 64 totals live in registers.
//
// H200 (bench_gpu_linear --dense), wo_a 8 groups x 1024 x 4096, bf16 weights: m = 1024 4048 ->
// 2140 us (17.0 -> 32.1 TFLOP/s, 48 % of the 67 TFLOP/s fp32 FMA ceiling), m = 256 1060 -> 547 us,
// both on the 128x128 tile (64x64: 2301 / 596 us). The compressor's 512 x 5120 at m = 1024 has
// 32 tiles of 128x128 (836 us, worse than the older kernel's 584) and 128 of 64x64 (410 us fp32,
// 326 us bf16 against 584 / 383); at m = 256 both tiles lose (32 tiles of 64x64: 408 vs 189 us).
// In the model, with the compressor calls at m = 1024 on the 64x64 tile, the dense kernels' total
// of an 8k prefill (1024-token passes) rose from 63.5 to 69.8 ms, so pick_tile's fill rule keeps
// them on the older kernel.
//
// Grouped calls (wo_a): grid.z is the group; a group's tile reads its own K slice of the activation
// rows and its own weight rows, and writes its own output columns, exactly as the group's own call.
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "ops/dense_gemm.h"
#include "ops/env_setting.h"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kTM = 8, kTN = 8;  // outputs per thread: rows x outputs
// K columns per step: 32 for the 128x128 tile; 16 for 64x64, whose 64 threads would otherwise hold
// twice the prefetched chunks each and spill (255 registers).
template <int BM>
constexpr int step_k() {
  return BM >= 128 ? 32 : 16;
}

template <int BM, int BN>
struct Tile {
  static constexpr int kT = BM * BN / (kTM * kTN);  // threads
  static constexpr int kBK = step_k<BM>();
  static constexpr int kStepsPerBlock = dev::kGemmKBlock / kBK;
  static constexpr int kA = 0;                      // [kBK][BM] activations
  static constexpr int kB = kBK * BM;               // [kBK][BN] weights
  static constexpr int kStageFloats = kBK * (BM + BN);
  static constexpr size_t kSmemBytes = 2 * kStageFloats * sizeof(float);
  static_assert(BM % 32 == 0 && BN % 64 == 0 && kT % 32 == 0 && dev::kGemmKBlock % kBK == 0);
};

// The 16-byte chunks of one step: activations (fp32, kBK / 4 chunks per row) and weights
// (16 / sizeof(W) values per chunk). Chunk c: row c % rows_of_tile, chunk-in-row c / rows_of_tile.
template <class W, int BM, int BN>
struct Fetch {
  static constexpr int kT = Tile<BM, BN>::kT;
  static constexpr int kBK = Tile<BM, BN>::kBK;
  static constexpr int kWElems = 16 / sizeof(W);
  static constexpr int kWChunksPerRow = kBK / kWElems;
  static constexpr int kAChunks = kBK / 4 * BM / kT;
  static constexpr int kBChunks = kWChunksPerRow * BN / kT;
  static_assert(kBK / 4 * BM % kT == 0 && kWChunksPerRow * BN % kT == 0 && kT % BM == 0 && kT % BN == 0);
  uint4 a[kAChunks];
  uint4 b[kBChunks];
};

// Chunk v (16 bytes) to floats down one shared-memory column (stride floats apart).
__device__ __forceinline__ void put_chunk(const uint4& v, float* col, int stride, const float*) {
  col[0] = __uint_as_float(v.x);
  col[stride] = __uint_as_float(v.y);
  col[2 * stride] = __uint_as_float(v.z);
  col[3 * stride] = __uint_as_float(v.w);
}
template <class W>  // bf16 (uint16_t) or fp16 (__half) storage
__device__ __forceinline__ void put_chunk(const uint4& v, float* col, int stride, const W* tag) {
  float w[8];
  dev::widen8(v, w, tag);
#pragma unroll
  for (int i = 0; i < 8; ++i) col[i * stride] = w[i];
}

template <class W, int BM, int BN>
__global__ void __launch_bounds__(Tile<BM, BN>::kT, 1) dense_gemm_kernel(DenseArgs a) {
  using T = Tile<BM, BN>;
  using F = Fetch<W, BM, BN>;
  constexpr int kT = T::kT, kBK = T::kBK;
  constexpr int kWX = BN / 64;  // warps along outputs
  extern __shared__ __align__(16) float smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tx = (warp % kWX) * 8 + (lane & 7);   // outputs 4tx.. and BN/2 + 4tx..
  const int ty = (warp / kWX) * 4 + (lane >> 3);  // rows 4ty.. and BM/2 + 4ty..
  const int64_t in = a.in, out = a.out, g = blockIdx.z, rows = a.m;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN, m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const W* wg = static_cast<const W*>(a.w) + g * out * in;
  const float* xg = a.x + g * in;
  const int64_t steps = in / kBK;

  // global loads of step s into f (rows/outputs past the end: zeros, never used for a stored output)
  auto fetch_w = [&](F& f, int64_t s) {
#pragma unroll
    for (int i = 0; i < F::kBChunks; ++i) {
      const int c = tid + i * kT;
      const int64_t o = n0 + c % BN;
      const int ch = c / BN;
      f.b[i] = o < out ? __ldg(reinterpret_cast<const uint4*>(wg + o * in + s * kBK + ch * F::kWElems))
                       : make_uint4(0, 0, 0, 0);
    }
  };
  auto fetch_x = [&](F& f, int64_t s) {
#pragma unroll
    for (int i = 0; i < F::kAChunks; ++i) {
      const int c = tid + i * kT;
      const int64_t r = m0 + c % BM;
      const int ch = c / BM;
      f.a[i] = r < rows ? *reinterpret_cast<const uint4*>(xg + r * a.x_stride + s * kBK + ch * 4)
                        : make_uint4(0, 0, 0, 0);
    }
  };
  auto store = [&](const F& f, int st) {
    float* sm = smem + st * T::kStageFloats;
#pragma unroll
    for (int i = 0; i < F::kAChunks; ++i) {
      const int c = tid + i * kT;
      put_chunk(f.a[i], sm + T::kA + (c / BM) * 4 * BM + c % BM, BM, static_cast<const float*>(nullptr));
    }
#pragma unroll
    for (int i = 0; i < F::kBChunks; ++i) {
      const int c = tid + i * kT;
      put_chunk(f.b[i], sm + T::kB + (c / BN) * F::kWElems * BN + c % BN, BN, static_cast<const W*>(nullptr));
    }
  };

  F f;
  fetch_w(f, 0);  // weights are never written by kernels: read before the PDL wait
  dev::pdl_enter();
  fetch_x(f, 0);
  store(f, 0);
  __syncthreads();

  float chain[kTM][kTN], total[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) chain[i][j] = total[i][j] = 0.0f;

  for (int64_t s = 0; s < steps; ++s) {
    const bool more = s + 1 < steps;
    if (more) fetch_w(f, s + 1), fetch_x(f, s + 1);
    const float* sm = smem + (s & 1) * T::kStageFloats;
    const float* sa = sm + T::kA + 4 * ty;
    const float* sb = sm + T::kB + 4 * tx;
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(sa + k * BM);
      const float4 a1 = *reinterpret_cast<const float4*>(sa + k * BM + BM / 2);
      const float4 b0 = *reinterpret_cast<const float4*>(sb + k * BN);
      const float4 b1 = *reinterpret_cast<const float4*>(sb + k * BN + BN / 2);
      const float av[kTM] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[kTN] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) chain[i][j] = fmaf(av[i], bv[j], chain[i][j]);
    }
    // a 256-wide block (or the last, shorter one) is complete: add its chain to the total in K order
    if ((s + 1) % T::kStepsPerBlock == 0 || !more) {
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) {
          total[i][j] = __fadd_rn(total[i][j], chain[i][j]);
          chain[i][j] = 0.0f;
        }
    }
    if (more) store(f, static_cast<int>((s + 1) & 1));
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t r = m0 + 4 * ty + (i < 4 ? i : BM / 2 + i - 4);
    if (r >= rows) continue;
    float* yr = a.y + r * a.y_stride + g * out;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t o = n0 + 4 * tx + (j < 4 ? j : BN / 2 + j - 4);
      if (o < out) yr[o] = a.round_bf16 ? dev::bf16_round(total[i][j]) : total[i][j];
    }
  }
}

// Rows from which dense calls take the GEMM; the forced tile (1 = 64x64, 2 = 128x128), 0 = chosen
// per call.
EnvSetting g_min_rows{"DSV41_DENSE_GEMM_MIN_ROWS", raw::kDenseGemmMinRows, 1, INT64_MAX};
EnvSetting g_tile{"DSV41_DENSE_GEMM_TILE", 0, 0, 2};
int64_t min_rows() { return g_min_rows.get(); }
int forced_tile() { return static_cast<int>(g_tile.get()); }

template <int BM, int BN>
int64_t ctas(const DenseArgs& a) {
  return ((a.out + BN - 1) / BN) * ((a.m + BM - 1) / BM) * a.groups;
}

// The tile for a call: the forced one; else 128x128 when its CTAs fill the GPU at least once
// (one CTA of 8 warps per SM; a wave a few CTAs short counts), else 64x64 when its CTAs reach two
// per SM; 0 = neither.
int pick_tile(const DenseArgs& a) {
  const int forced = forced_tile();
  if (forced >= 1) return forced;
  const int64_t sms = sm_count();
  if (ctas<128, 128>(a) >= sms - sms / 8) return 2;
  if (ctas<64, 64>(a) >= 2 * sms) return 1;
  return 0;
}

// (configure_all<W> has opted the kernel in to its shared memory)
template <class W, int BM, int BN>
cudaError_t launch(const DenseArgs& a, cudaStream_t s) {
  using T = Tile<BM, BN>;
  const dim3 grid(static_cast<unsigned>((a.out + BN - 1) / BN), static_cast<unsigned>((a.m + BM - 1) / BM),
                  static_cast<unsigned>(a.groups));
  return launch_pdl(dense_gemm_kernel<W, BM, BN>, grid, dim3(T::kT), T::kSmemBytes, s, a);
}

// Every variant at the first call on a device (an eager pass before a graph capture then covers the
// tiles a captured call may pick).
template <class W>
cudaError_t configure_all() {
  static std::atomic<uint64_t> d1{0}, d2{0};
  cudaError_t e = allow_smem(dense_gemm_kernel<W, 64, 64>, Tile<64, 64>::kSmemBytes, d1);
  if (e == cudaSuccess) e = allow_smem(dense_gemm_kernel<W, 128, 128>, Tile<128, 128>::kSmemBytes, d2);
  return e;
}

template <class W>
cudaError_t run(const DenseArgs& a, cudaStream_t s) {
  const cudaError_t e = configure_all<W>();
  if (e != cudaSuccess) return e;
  if (pick_tile(a) == 1) return launch<W, 64, 64>(a, s);
  return launch<W, 128, 128>(a, s);
}

}  // namespace

namespace raw {

bool dense_gemm_takes(const DenseArgs& a) {
  if (a.m < min_rows() || a.in % 32 != 0 || a.x_stride % 4 != 0) return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
  if ((a.m + 63) / 64 > 65535) return false;  // grid.y
  return pick_tile(a) != 0;
}

cudaError_t dense_gemm(const DenseArgs& a, cudaStream_t s) {
  if (a.m <= 0 || a.out <= 0) return cudaSuccess;
  if (a.in % 32 != 0 || (a.m + 63) / 64 > 65535) return cudaErrorInvalidValue;
  if (a.wt == DenseType::BF16) return run<uint16_t>(a, s);
  if (a.wt == DenseType::F16) return run<__half>(a, s);
  return run<float>(a, s);
}

int64_t set_dense_gemm_min_rows(int64_t m) { return g_min_rows.set(m); }
int set_dense_gemm_tile(int tile) { return static_cast<int>(g_tile.set(tile)); }

}  // namespace raw
}  // namespace dsv41::ops::gpu
