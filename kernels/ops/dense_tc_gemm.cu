// Dense LinBF16 calls of many activation rows on the tensor cores (kernels/ops/dense_gemm.h,
// DenseArgs::tensor_core): the prefill passes' grouped wo_a.
//
// Arithmetic. The weights are bf16 and enter mma.sync (m16n8k16, bf16 inputs, fp32 accumulators)
// as they are. Each fp32 activation x is split into three bf16 parts, hi = bf16(x), mid =
// bf16(x - hi), lo = bf16(x - hi - mid), whose sum is x exactly (fp32's 24 significant bits in three
// of bf16's 8, both with fp32's exponent range; only fp32 subnormals can lose bits), so every
// product w·x is the sum of three exact products and the tensor core adds them (lo, mid, hi, each
// step of 16 K) into the fp32 accumulators over the whole K. That is the licensed exception of
// docs/ARCHITECTURE.md, Numerics: the products exact, only the order and rounding of their sum
// differ from the CPU's 256-wide fma chains (the tensor core truncates as it accumulates, a bias
// that grows with K: NMSE ~8e-12 against the CPU at K = 1,024 on the H200, each output within
// 2^-16 of sum |w·x| of the exact sum; far below the bf16 rounding of the outputs). Decode steps and exact_block_sums keep the CUDA-core
// kernels.
//
// Layout. A CTA computes 128 weight rows (outputs: the MMA's M side) x 128 activation rows (N) and
// walks K 32 at a time through a 3-stage cp.async pipeline: weights [128][32] bf16 and activations
// [128][32] fp32, unpadded, their 16-byte chunks swizzled by row (w_chunk, x_chunk) so that the
// fragment loads of a warp's phase hit 32 distinct banks. 8 warps: 2 along M (64 rows, 4 m16 tiles) x 4 along N
// (32 rows, 4 n8 tiles), 64 accumulators a thread. K inside a 16-step is permuted (thread tig owns
// K 4tig..4tig+3 of both operands: one 8-byte weight load per row and one 16-byte activation load
// per column), which only the tensor core's own summation order can see.
//
// Grouped calls: grid.z is the group, which reads its own K slice of the activation rows and its own
// weight rows and writes its own output columns.
#include <cuda_bf16.h>

#include <atomic>

#include "ops/cp_async.cuh"
#include "ops/dense_gemm.h"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3, kThreads = 256;
constexpr int kWStride = kBK * 2;  // bytes per staged weight row: 4 chunks of 16
constexpr int kXStride = kBK * 4;  // bytes per staged activation row: 8 chunks of 16
// Where chunk `c` of a staged row lives. Weights: a half-warp's 8-byte loads cover rows g = 0..3,
// 32 bytes each, and rows 64 bytes apart share banks every other row, so rows 2, 3 (mod 4) swap
// 32-byte halves. Activations: a quarter-warp's 16-byte loads cover rows g, g + 1, 64 bytes each,
// at the same offset of 128-byte rows, so odd rows swap 64-byte halves.
__device__ __forceinline__ int w_chunk(int row, int c) { return c ^ (((row >> 1) & 1) << 1); }
__device__ __forceinline__ int x_chunk(int row, int c) { return c ^ ((row & 1) << 2); }
constexpr int kWBytes = kBM * kWStride, kXBytes = kBN * kXStride, kStageBytes = kWBytes + kXBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
static_assert(kWBytes % 16 == 0 && kStageBytes % 16 == 0);

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint2 a_g, uint2 a_g8, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a_g.x), "r"(a_g8.x), "r"(a_g.y), "r"(a_g8.y), "r"(b0), "r"(b1));
}

// (x0, x1) -> bf16x2 (x0 low), rounded to nearest even.
__device__ __forceinline__ uint32_t bf16x2(float x0, float x1) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

// Four activations (K 4tig..4tig+3 of one column) -> the B registers of their three parts:
// [part][register], part 0 = lo, 1 = mid, 2 = hi.
__device__ __forceinline__ void split3(const float4 x, uint32_t (&b)[3][2]) {
  const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float x0 = v[2 * r], x1 = v[2 * r + 1];
    const uint32_t hi = bf16x2(x0, x1);
    const float r0 = __fsub_rn(x0, bf16_lo(hi)), r1 = __fsub_rn(x1, bf16_hi(hi));  // exact
    const uint32_t mid = bf16x2(r0, r1);
    b[2][r] = hi;
    b[1][r] = mid;
    b[0][r] = bf16x2(__fsub_rn(r0, bf16_lo(mid)), __fsub_rn(r1, bf16_hi(mid)));  // exact, then exact in bf16
  }
}

__global__ void __launch_bounds__(kThreads, 2) dense_tc_kernel(const DenseArgs a) {
  dev::pdl_enter();
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int wm = warp & 1, wn = warp >> 1;  // 64 weight rows x 32 activation rows a warp
  const int64_t in = a.in, out = a.out, grp = blockIdx.z;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kBM, r0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const uint16_t* wg = static_cast<const uint16_t*>(a.w) + grp * out * in;
  const float* xg = a.x + grp * in;
  const int steps = static_cast<int>(in / kBK);

  // Copies of a stage: weight rows (64 bytes = 4 parts) 2 parts a thread, activation rows (128 bytes
  // = 8 parts) 4 parts a thread; rows past the ends are zeros (their outputs are never stored).
  auto load_stage = [&](int s, int buf) {
    uint8_t* sw = smem + buf * kStageBytes;
    uint8_t* sx = sw + kWBytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kThreads, row = c >> 2, part = c & 3;
      const int64_t o = o0 + row;
      dev::cp_async16_if<dev::CpOrder::Free>(sw + row * kWStride + w_chunk(row, part) * 16,
                                             wg + (o < out ? o : 0) * in + static_cast<int64_t>(s) * kBK + part * 8, o < out);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = tid + i * kThreads, row = c >> 3, part = c & 7;
      const int64_t r = r0 + row;
      dev::cp_async16_if<dev::CpOrder::Free>(
          sx + row * kXStride + x_chunk(row, part) * 16,
          xg + (r < a.m ? r : 0) * a.x_stride + static_cast<int64_t>(s) * kBK + part * 4,
          r < a.m);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s, s);
    dev::cp_async_commit<dev::CpOrder::Free>();
  }
  for (int s = 0; s < steps; ++s) {
    dev::cp_async_wait<kStages - 2, dev::CpOrder::Free>();
    __syncthreads();  // stage s visible to all; the buffer refilled below is no longer read
    if (s + kStages - 1 < steps) load_stage(s + kStages - 1, (s + kStages - 1) % kStages);
    dev::cp_async_commit<dev::CpOrder::Free>();
    const uint8_t* sw = smem + (s % kStages) * kStageBytes;
    const uint8_t* sx = sw + kWBytes;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t b[4][3][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        // K kk·16 + 4tig .. +3: chunk kk·4 + tig of the column's row.
        const int col = wn * 32 + nt * 8 + g;
        split3(*reinterpret_cast<const float4*>(sx + col * kXStride + x_chunk(col, kk * 4 + tig) * 16), b[nt]);
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        // K kk·16 + 4tig .. +3: half tig & 1 of chunk kk·2 + tig / 2 of the row.
        const int row = wm * 64 + mt * 16 + g, c = kk * 2 + (tig >> 1), half = (tig & 1) * 8;
        const uint2 a_g = *reinterpret_cast<const uint2*>(sw + row * kWStride + w_chunk(row, c) * 16 + half);
        const uint2 a_g8 = *reinterpret_cast<const uint2*>(sw + (row + 8) * kWStride + w_chunk(row + 8, c) * 16 + half);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int part = 0; part < 3; ++part) mma_bf16(acc[mt][nt], a_g, a_g8, b[nt][part][0], b[nt][part][1]);
      }
    }
  }
  dev::cp_async_wait<0, dev::CpOrder::Free>();

  // acc[mt][nt]: weight rows row / row + 8 (c = 0, 1 / 2, 3), activation rows col, col + 1.
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t o = o0 + wm * 64 + mt * 16 + g + (q >= 2 ? 8 : 0);
        const int64_t r = r0 + wn * 32 + nt * 8 + 2 * tig + (q & 1);
        if (o < out && r < a.m) {
          const float v = acc[mt][nt][q];
          a.y[r * a.y_stride + grp * out + o] = a.round_bf16 ? dev::bf16_round(v) : v;
        }
      }
}

}  // namespace

namespace raw {

bool dense_tc_gemm_takes(const DenseArgs& a) {
  if (!a.tensor_core || a.wt != DenseType::BF16 || a.m < kDenseTcMinRows || a.in % kBK != 0 || a.x_stride % 4 != 0)
    return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
  if ((a.m + kBN - 1) / kBN > 65535 || a.groups > 65535) return false;
  return smem_fits(dense_tc_kernel, kSmemBytes);
}

cudaError_t dense_tc_gemm(const DenseArgs& a, cudaStream_t s) {
  if (a.m <= 0 || a.out <= 0) return cudaSuccess;
  if (a.wt != DenseType::BF16 || a.in % kBK != 0 || (a.m + kBN - 1) / kBN > 65535) return cudaErrorInvalidValue;
  static std::atomic<uint64_t> configured{0};
  const cudaError_t e = allow_smem(dense_tc_kernel, kSmemBytes, configured);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((a.out + kBM - 1) / kBM), static_cast<unsigned>((a.m + kBN - 1) / kBN),
                  static_cast<unsigned>(a.groups));
  return launch_pdl(dense_tc_kernel, grid, dim3(kThreads), kSmemBytes, s, a);
}

}  // namespace raw
}  // namespace dsv41::ops::gpu
