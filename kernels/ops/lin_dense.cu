// LinBF16 / LinF32 (MODEL.md §4) with the CPU reference's accumulation order (dot.h: fma chains over
// 256-wide K blocks from zero, block results added in K order from zero). Bit-identical to the
// reference; the grouped form serves the low-rank output projection wo_a.
//
// Tiled kernel (aligned rows, the usual case): a CTA of 128 threads owns 128/S output rows and R
// activation rows. Thread (s, o) runs the fma chains of row o over the K blocks s, s+S, s+2S, ...,
// R chains side by side (one per activation row, which also hides the fma latency). The weights
// stream through shared memory in 128-byte row pieces with cp.async (three stages in flight,
// coalesced 16-byte copies), the activation pieces ride along and are read as broadcasts. With
// S > 1 (few output rows: split K to fill the GPU) each round's S block results meet in shared
// memory and the s = 0 thread adds them in K order. Unaligned shapes and linears with few output
// rows at larger m take the warp-per-row kernel.
//
// Decode sizes that one wave of CTAs holds (m <= 4, rows of a multiple of 16 bytes: the compressor's
// wkv/wgate, the index keys, weights_proj) take the weight-streaming kernel in dense_stream.cu
// instead (same arithmetic; raw::dense_stream_takes decides). It replaced the staged kernel that
// held these calls; H200 bench_gpu_linear --dense, own time (no PDL) before -> after: compressor
// 512 fp32 rows of 5120 m = 1 / 2 / 4: 12.9 / 22.6 / 32.4 -> 9.9 / 15.0 / 23.0 us (plans of 4 rows
// per tile then; 8 rows, now chosen at m <= 2, ran 5.9 against 7.6 us with PDL at m = 1), the index
// keys m = 2 / 4: 11.7 / 16.3 -> 8.2 / 11.9 us (m = 1 unchanged, ~5.5 us), weights_proj m = 1 / 2 /
// 4: 10.4 / 14.2 / 23.8 -> 7.6 / 12.5 / 20.7 us. wo_a and the head stay on the tiled kernel below
// (streamed they were slower); at m <= 4 both now take one cp.async ring a warp (dense_ring.cu,
// same arithmetic), which reads them near the copy rate; this kernel keeps the calls of too few
// rows for the ring's tiles and the m > 4 ones.
//
// Calls of many activation rows with enough output tiles (prefill: wo_a) take the register-tiled
// GEMM in dense_gemm.cu instead (same arithmetic; raw::dense_gemm_takes decides).
//
// The warp and tiled kernels launch with programmatic dependent launch (ops/pdl.cuh) and wait for
// the previous kernel before touching global memory, except for the tiled kernel's first weight
// stages (weights are never written by kernels).
#include <cuda_bf16.h>

#include <atomic>

#include "ops/cp_async.cuh"
#include "ops/dense_gemm.h"
#include "ops/dense_ring.h"
#include "ops/dense_stream.h"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

// ---- warp-per-row kernel (any alignment; few output rows) ----------------------------------------------------
constexpr int kWarps = 8;
constexpr int kRows = 4;

template <class W>
__device__ __forceinline__ float wval(const W* w, int64_t k);
template <>
__device__ __forceinline__ float wval<uint16_t>(const uint16_t* w, int64_t k) { return dev::bf16_bits_to_f32(w[k]); }
template <>
__device__ __forceinline__ float wval<__half>(const __half* w, int64_t k) { return __half2float(w[k]); }
template <>
__device__ __forceinline__ float wval<float>(const float* w, int64_t k) { return w[k]; }

// Eight weights starting at w + k as floats (16-byte loads for bf16 / fp16, two for fp32; k % 8 == 0).
template <class W>
__device__ __forceinline__ void load8(const W* w, int64_t k, float (&o)[8]) {
  dev::widen8(*reinterpret_cast<const uint4*>(w + k), o, w);
}
__device__ __forceinline__ void load8(const float* w, int64_t k, float (&o)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(w + k);
  const float4 b = *reinterpret_cast<const float4*>(w + k + 4);
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

// Lane j owns K block j (+32, ...) and runs one fma chain per activation row over it; the weights
// are read once for all rows (vector loads when Vec: in % 8 == 0 and aligned rows).
template <class W, bool Vec>
__global__ void dense_warp_kernel(DenseArgs a) {
  dev::pdl_enter();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= a.out) return;
  const int lane = threadIdx.x & 31;
  const int64_t g = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int nr = static_cast<int>(a.m - r0 < kRows ? a.m - r0 : kRows);
  const W* wrow = static_cast<const W*>(a.w) + (g * a.out + o) * a.in;
  const float* x = a.x + r0 * a.x_stride + g * a.in;
  const int64_t nb = (a.in + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t base = 0; base < nb; base += 32) {
    const int64_t kb = base + lane;
    const int cnt = static_cast<int>(nb - base < 32 ? nb - base : 32);
    float part[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (kb < nb) {
      const int64_t k0 = kb * dev::kGemmKBlock;
      const int64_t k1 = k0 + dev::kGemmKBlock < a.in ? k0 + dev::kGemmKBlock : a.in;
      int64_t k = k0;
      if constexpr (Vec) {
        // unrolled so that the weight loads of several steps are in flight before their fma chain
        // needs them (the chain order is unchanged)
#pragma unroll 8
        for (; k + 8 <= k1; k += 8) {
          float wv[8];
          load8(wrow, k, wv);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r < nr) {
              const float* xr = x + r * a.x_stride + k;
              const float4 x0 = *reinterpret_cast<const float4*>(xr);
              const float4 x1 = *reinterpret_cast<const float4*>(xr + 4);
              const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
              for (int i = 0; i < 8; ++i) part[r] = fmaf(xv[i], wv[i], part[r]);
            }
          }
        }
      }
      for (; k < k1; ++k) {
        const float wv = wval(wrow, k);
        for (int r = 0; r < nr; ++r) part[r] = fmaf(x[r * a.x_stride + k], wv, part[r]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      if (r < nr)
        for (int j = 0; j < cnt; ++j) acc[r] = __fadd_rn(acc[r], __shfl_sync(dev::kFull, part[r], j));
  }
  if (lane < nr) {
    float v = acc[0];
    for (int r = 1; r < kRows; ++r)
      if (lane == r) v = acc[r];
    a.y[(r0 + lane) * a.y_stride + g * a.out + o] = a.round_bf16 ? dev::bf16_round(v) : v;
  }
}

// ---- tiled kernel ------------------------------------------------------------------------------------
constexpr int kT = 128;                    // threads per CTA
constexpr int kPieceBytes = 128;           // bytes of one weight row per stage
constexpr int kPitch = kPieceBytes + 16;   // smem row pitch: conflict-free 16-byte reads
constexpr int kStages = 3;

using dev::cp_async16;
using dev::cp_async_commit;
using dev::cp_async_wait;

// Eight weights at p as floats (one 16-byte read of bf16 / fp16, two of fp32).
template <class W>
__device__ __forceinline__ void smem8(const W* p, float (&o)[8]) {
  dev::widen8(*reinterpret_cast<const uint4*>(p), o, p);
}
__device__ __forceinline__ void smem8(const float* p, float (&o)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

template <class W, int R, int S>
struct TileShape {
  static constexpr int kTO = kT / S;                             // output rows per CTA
  static constexpr int kCols = kPieceBytes / sizeof(W);          // K columns per stage (64 / 32)
  static constexpr int kSub = dev::kGemmKBlock / kCols;          // stages per 256-block round
  static constexpr int kXPitch = R * kCols + 4;                  // floats per slice in the x piece
  static constexpr int kWBytes = kStages * kT * kPitch;
  static constexpr int kXBytes = kStages * S * kXPitch * 4;
  static constexpr int kFoldBytes = S > 1 ? 2 * R * S * kTO * 4 : 0;
  static constexpr int kBytes = kWBytes + kXBytes + kFoldBytes;
};

template <class W, int R, int S>
__global__ void __launch_bounds__(kT) dense_tiled_kernel(DenseArgs a) {
  using Sh = TileShape<W, R, S>;
  constexpr int kTO = Sh::kTO, kCols = Sh::kCols, kSub = Sh::kSub, kXPitch = Sh::kXPitch;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* wbuf = smem;
  float* xbuf = reinterpret_cast<float*>(smem + Sh::kWBytes);
  float* fold = reinterpret_cast<float*>(smem + Sh::kWBytes + Sh::kXBytes);

  const int t = threadIdx.x, s = t / kTO, ol = t % kTO;
  const int64_t in = a.in, out = a.out, g = blockIdx.z;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTO, o = o0 + ol;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * R;
  const int nr = static_cast<int>(a.m - r0 < R ? a.m - r0 : R);
  const W* wg = static_cast<const W*>(a.w) + g * out * in;
  const int64_t nb = (in + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  const int64_t rounds = (nb + S - 1) / S, n_stages = rounds * kSub;

  // valid columns of slice sl's piece in stage q (0 when its block is past the end)
  auto piece_cols = [&](int64_t q, int sl, int64_t& k0) -> int {
    const int64_t kb = (q / kSub) * S + sl;
    k0 = kb * dev::kGemmKBlock + (q % kSub) * kCols;
    if (kb >= nb || k0 >= in) return 0;
    return static_cast<int>(in - k0 < kCols ? in - k0 : kCols);
  };
  auto issue_w = [&](int64_t q, int buf) {
    constexpr int kChunks = kPieceBytes / 16, kElems = 16 / sizeof(W);
    for (int c = t; c < kT * kChunks; c += kT) {
      const int row = c / kChunks, ch = c % kChunks;
      const int64_t orow = o0 + row % kTO;
      int64_t k0;
      const int n = piece_cols(q, row / kTO, k0);
      if (orow < out && ch * kElems < n)
        cp_async16(wbuf + (buf * kT + row) * kPitch + ch * 16, wg + orow * in + k0 + ch * kElems);
    }
  };
  auto issue_x = [&](int64_t q, int buf) {
    constexpr int kXChunks = kCols / 4;
    for (int c = t; c < S * R * kXChunks; c += kT) {
      const int sl = c / (R * kXChunks), r = (c / kXChunks) % R, ch = c % kXChunks;
      int64_t k0;
      const int n = piece_cols(q, sl, k0);
      if (r < nr && ch * 4 < n)
        cp_async16(xbuf + (buf * S + sl) * kXPitch + r * kCols + ch * 4,
                   a.x + (r0 + r) * a.x_stride + g * in + k0 + ch * 4);
    }
  };

  float acc[R], total[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = total[r] = 0.0f;
  // s = 0 threads add the S block results of round i in K order (S > 1)
  auto fold_round = [&](int64_t i) {
    if (S > 1 && s == 0) {
      const float* f = fold + (i & 1) * R * S * kTO;
      for (int sl = 0; sl < S; ++sl)
        if (i * S + sl < nb)
#pragma unroll
          for (int r = 0; r < R; ++r) total[r] = __fadd_rn(total[r], f[(r * S + sl) * kTO + ol]);
    }
  };

  // The first stages' weights (no kernel writes them) are requested before the wait for the previous
  // kernel, as one group; their activation pieces after it, one group a stage. Every later stage is
  // one group, so stage q's copies are in group q + 1 and the wait below completes them.
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q)
    if (q < n_stages) issue_w(q, q);
  cp_async_commit();
  dev::pdl_enter();
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) {
    if (q < n_stages) issue_x(q, q);
    cp_async_commit();
  }
  for (int64_t q = 0; q < n_stages; ++q) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (S > 1 && q % kSub == 0 && q > 0) fold_round(q / kSub - 1);
    {
      const int64_t qn = q + kStages - 1;
      if (qn < n_stages) {
        issue_w(qn, static_cast<int>(qn % kStages));
        issue_x(qn, static_cast<int>(qn % kStages));
      }
      cp_async_commit();
    }
    const int buf = static_cast<int>(q % kStages);
    int64_t k0;
    const int n = piece_cols(q, s, k0);
    const W* wp = reinterpret_cast<const W*>(wbuf + (buf * kT + t) * kPitch);
    const float* xp = xbuf + (buf * S + s) * kXPitch;
#pragma unroll
    for (int k = 0; k < kCols; k += 8) {
      if (k < n) {
        float wv[8];
        smem8(wp + k, wv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float4 x0 = *reinterpret_cast<const float4*>(xp + r * kCols + k);
          const float4 x1 = *reinterpret_cast<const float4*>(xp + r * kCols + k + 4);
          const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(xv[e], wv[e], acc[r]);
        }
      }
    }
    if (q % kSub == kSub - 1) {  // the round's blocks are complete
      const int64_t i = q / kSub;
      if constexpr (S == 1) {
        if (i < nb)
#pragma unroll
          for (int r = 0; r < R; ++r) total[r] = __fadd_rn(total[r], acc[r]);
      } else {
        float* f = fold + (i & 1) * R * S * kTO;
#pragma unroll
        for (int r = 0; r < R; ++r) f[(r * S + s) * kTO + ol] = acc[r];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    }
  }
  cp_async_wait<0>();
  if constexpr (S > 1) {
    __syncthreads();
    fold_round(rounds - 1);
  }
  if (s == 0 && o < out)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < nr) a.y[(r0 + r) * a.y_stride + g * out + o] = a.round_bf16 ? dev::bf16_round(total[r]) : total[r];
}

// Shared-memory opt-in of one variant, once per device (tensor-parallel processes drive several).
template <class W, int R, int S>
cudaError_t configure_tiled() {
  static std::atomic<uint64_t> configured{0};
  return allow_smem(dense_tiled_kernel<W, R, S>, TileShape<W, R, S>::kBytes, configured);
}
// Every variant at the first launch on a device, so that an eager call before a graph capture covers
// the variants a captured call may pick.
template <class W>
cudaError_t configure_all_tiled() {
  const cudaError_t es[] = {configure_tiled<W, 1, 1>(), configure_tiled<W, 1, 2>(), configure_tiled<W, 1, 4>(),
                            configure_tiled<W, 1, 8>(), configure_tiled<W, 2, 1>(), configure_tiled<W, 2, 2>(),
                            configure_tiled<W, 2, 4>(), configure_tiled<W, 2, 8>(), configure_tiled<W, 4, 1>(),
                            configure_tiled<W, 4, 2>(), configure_tiled<W, 4, 4>(), configure_tiled<W, 8, 1>(),
                            configure_tiled<W, 8, 2>()};
  for (cudaError_t e : es)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

template <class W, int R, int S>
cudaError_t launch_tiled(const DenseArgs& a, cudaStream_t st) {
  using Sh = TileShape<W, R, S>;
  const dim3 grid(static_cast<unsigned>((a.out + Sh::kTO - 1) / Sh::kTO), static_cast<unsigned>((a.m + R - 1) / R),
                  static_cast<unsigned>(a.groups));
  return launch_pdl(dense_tiled_kernel<W, R, S>, grid, dim3(kT), Sh::kBytes, st, a);
}

// K split S: the smallest power of two that gives ~2 CTAs per SM (at most 8, S*R <= 16, S <= blocks).
template <class W, int R>
cudaError_t launch_rows(const DenseArgs& a, cudaStream_t st) {
  const int64_t nb = (a.in + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  const int64_t want = 2 * static_cast<int64_t>(sm_count());
  const int64_t row_tiles = ((a.m + R - 1) / R) * a.groups;
  int S = 1;
  while (S < 8 && S * 2 * R <= 16 && S * 2 <= nb && ((a.out + kT / S - 1) / (kT / S)) * row_tiles < want) S *= 2;
  if constexpr (R <= 2) {
    if (S == 8) return launch_tiled<W, R, 8>(a, st);
  }
  if constexpr (R <= 4) {
    if (S == 4) return launch_tiled<W, R, 4>(a, st);
  }
  if (S == 2) return launch_tiled<W, R, 2>(a, st);
  return launch_tiled<W, R, 1>(a, st);
}

template <class W>
cudaError_t launch_dense(const DenseArgs& a, cudaStream_t st) {
  // tiled path: 16-byte aligned weight rows, x rows and group offsets
  const bool aligned = a.in % 8 == 0 && a.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
  // Decode sizes: the weight-streaming kernel (dense_stream.cu) where its plan fits; the head and
  // wo_a on one ring a warp (dense_ring.cu).
  if (raw::dense_stream_takes(a)) return raw::dense_stream(a, st);
  if (raw::dense_ring_takes(a)) return raw::dense_ring(a, st);
  // Prefill passes' bf16 calls of many rows (wo_a) where the caller allows it: the tensor cores
  // (kernels/ops/dense_tc_gemm.cu; exact products, the tensor core's summation).
  if (raw::dense_tc_gemm_takes(a)) return raw::dense_tc_gemm(a, st);
  // Many activation rows and enough output tiles (prefill passes: wo_a): the register-tiled GEMM
  // (kernels/ops/dense_gemm.cu), the same arithmetic.
  if (raw::dense_gemm_takes(a)) return raw::dense_gemm(a, st);
  // The warp kernel takes unaligned rows and up to 64 rows at larger m (measured on H200 against the
  // tiled kernel: 32 rows 51 vs 86 us at m = 256), and what the streaming kernel leaves at m <= 4 up
  // to 1024 rows; the tiled kernel takes everything else.
  const int64_t rows_out = a.out * a.groups;
  if (!aligned || rows_out <= 64 || (rows_out <= 1024 && a.m <= 4)) {
    const dim3 grid(static_cast<unsigned>((a.out + kWarps - 1) / kWarps), static_cast<unsigned>((a.m + kRows - 1) / kRows),
                    static_cast<unsigned>(a.groups));
    if (aligned) return launch_pdl(dense_warp_kernel<W, true>, grid, dim3(kWarps * 32), 0, st, a);
    return launch_pdl(dense_warp_kernel<W, false>, grid, dim3(kWarps * 32), 0, st, a);
  }
  const cudaError_t conf = configure_all_tiled<W>();
  if (conf != cudaSuccess) return conf;
  if (a.m == 1) return launch_rows<W, 1>(a, st);
  if (a.m == 2) return launch_rows<W, 2>(a, st);
  if (a.m <= 4) return launch_rows<W, 4>(a, st);
  return launch_rows<W, 8>(a, st);
}

}  // namespace

namespace raw {
cudaError_t lin_dense(const DenseArgs& a, cudaStream_t s) {
  if (a.m == 0) return cudaSuccess;
  if (a.wt == DenseType::BF16) return launch_dense<uint16_t>(a, s);
  if (a.wt == DenseType::F16) return launch_dense<__half>(a, s);
  return launch_dense<float>(a, s);
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
