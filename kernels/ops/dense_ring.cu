// Dense LinBF16 / LinF16 at decode sizes with one cp.async ring a warp (header: dense_ring.h).
//
// Why a ring a warp. The tiled kernel (lin_dense.cu) stages 128-byte pieces of its CTA's 128 rows
// with CTA-wide barriers: every stage waits for the slowest of its 1,024 copies. For the head (1.32 GB
// of bf16) that read pattern alone, loads and nothing else, reaches 3.57 TB/s on the H200
// (tests/bench/bench_gpu_read_ceiling, "rows"); the same pieces staged by each warp for its own 32
// rows, waited for by that warp alone, reach 3.81 TB/s ("wring": deeper rings, wider pieces or
// fewer warps a CTA did not do better). This kernel is that pattern with the arithmetic added.
//
// Layout: a CTA of 4 warps; warp w owns 32 consecutive output rows, lane l row l, and runs its R
// chains (one an activation row) exactly as the CPU does: fma chains over 256-wide K blocks from
// zero, each block's result added to the row's total from zero in K order. Each ring stage holds
// 128 bytes of each of the warp's 32 rows (chunk c of row r at 16-byte slot c ^ (r & 7), so the
// lanes' 16-byte reads of their own rows hit distinct banks) and the R activation pieces of those
// columns (read as broadcasts). Three stages: two in flight while one is consumed. The weights of
// the first two stages are requested before the PDL wait (no kernel writes weights).
#include <cuda_fp16.h>

#include <atomic>

#include "ops/cp_async.cuh"
#include "ops/dense_ring.h"
#include "ops/env_setting.h"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarpsPerCta = 4, kThreads = kWarpsPerCta * 32;
constexpr int kRowsPerWarp = 32;    // one output row a lane
constexpr int kPieceBytes = 128;    // bytes of each weight row a stage
constexpr int kStages = 3;
constexpr int kChunksPerRow = kPieceBytes / 16;

template <class W, int R>
struct RingShape {
  static constexpr int kCols = kPieceBytes / static_cast<int>(sizeof(W));  // K columns a stage (64)
  static constexpr int kSub = dev::kGemmKBlock / kCols;                    // stages a 256-block (4)
  static constexpr int kWBytes = kRowsPerWarp * kPieceBytes;               // weights of a stage
  static constexpr int kStageBytes = kWBytes + R * kCols * 4;              // + the activation pieces
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kBytes = kWarpsPerCta * kWarpBytes;
};

using dev::cp_async16;

template <class W, int R>
__global__ void __launch_bounds__(kThreads) dense_ring_kernel(DenseArgs a) {
  using Sh = RingShape<W, R>;
  constexpr int kCols = Sh::kCols, kElems = 16 / static_cast<int>(sizeof(W));
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t in = a.in, out = a.out, g = blockIdx.z;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + warp) * kRowsPerWarp;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * R;
  const int nr = static_cast<int>(a.m - r0 < R ? a.m - r0 : R);
  const int64_t n_stages = (in + kCols - 1) / kCols;
  const int rows_here = static_cast<int>(out - o0 < kRowsPerWarp ? out - o0 : kRowsPerWarp);
  unsigned char* ring = smem + warp * Sh::kWarpBytes;
  const W* wrows = static_cast<const W*>(a.w) + (g * out + o0) * in;
  const float* xg = a.x + r0 * a.x_stride + g * in;
  // valid columns of stage q (a multiple of 8: in % 8 == 0)
  auto stage_cols = [&](int64_t q) { return static_cast<int>(in - q * kCols < kCols ? in - q * kCols : kCols); };
  auto issue_w = [&](int64_t q) {
    unsigned char* wb = ring + static_cast<int>(q % kStages) * Sh::kStageBytes;
    const int n = stage_cols(q);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp * kChunksPerRow / 32; ++i) {
      const int c = lane + 32 * i, row = c / kChunksPerRow, ch = c % kChunksPerRow;
      if (row < rows_here && ch * kElems < n)
        cp_async16(wb + row * kPieceBytes + ((ch ^ (row & 7)) * 16), wrows + row * in + q * kCols + ch * kElems);
    }
  };
  auto issue_x = [&](int64_t q) {
    float* xb = reinterpret_cast<float*>(ring + static_cast<int>(q % kStages) * Sh::kStageBytes + Sh::kWBytes);
    const int n = stage_cols(q);
    for (int c = lane; c < R * (kCols / 4); c += 32) {
      const int r = c / (kCols / 4), ch = c % (kCols / 4);
      if (r < nr && ch * 4 < n) cp_async16(xb + r * kCols + ch * 4, xg + r * a.x_stride + q * kCols + ch * 4);
    }
  };

  const bool active = o0 < out;  // warp-uniform
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q)
    if (active && q < n_stages) issue_w(q);
  dev::cp_async_commit();
  dev::pdl_enter();
  if (!active) return;
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) {
    if (q < n_stages) issue_x(q);
    dev::cp_async_commit();
  }

  float acc[R], total[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = total[r] = 0.0f;
  for (int64_t q = 0; q < n_stages; ++q) {
    // Groups so far: the first stages' weights, their activations one group each, then one group a
    // stage; waiting for all but the newest kStages - 2 completes stage q's.
    dev::cp_async_wait<kStages - 2>();
    __syncwarp();  // every lane's copies of stage q visible, every lane done with stage q - 1's slot
    {
      const int64_t qn = q + kStages - 1;
      if (qn < n_stages) {
        issue_w(qn);
        issue_x(qn);
      }
      dev::cp_async_commit();
    }
    const unsigned char* wb = ring + static_cast<int>(q % kStages) * Sh::kStageBytes;
    const float* xb = reinterpret_cast<const float*>(wb + Sh::kWBytes);
    const unsigned char* wrow = wb + lane * kPieceBytes;
    const int n = stage_cols(q);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      if (j * 8 < n) {
        float wv[8];
        dev::widen8(*reinterpret_cast<const uint4*>(wrow + ((j ^ (lane & 7)) * 16)), wv, static_cast<const W*>(nullptr));
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float4 x0 = *reinterpret_cast<const float4*>(xb + r * kCols + 8 * j);
          const float4 x1 = *reinterpret_cast<const float4*>(xb + r * kCols + 8 * j + 4);
          const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(xv[e], wv[e], acc[r]);
        }
      }
    }
    if ((q + 1) % Sh::kSub == 0 || q + 1 == n_stages) {  // a 256-block is complete
#pragma unroll
      for (int r = 0; r < R; ++r) {
        total[r] = __fadd_rn(total[r], acc[r]);
        acc[r] = 0.0f;
      }
    }
  }
  dev::cp_async_wait<0>();
  if (lane < rows_here)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < nr) a.y[(r0 + r) * a.y_stride + g * out + o0 + lane] = a.round_bf16 ? dev::bf16_round(total[r]) : total[r];
}

EnvSetting g_mode{"DSV41_DENSE_RING", 0, 0, 2};

template <class W, int R>
size_t ring_bytes() {
  return RingShape<W, R>::kBytes;
}
template <class W, int R>
bool ring_fits() {
  return smem_fits(dense_ring_kernel<W, R>, ring_bytes<W, R>());
}
template <class W>
bool fits_for(int64_t m) {
  if (m == 1) return ring_fits<W, 1>();
  if (m == 2) return ring_fits<W, 2>();
  return ring_fits<W, 4>();
}

template <class W, int R>
cudaError_t launch(const DenseArgs& a, cudaStream_t s) {
  static std::atomic<uint64_t> configured{0};
  const cudaError_t e = allow_smem(dense_ring_kernel<W, R>, ring_bytes<W, R>(), configured);
  if (e != cudaSuccess) return e;
  const int64_t rows_per_cta = int64_t{kWarpsPerCta} * kRowsPerWarp;
  const dim3 grid(static_cast<unsigned>((a.out + rows_per_cta - 1) / rows_per_cta), static_cast<unsigned>((a.m + R - 1) / R),
                  static_cast<unsigned>(a.groups));
  return launch_pdl(dense_ring_kernel<W, R>, grid, dim3(kThreads), ring_bytes<W, R>(), s, a);
}
template <class W>
cudaError_t launch_rows(const DenseArgs& a, cudaStream_t s) {
  if (a.m == 1) return launch<W, 1>(a, s);
  if (a.m == 2) return launch<W, 2>(a, s);
  return launch<W, 4>(a, s);
}

// The shapes the kernel takes, whatever the mode and size.
bool shape_ok(const DenseArgs& a) {
  if (a.wt != DenseType::BF16 && a.wt != DenseType::F16) return false;
  if (a.m < 1 || a.m > raw::kDenseRingMaxRows || a.in <= 0 || a.out <= 0 || a.groups < 1) return false;
  if (a.in % 8 != 0 || a.x_stride % 4 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.w) % 16 != 0)
    return false;
  return a.wt == DenseType::BF16 ? fits_for<uint16_t>(a.m) : fits_for<__half>(a.m);
}

}  // namespace

namespace raw {
bool dense_ring_takes(const DenseArgs& a) {
  const int64_t mode = g_mode.get();
  if (mode == 1 || !shape_ok(a)) return false;
  if (mode == 2) return true;
  // The tiled kernel's no-split regime (lin_dense.cu launch_rows: its 128-row CTAs fill two an SM
  // without splitting K), where the ring replaces it; fewer rows keep the split.
  const int64_t ctas = (a.out + kWarpsPerCta * kRowsPerWarp - 1) / (kWarpsPerCta * kRowsPerWarp) * a.groups;
  return ctas >= 2 * static_cast<int64_t>(sm_count());
}

cudaError_t dense_ring(const DenseArgs& a, cudaStream_t s) {
  if (a.m == 0) return cudaSuccess;
  if (!shape_ok(a)) return cudaErrorInvalidValue;
  return a.wt == DenseType::BF16 ? launch_rows<uint16_t>(a, s) : launch_rows<__half>(a, s);
}

int set_dense_ring_mode(int mode) { return static_cast<int>(g_mode.set(mode)); }
}  // namespace raw

}  // namespace dsv41::ops::gpu
