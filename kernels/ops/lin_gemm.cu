// Lin8 as a register-tiled CUDA-core GEMM, for calls of many activation rows (prefill passes).
//
// Arithmetic (MODEL.md §4, the CPU reference's Lin8 in src/model/linears.cpp and the GEMV kernel's
// fold in kernels/ops/lin_fp8.cu): per (row, output) and 32-wide K block, the 32 code products are
// summed sequentially in fp32 from zero (the products of two e4m3 values are exact, so
// fmaf(x, w, part) equals the reference's part + x*w); the block term is (part * act_scale) *
// w_scale, added to the accumulator in increasing K order from zero; then bf16 rounding if asked.
// __fmul_rn / __fadd_rn keep the compiler from contracting the scale steps into an FMA. This is
// the path of calls with exact_block_sums (and of passes below the tensor-core GEMM's row
// threshold); kernels/ops/lin8_tc_gemm.cu sums the blocks in the tensor core where a call allows it.
//
// Layout: a CTA computes a BM x BN tile of (rows x outputs) and walks K one 32-wide block at a
// time. Per block it stages the activation and weight codes in shared memory, decoded once to fp32
// (K-major: [k][row], [k][output]), with the block's activation scales and E8M0 weight scales;
// global loads of block kb+1 go to registers while block kb is computed (double-buffered shared
// memory, one barrier per block). Each thread owns 8 rows x 8 outputs: per k it reads two float4 of
// activations and two of weights (LDS.128) for 64 FMAs. The thread's rows are 4 + 4 split by BM/2
// and its outputs 4 + 4 split by BN/2, and a warp spans 4 row quads x 8 output quads, so its
// LDS.128 reads touch 64 + 128 distinct bytes (no bank conflicts). The 64 block dots (part) live in
// registers beside the 64 accumulators.
//
// Groups: the CTA columns of up to kLinGroupMax parts are numbered as if their outputs were
// concatenated (each part's last column tile may be partial); a tile computes exactly what the
// part's own call would.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "ops/e4m3_decode.cuh"
#include "ops/env_setting.h"
#include "ops/lin8_tc_gemm.h"
#include "ops/lin_gemm.h"
#include "ops/lin8_gemm_parts.cuh"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kMaxParts = kLinGroupMax;
constexpr int kTM = 8, kTN = 8;  // outputs per thread: rows x outputs
constexpr int kKB = 32;          // K elements per block (one scale each)

using GemmArgs = Lin8GemmParts;

// Sixteen e4m3 codes (one 16-byte chunk of a K row) as exact floats down one shared-memory column.
__device__ __forceinline__ void put16(const uint4& v, float* col, int stride) {
  const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t lo = e4m3x2_to_f16x2(wv[q]), hi = e4m3x2_to_f16x2(wv[q] >> 16);
    col[(4 * q + 0) * stride] = f16_lo(lo);
    col[(4 * q + 1) * stride] = f16_hi(lo);
    col[(4 * q + 2) * stride] = f16_lo(hi);
    col[(4 * q + 3) * stride] = f16_hi(hi);
  }
}
// dev::e8m0_value without branches (0 -> 2^-127, 255 -> NaN, else 2^(b-127)).
__device__ __forceinline__ float e8m0_value_nb(uint32_t b) {
  uint32_t bits = b << 23;
  bits = b == 0 ? 0x00400000u : bits;
  bits = b == 255 ? 0x7fc00000u : bits;
  return __uint_as_float(bits);
}

// Shared memory of one stage (floats): codes decoded K-major, then the block's scales.
template <int BM, int BN>
struct Stage {
  static constexpr int kA = 0;                 // [32][BM] activation values
  static constexpr int kB = kA + kKB * BM;     // [32][BN] weight values
  static constexpr int kXs = kB + kKB * BN;    // [BM] activation scales
  static constexpr int kWs = kXs + BM;         // [BN/32] weight scales
  static constexpr int kFloats = (kWs + BN / 32 + 3) / 4 * 4;  // stages stay 16-byte aligned
  static_assert(kFloats % 4 == 0);
};

template <int BM, int BN>
constexpr size_t gemm_smem_bytes() {
  return 2 * Stage<BM, BN>::kFloats * sizeof(float);
}

// The global loads of one K block held in registers until they are stored to shared memory:
// 16-byte chunks of codes (chunk c: row c/2, K half c%2), one activation scale, one weight scale.
template <int BM, int BN>
struct Fetch {
  static constexpr int kT = BM * BN / (kTM * kTN);
  static constexpr int kAChunks = (2 * BM + kT - 1) / kT;
  static constexpr int kBChunks = (2 * BN + kT - 1) / kT;
  uint4 a[kAChunks];
  uint4 b[kBChunks];
  float xs;
  uint32_t wsb;
};

// One staged K block s (Stage layout) for thread (ty, tx): the 8 x 8 tile's 32-long fma chains from
// zero in K order (rows 4ty..4ty+3 and BM/2+4ty.., outputs 4tx..4tx+3 and BN/2+4tx..), and the tile
// rows' activation scales. Shared by the unsplit and split-K kernels.
template <int BM, int BN>
__device__ __forceinline__ void block_chains(const float* s, int ty, int tx, float (&part)[kTM][kTN],
                                             float (&xsv)[kTM]) {
  using S = Stage<BM, BN>;
  const float* sa = s + S::kA + 4 * ty;
  const float* sb = s + S::kB + 4 * tx;
#pragma unroll
  for (int k = 0; k < kKB; ++k) {
    const float4 a0 = *reinterpret_cast<const float4*>(sa + k * BM);
    const float4 a1 = *reinterpret_cast<const float4*>(sa + k * BM + BM / 2);
    const float4 b0 = *reinterpret_cast<const float4*>(sb + k * BN);
    const float4 b1 = *reinterpret_cast<const float4*>(sb + k * BN + BN / 2);
    const float av[kTM] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float bv[kTN] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) part[i][j] = fmaf(av[i], bv[j], k == 0 ? 0.0f : part[i][j]);
  }
  const float4 x0 = *reinterpret_cast<const float4*>(s + S::kXs + 4 * ty);
  const float4 x1 = *reinterpret_cast<const float4*>(s + S::kXs + BM / 2 + 4 * ty);
  const float v[kTM] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int i = 0; i < kTM; ++i) xsv[i] = v[i];
}

template <int BM, int BN>
__global__ void __launch_bounds__(BM * BN / (kTM * kTN), 1) lin8_gemm_kernel(GemmArgs a) {
  constexpr int kT = BM * BN / (kTM * kTN);
  constexpr int kWX = BN / 64;  // warps along outputs (a warp spans 8 output quads = 32 x 2 outputs)
  using S = Stage<BM, BN>;
  using F = Fetch<BM, BN>;
  static_assert(BM % 32 == 0 && BN % 64 == 0 && kT % 32 == 0 && kT >= BM);
  extern __shared__ __align__(16) float smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tx = (warp % kWX) * 8 + (lane & 7);   // output quad: outputs 4tx.. and BN/2 + 4tx..
  const int ty = (warp / kWX) * 4 + (lane >> 3);  // row quad: rows 4ty.. and BM/2 + 4ty..
  const Lin8PartView pv = lin8_part_of(a, blockIdx.x);
  const int64_t n0 = pv.col * BN, m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t in = a.in, nb = in / kKB;
  const int64_t out = pv.out, rows = a.rows;

  // loads of K block kb into f (out-of-range rows/outputs: zero codes and scales)
  auto fetch_w = [&](F& f, int64_t kb) {
#pragma unroll
    for (int i = 0; i < F::kBChunks; ++i) {
      const int c = tid + i * kT;
      const int64_t o = n0 + (c >> 1);
      f.b[i] = c < 2 * BN && o < out ? __ldg(reinterpret_cast<const uint4*>(pv.w + o * in + kb * kKB + (c & 1) * 16))
                                     : make_uint4(0, 0, 0, 0);
    }
    const int64_t og = n0 + tid * 32;  // weight-scale group tid (32 outputs)
    f.wsb = tid < BN / 32 && og < out ? pv.ws[(og / 32) * nb + kb] : 0u;
  };
  auto fetch_x = [&](F& f, int64_t kb) {
#pragma unroll
    for (int i = 0; i < F::kAChunks; ++i) {
      const int c = tid + i * kT;
      const int64_t r = m0 + (c >> 1);
      f.a[i] = c < 2 * BM && r < rows
                   ? __ldg(reinterpret_cast<const uint4*>(a.x_codes + r * in + kb * kKB + (c & 1) * 16))
                   : make_uint4(0, 0, 0, 0);
    }
    f.xs = tid < BM && m0 + tid < rows ? a.x_scales[(m0 + tid) * nb + kb] : 0.0f;
  };
  // decode f into stage st: value of code k of chunk row r goes to [k][r]
  auto store = [&](const F& f, int st) {
    float* s = smem + st * S::kFloats;
#pragma unroll
    for (int i = 0; i < F::kAChunks; ++i) {
      const int c = tid + i * kT;
      if (c < 2 * BM) put16(f.a[i], s + S::kA + (c & 1) * 16 * BM + (c >> 1), BM);
    }
#pragma unroll
    for (int i = 0; i < F::kBChunks; ++i) {
      const int c = tid + i * kT;
      if (c < 2 * BN) put16(f.b[i], s + S::kB + (c & 1) * 16 * BN + (c >> 1), BN);
    }
    if (tid < BM) s[S::kXs + tid] = f.xs;
    if (tid < BN / 32) s[S::kWs + tid] = e8m0_value_nb(f.wsb);
  };

  F f;
  fetch_w(f, 0);  // weights are never written by kernels: read before the PDL wait
  dev::pdl_enter();
  fetch_x(f, 0);
  store(f, 0);
  __syncthreads();

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.0f;

  for (int64_t kb = 0; kb < nb; ++kb) {
    const int st = static_cast<int>(kb & 1);
    const bool more = kb + 1 < nb;
    if (more) fetch_w(f, kb + 1), fetch_x(f, kb + 1);
    const float* s = smem + st * S::kFloats;
    float part[kTM][kTN], xsv[kTM];
    block_chains<BM, BN>(s, ty, tx, part, xsv);
    // fold the block: acc += (part * act_scale) * w_scale, the reference's order
    const float w0 = s[S::kWs + (4 * tx) / 32], w1 = s[S::kWs + (BN / 2 + 4 * tx) / 32];
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j)
        acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(__fmul_rn(part[i][j], xsv[i]), j < 4 ? w0 : w1));
    if (more) store(f, st ^ 1);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t r = m0 + 4 * ty + (i < 4 ? i : BM / 2 + i - 4);
    if (r >= rows) continue;
    float* yr = pv.y + r * pv.y_stride;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t o = n0 + 4 * tx + (j < 4 ? j : BN / 2 + j - 4);
      if (o < out) yr[o] = a.round_bf16 ? dev::bf16_round(acc[i][j]) : acc[i][j];
    }
  }
}

// ---- K split over warp groups (few output tiles, long K) --------------------------------------------
// When the output tiles alone cannot fill the GPU, a CTA runs S slices of BM*BN/64 threads over the
// same tile: per round, slice g computes K block r*S + g exactly as above (its 32-long chains in
// registers), turns each block dot into its term (part * act_scale) * w_scale and leaves the terms
// in shared memory; then every thread adds the S terms of its own outputs in slice (= K) order to
// its accumulators. The accumulation order is therefore the reference's, block by block from zero.
// One stage buffer: the next round's codes are stored while the terms are folded (after the
// barrier that ends the round's compute).
template <int BM, int BN, int S>
struct SplitLayout {
  static constexpr int kG = BM * BN / (kTM * kTN);  // threads per slice
  static constexpr int kT = S * kG;                 // threads per CTA
  static constexpr int kSlice = Stage<BM, BN>::kFloats;  // one slice's staged block (codes + scales)
  static constexpr int kTerms = S * kSlice;         // terms [S][BM][BN] after the staged blocks
  static constexpr int kFloats = kTerms + S * BM * BN;
  static constexpr int kAChunks = 2 * S * BM / kT;  // 16-byte code chunks per thread per round
  static constexpr int kBChunks = 2 * S * BN / kT;
  static constexpr int kQuads = BM * BN / 4 / kT;   // output quads folded (and written) per thread
  static_assert(2 * S * BM % kT == 0 && 2 * S * BN % kT == 0 && BM * BN / 4 % kT == 0);
  static_assert(kT >= S * BM && BN % 64 == 0 && BM % 32 == 0);
};

template <int BM, int BN, int S>
constexpr size_t split_smem_bytes() {
  return SplitLayout<BM, BN, S>::kFloats * sizeof(float);
}

template <int BM, int BN, int S>
__global__ void __launch_bounds__(SplitLayout<BM, BN, S>::kT, 1) lin8_gemm_split_kernel(GemmArgs a) {
  using L = SplitLayout<BM, BN, S>;
  using St = Stage<BM, BN>;
  constexpr int kWX = BN / 64;
  extern __shared__ __align__(16) float smem[];

  const int tid = threadIdx.x, g = tid / L::kG, ltid = tid % L::kG, lane = tid & 31, lwarp = ltid >> 5;
  const int tx = (lwarp % kWX) * 8 + (lane & 7);
  const int ty = (lwarp / kWX) * 4 + (lane >> 3);
  const Lin8PartView pv = lin8_part_of(a, blockIdx.x);
  const int64_t n0 = pv.col * BN, m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t in = a.in, nb = in / kKB;
  const int64_t out = pv.out, rows = a.rows;
  const int64_t rounds = (nb + S - 1) / S;

  struct F {
    uint4 a[L::kAChunks];
    uint4 b[L::kBChunks];
    float xs;
    uint32_t wsb;
  };
  // chunk c of a round: row c / (2S), slice (c / 2) % S, K half c % 2 (a row's S blocks are
  // contiguous in memory: neighbouring threads read neighbouring 16 bytes)
  auto fetch_w = [&](F& f, int64_t r) {
#pragma unroll
    for (int i = 0; i < L::kBChunks; ++i) {
      const int c = tid + i * L::kT;
      const int64_t o = n0 + c / (2 * S), kb = r * S + (c / 2) % S;
      f.b[i] = o < out && kb < nb ? __ldg(reinterpret_cast<const uint4*>(pv.w + o * in + kb * kKB + (c & 1) * 16))
                                  : make_uint4(0, 0, 0, 0);
    }
    f.wsb = 0;
    if (tid < S * (BN / 32)) {
      const int64_t og = n0 + (tid % (BN / 32)) * 32, kb = r * S + tid / (BN / 32);
      if (og < out && kb < nb) f.wsb = pv.ws[(og / 32) * nb + kb];
    }
  };
  auto fetch_x = [&](F& f, int64_t r) {
#pragma unroll
    for (int i = 0; i < L::kAChunks; ++i) {
      const int c = tid + i * L::kT;
      const int64_t row = m0 + c / (2 * S), kb = r * S + (c / 2) % S;
      f.a[i] = row < rows && kb < nb
                   ? __ldg(reinterpret_cast<const uint4*>(a.x_codes + row * in + kb * kKB + (c & 1) * 16))
                   : make_uint4(0, 0, 0, 0);
    }
    f.xs = 0.0f;
    if (tid < S * BM) {
      const int64_t row = m0 + tid % BM, kb = r * S + tid / BM;
      if (row < rows && kb < nb) f.xs = a.x_scales[row * nb + kb];
    }
  };
  auto store = [&](const F& f) {
#pragma unroll
    for (int i = 0; i < L::kAChunks; ++i) {
      const int c = tid + i * L::kT, sl = (c / 2) % S;
      put16(f.a[i], smem + sl * L::kSlice + St::kA + (c & 1) * 16 * BM + c / (2 * S), BM);
    }
#pragma unroll
    for (int i = 0; i < L::kBChunks; ++i) {
      const int c = tid + i * L::kT, sl = (c / 2) % S;
      put16(f.b[i], smem + sl * L::kSlice + St::kB + (c & 1) * 16 * BN + c / (2 * S), BN);
    }
    if (tid < S * BM) smem[(tid / BM) * L::kSlice + St::kXs + tid % BM] = f.xs;
    if (tid < S * (BN / 32)) smem[(tid / (BN / 32)) * L::kSlice + St::kWs + tid % (BN / 32)] = e8m0_value_nb(f.wsb);
  };

  F f;
  fetch_w(f, 0);  // weights are never written by kernels: read before the PDL wait
  dev::pdl_enter();
  fetch_x(f, 0);
  store(f);
  __syncthreads();

  float4 acc[L::kQuads];
#pragma unroll
  for (int i = 0; i < L::kQuads; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float* sg = smem + g * L::kSlice;
  float* terms = smem + L::kTerms;

  for (int64_t r = 0; r < rounds; ++r) {
    const bool more = r + 1 < rounds;
    if (more) fetch_w(f, r + 1), fetch_x(f, r + 1);
    {
      float part[kTM][kTN], xsv[kTM];
      block_chains<BM, BN>(sg, ty, tx, part, xsv);
      const float w0 = sg[St::kWs + (4 * tx) / 32], w1 = sg[St::kWs + (BN / 2 + 4 * tx) / 32];
      float* tg = terms + g * (BM * BN);
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
        const int row = 4 * ty + (i < 4 ? i : BM / 2 + i - 4);
        float t[kTN];
#pragma unroll
        for (int j = 0; j < kTN; ++j) t[j] = __fmul_rn(__fmul_rn(part[i][j], xsv[i]), j < 4 ? w0 : w1);
        *reinterpret_cast<float4*>(tg + row * BN + 4 * tx) = make_float4(t[0], t[1], t[2], t[3]);
        *reinterpret_cast<float4*>(tg + row * BN + BN / 2 + 4 * tx) = make_float4(t[4], t[5], t[6], t[7]);
      }
    }
    __syncthreads();
    // the round's terms in K order; slices past the last block hold no term
    const int valid = static_cast<int>(nb - r * S < S ? nb - r * S : S);
#pragma unroll
    for (int sl = 0; sl < S; ++sl) {
      if (sl >= valid) break;
#pragma unroll
      for (int i = 0; i < L::kQuads; ++i) {
        const float4 t = *reinterpret_cast<const float4*>(terms + sl * (BM * BN) + 4 * (tid + i * L::kT));
        acc[i].x = __fadd_rn(acc[i].x, t.x);
        acc[i].y = __fadd_rn(acc[i].y, t.y);
        acc[i].z = __fadd_rn(acc[i].z, t.z);
        acc[i].w = __fadd_rn(acc[i].w, t.w);
      }
    }
    if (more) store(f);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < L::kQuads; ++i) {
    const int q = 4 * (tid + i * L::kT);
    const int64_t r = m0 + q / BN, o = n0 + q % BN;
    if (r >= rows) continue;
    float* yr = pv.y + r * pv.y_stride;
    const float v[4] = {acc[i].x, acc[i].y, acc[i].z, acc[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (o + e < out) yr[o + e] = a.round_bf16 ? dev::bf16_round(v[e]) : v[e];
  }
}

// Rows from which Lin8 calls take the GEMM; the forced tile (1..5), 0 = chosen per call.
EnvSetting g_min_rows{"DSV41_LIN8_GEMM_MIN_ROWS", raw::kLin8GemmMinRows, 1, INT64_MAX};
EnvSetting g_tile{"DSV41_LIN8_GEMM_TILE", 0, 0, 5};
int64_t min_rows() { return g_min_rows.get(); }
int forced_tile() { return static_cast<int>(g_tile.get()); }
// The tensor-core GEMM: rows from which it takes calls without exact_block_sums; its forced tile.
// It takes every such call it can run, never handing one to the sequential kernels on a time
// estimate, so from the threshold up a row's bits do not depend on the size of the pass it is in.
// Below it such calls take the sequential kernels (a row's bits then match the CPU engine's, and
// may differ from the same row's in a larger pass where a block sum needs more than 24 bits).
EnvSetting g_tc_min_rows{"DSV41_LIN8_TC_MIN_ROWS", raw::kLin8TcMinRows, 1, INT64_MAX};
EnvSetting g_tc_tile{"DSV41_LIN8_TC_TILE", 0, 0, raw::kLin8TcTiles};
bool tc_takes(const Lin8GroupArgs& g) {
  return g.count > 0 && !g.lin[0].exact_block_sums && g.lin[0].m >= g_tc_min_rows.get() &&
         raw::lin8_tc_gemm_supported(g);
}
// DSV41_LIN8_GEMM_SPLIT=0 keeps the automatic choice to the unsplit 128x128 tile.
bool split_allowed() {
  static const bool on = env_int("DSV41_LIN8_GEMM_SPLIT", 1, 0, 1) == 1;
  return on;
}


// Whether variant v's shared memory fits the device (GB10's 99 KB leaves out the two K-split tiles,
// 132 and 165 KB; pick_tile then never takes them).
bool tile_fits(int v) {
  switch (v) {
    case 1: return smem_fits(lin8_gemm_kernel<64, 64>, gemm_smem_bytes<64, 64>());
    case 2: return smem_fits(lin8_gemm_kernel<128, 64>, gemm_smem_bytes<128, 64>());
    case 3: return smem_fits(lin8_gemm_kernel<128, 128>, gemm_smem_bytes<128, 128>());
    case 4: return smem_fits(lin8_gemm_split_kernel<64, 64, 4>, split_smem_bytes<64, 64, 4>());
    case 5: return smem_fits(lin8_gemm_split_kernel<32, 64, 8>, split_smem_bytes<32, 64, 8>());
    default: return false;
  }
}

// Every variant that fits, at the first call on a device (an eager pass before any graph capture
// then covers the tiles a captured call may pick).
cudaError_t configure_all() {
  static std::atomic<uint64_t> d1{0}, d2{0}, d3{0}, d4{0}, d5{0};
  cudaError_t e = cudaSuccess;
  if (tile_fits(1)) e = allow_smem(lin8_gemm_kernel<64, 64>, gemm_smem_bytes<64, 64>(), d1);
  if (e == cudaSuccess && tile_fits(2)) e = allow_smem(lin8_gemm_kernel<128, 64>, gemm_smem_bytes<128, 64>(), d2);
  if (e == cudaSuccess && tile_fits(3)) e = allow_smem(lin8_gemm_kernel<128, 128>, gemm_smem_bytes<128, 128>(), d3);
  if (e == cudaSuccess && tile_fits(4))
    e = allow_smem(lin8_gemm_split_kernel<64, 64, 4>, split_smem_bytes<64, 64, 4>(), d4);
  if (e == cudaSuccess && tile_fits(5))
    e = allow_smem(lin8_gemm_split_kernel<32, 64, 8>, split_smem_bytes<32, 64, 8>(), d5);
  return e;
}

template <class Kernel>
cudaError_t launch(Kernel kernel, int bm, int bn, int threads, size_t smem, GemmArgs a, cudaStream_t s) {
  cudaError_t e = configure_all();
  if (e != cudaSuccess) return e;
  const int64_t cols = lin8_number_part_tiles(a, bn);
  // grid.y is limited to 65535: row tiles run in slices
  const int64_t row_tiles = (a.rows + bm - 1) / bm;
  for (int64_t t0 = 0; t0 < row_tiles; t0 += 65535) {
    const int64_t nt = std::min<int64_t>(row_tiles - t0, 65535), r0 = t0 * bm;
    GemmArgs c = a;
    c.x_codes = a.x_codes + r0 * a.in;
    c.x_scales = a.x_scales + r0 * (a.in / kKB);
    for (int p = 0; p < a.n_parts; ++p) c.y[p] = a.y[p] + r0 * a.y_stride[p];
    c.rows = a.rows - r0;
    const dim3 grid(static_cast<unsigned>(cols), static_cast<unsigned>(nt));
    e = launch_pdl(kernel, grid, dim3(threads), smem, s, c);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Time model (µs, H200, bench_gpu_linear --gemm): a CTA of 8 warps (every variant the automatic
// choice uses; one per SM: registers and shared memory) takes ~3.6 µs per round of one K block per
// warp group unsplit; CTAs are dealt in waves over the SMs. The GEMV kernel runs at ~12-17 TFLOP/s
// on these shapes. Split rounds cost more (terms through shared memory, more staging per FMA:
// measured ~4.2 µs for 64x64/k4, ~4.7 µs for 32x64/k8); the overhead terms below are smaller, which
// picked the fastest variant (or the GEMV kernel) for every real shape at m = 256 on H200.
struct Variant {
  int bm, bn, s;
  double overhead;
};
constexpr Variant kVariants[6] = {{0, 0, 0, 0.0},        {64, 64, 1, 0.0},      {128, 64, 1, 0.0},
                                  {128, 128, 1, 0.0},    {64, 64, 4, 0.10},     {32, 64, 8, 0.15}};
constexpr double kRoundUs = 3.6, kLaunchUs = 3.0, kGemvFlopsPerUs = 15.0e6;

double gemm_us(int v, int64_t m, int64_t in, const int64_t* outs, int n_parts) {
  const Variant& t = kVariants[v];
  int64_t cols = 0;
  for (int p = 0; p < n_parts; ++p) cols += (outs[p] + t.bn - 1) / t.bn;
  const int64_t ctas = cols * ((m + t.bm - 1) / t.bm), sms = sm_count();
  const int64_t waves = (ctas + sms - 1) / sms, rounds = (in / kKB + t.s - 1) / t.s;
  return kLaunchUs + static_cast<double>(waves * rounds) * kRoundUs * (1.0 + t.overhead);
}
double gemv_us(int64_t m, int64_t in, const int64_t* outs, int n_parts) {
  int64_t out = 0;
  for (int p = 0; p < n_parts; ++p) out += outs[p];
  return kLaunchUs + 2.0 * static_cast<double>(m) * static_cast<double>(in) * static_cast<double>(out) / kGemvFlopsPerUs;
}
// The variant for a call: the forced one, else the fastest by the model; *us gets its estimate.
int pick_tile(int64_t m, int64_t in, const int64_t* outs, int n_parts, double* us) {
  const int forced = forced_tile();
  if (forced >= 1) {
    *us = gemm_us(forced, m, in, outs, n_parts);
    return forced;
  }
  int best = 3;
  *us = gemm_us(3, m, in, outs, n_parts);
  if (split_allowed())
    for (int v : {4, 5}) {
      if (!tile_fits(v)) continue;
      const double t = gemm_us(v, m, in, outs, n_parts);
      if (t < *us) best = v, *us = t;
    }
  return best;
}

}  // namespace

namespace raw {

bool lin8_gemm_takes(const Lin8GroupArgs& g) {
  if (tc_takes(g)) return true;
  if (g.count <= 0 || g.lin[0].m < min_rows()) return false;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(g.lin[0].x_codes) || g.lin[0].w.in % kKB != 0) return false;
  const int n = std::min(g.count, kMaxParts);
  int64_t outs[kMaxParts] = {};
  for (int p = 0; p < n; ++p) {
    if (!aligned(g.lin[p].w.codes)) return false;
    outs[p] = g.lin[p].w.out;
  }
  if (forced_tile() >= 1) return true;
  double us = 0;
  pick_tile(g.lin[0].m, g.lin[0].w.in, outs, n, &us);
  return us < gemv_us(g.lin[0].m, g.lin[0].w.in, outs, n);
}

cudaError_t lin8_gemm(const Lin8GroupArgs& g, cudaStream_t s) {
  const Lin8Args& l = g.lin[0];
  if (g.count <= 0 || l.m <= 0) return cudaSuccess;
  if (tc_takes(g)) return raw::lin8_tc_gemm(g, static_cast<int>(g_tc_tile.get()), s);
  GemmArgs a;
  fill_lin8_parts(a, g, kMaxParts);
  for (int p = 0; p < a.n_parts; ++p)
    if (a.out[p] <= 0) return cudaSuccess;  // (the wrappers reject empty outputs)
  double us = 0;
  const int tile = pick_tile(a.rows, a.in, a.out, a.n_parts, &us);
  if (!tile_fits(tile)) return cudaErrorInvalidValue;  // a forced tile beyond the device's shared memory
  switch (tile) {
    case 1: return launch(lin8_gemm_kernel<64, 64>, 64, 64, 64, gemm_smem_bytes<64, 64>(), a, s);
    case 2: return launch(lin8_gemm_kernel<128, 64>, 128, 64, 128, gemm_smem_bytes<128, 64>(), a, s);
    case 4:
      return launch(lin8_gemm_split_kernel<64, 64, 4>, 64, 64, SplitLayout<64, 64, 4>::kT, split_smem_bytes<64, 64, 4>(),
                    a, s);
    case 5:
      return launch(lin8_gemm_split_kernel<32, 64, 8>, 32, 64, SplitLayout<32, 64, 8>::kT, split_smem_bytes<32, 64, 8>(),
                    a, s);
    default: return launch(lin8_gemm_kernel<128, 128>, 128, 128, 256, gemm_smem_bytes<128, 128>(), a, s);
  }
}

int64_t set_lin8_gemm_min_rows(int64_t m) { return g_min_rows.set(m); }
int set_lin8_gemm_tile(int tile) { return static_cast<int>(g_tile.set(tile)); }
bool lin8_gemm_tile_fits(int tile) { return tile_fits(tile); }
int64_t set_lin8_tc_min_rows(int64_t m) { return g_tc_min_rows.set(m); }
int set_lin8_tc_tile(int tile) { return static_cast<int>(g_tc_tile.set(tile)); }

}  // namespace raw
}  // namespace dsv41::ops::gpu
