// Dense LinBF16 / LinF16 at decode sizes with one cp.async ring a warp (header: dense_ring.h).
//
// Why a ring a warp. The tiled kernel (lin_dense.cu) stages 128-byte pieces of its CTA's 128 rows
// with CTA-wide barriers: every stage waits for the slowest of its 1,024 copies. For the head (1.32 GB
// of bf16) that read pattern alone, loads and nothing else, reaches 3.57 TB/s on the H200
// (tests/bench/bench_gpu_read_ceiling, "rows"); the same pieces staged by each warp for its own 32
// rows, waited for by that warp alone, reach 3.81 TB/s ("wring": deeper rings, wider pieces or
// fewer warps a CTA did not do better). This kernel is that pattern with the arithmetic added;
// measured on H200 (bench_gpu_linear --dense decode, bench/RESULTS.md), tiled -> ring, us at m = 1 /
// 2 / 4: head 381 / 405 / 518 -> 311 / 316 / 344 (4.26 TB/s at one token), wo_a 28.0 / 32.6 / 43.9
// -> 19.5 / 21.9 / 26.7.
//
// Layout: a CTA of 4 warps; warp w owns 32 consecutive output rows, lane l row l, and runs its R
// chains (one an activation row) exactly as the CPU does: fma chains over 256-wide K blocks from
// zero, each block's result added to the row's total from zero in K order. Each ring stage holds
// 128 bytes of each of the warp's 32 rows (chunk c of row r at 16-byte slot c ^ (r & 7), so the
// lanes' 16-byte reads of their own rows hit distinct banks) and the R activation pieces of those
// columns (read as broadcasts). Three stages: two in flight while one is consumed. The weights of
// the first two stages are requested before the PDL wait (no kernel writes weights).
//
// Calls of fewer rows (wo_a: 8 groups of 1,024) split K: P warps of a CTA share a tile, each running
// a contiguous range of whole 256-blocks and keeping every block's result in shared memory; after
// a barrier the tile's first warp adds the block results in K order, the same additions.
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
constexpr int kMaxFoldBytes = 16 * 1024;  // the block results of a CTA's K-split tiles

template <class W, int R>
struct RingShape {
  static constexpr int kCols = kPieceBytes / static_cast<int>(sizeof(W));  // K columns a stage (64)
  static constexpr int kSub = dev::kGemmKBlock / kCols;                    // stages a 256-block (4)
  static constexpr int kWBytes = kRowsPerWarp * kPieceBytes;               // weights of a stage
  static constexpr int kStageBytes = kWBytes + R * kCols * 4;              // + the activation pieces
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kRingBytes = kWarpsPerCta * kWarpBytes;
};

// Shared memory of a launch: the rings, and with a K split (P > 1) each tile's block results
// (R x blocks x 32 floats a tile, kWarpsPerCta / P tiles a CTA).
template <class W, int R>
size_t launch_bytes(int p, int64_t blocks) {
  const int64_t fold = p > 1 ? int64_t{kWarpsPerCta / p} * R * blocks * kRowsPerWarp * 4 : 0;
  return RingShape<W, R>::kRingBytes + static_cast<size_t>(fold);
}

using dev::cp_async16;

// P warps share a 32-row tile (P = 1, 2, 4): warp part p runs the 256-blocks [p nb / P, (p + 1) nb / P)
// of K and keeps each block's result; after a barrier the tile's first warp adds all of them in K
// order. With P = 1 a warp adds its blocks as they complete.
template <class W, int R, int P>
__global__ void __launch_bounds__(kThreads) dense_ring_kernel(DenseArgs a) {
  using Sh = RingShape<W, R>;
  constexpr int kCols = Sh::kCols, kElems = 16 / static_cast<int>(sizeof(W)), kTilesPerCta = kWarpsPerCta / P;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tile_in_cta = warp / P, part = warp % P;
  const int64_t in = a.in, out = a.out, g = blockIdx.z;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kTilesPerCta + tile_in_cta) * kRowsPerWarp;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * R;
  const int nr = static_cast<int>(a.m - r0 < R ? a.m - r0 : R);
  const int64_t n_stages = (in + kCols - 1) / kCols, nb = (in + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  // this warp's stages [q0, q1): whole 256-blocks of its part
  const int64_t q0 = (part * nb / P) * Sh::kSub;
  const int64_t q1 = ((part + 1) * nb / P) * Sh::kSub < n_stages ? ((part + 1) * nb / P) * Sh::kSub : n_stages;
  const int rows_here = static_cast<int>(out - o0 < kRowsPerWarp ? out - o0 : kRowsPerWarp);
  unsigned char* ring = smem + warp * Sh::kWarpBytes;
  float* fold = reinterpret_cast<float*>(smem + Sh::kRingBytes) + static_cast<int64_t>(tile_in_cta) * R * nb * kRowsPerWarp;
  const W* wrows = static_cast<const W*>(a.w) + (g * out + o0) * in;
  const float* xg = a.x + r0 * a.x_stride + g * in;
  // valid columns of stage q (a multiple of 8: in % 8 == 0)
  auto stage_cols = [&](int64_t q) { return static_cast<int>(in - q * kCols < kCols ? in - q * kCols : kCols); };
  auto slot = [&](int64_t q) { return ring + static_cast<int>((q - q0) % kStages) * Sh::kStageBytes; };
  auto issue_w = [&](int64_t q) {
    unsigned char* wb = slot(q);
    const int n = stage_cols(q);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp * kChunksPerRow / 32; ++i) {
      const int c = lane + 32 * i, row = c / kChunksPerRow, ch = c % kChunksPerRow;
      if (row < rows_here && ch * kElems < n)
        cp_async16(wb + row * kPieceBytes + ((ch ^ (row & 7)) * 16), wrows + row * in + q * kCols + ch * kElems);
    }
  };
  auto issue_x = [&](int64_t q) {
    float* xb = reinterpret_cast<float*>(slot(q) + Sh::kWBytes);
    const int n = stage_cols(q);
    for (int c = lane; c < R * (kCols / 4); c += 32) {
      const int r = c / (kCols / 4), ch = c % (kCols / 4);
      if (r < nr && ch * 4 < n) cp_async16(xb + r * kCols + ch * 4, xg + r * a.x_stride + q * kCols + ch * 4);
    }
  };

  const bool active = o0 < out;  // warp-uniform
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (active && q0 + i < q1) issue_w(q0 + i);
  dev::cp_async_commit();
  dev::pdl_enter();
  if (P == 1 && !active) return;  // (with a K split every warp meets the barrier below)

  float acc[R], total[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = total[r] = 0.0f;
  if (active) {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      if (q0 + i < q1) issue_x(q0 + i);
      dev::cp_async_commit();
    }
    for (int64_t q = q0; q < q1; ++q) {
      // Groups so far: the first stages' weights, their activations one group each, then one group
      // a stage; waiting for all but the newest kStages - 2 completes stage q's.
      dev::cp_async_wait<kStages - 2>();
      __syncwarp();  // every lane's copies of stage q visible, every lane done with stage q - 1's slot
      {
        const int64_t qn = q + kStages - 1;
        if (qn < q1) {
          issue_w(qn);
          issue_x(qn);
        }
        dev::cp_async_commit();
      }
      const unsigned char* wb = slot(q);
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
          if constexpr (P == 1) total[r] = __fadd_rn(total[r], acc[r]);
          else fold[(r * nb + q / Sh::kSub) * kRowsPerWarp + lane] = acc[r];
          acc[r] = 0.0f;
        }
      }
    }
    dev::cp_async_wait<0>();
  }
  if constexpr (P > 1) {
    __syncthreads();
    if (part != 0 || !active) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
      for (int64_t b = 0; b < nb; ++b) total[r] = __fadd_rn(total[r], fold[(r * nb + b) * kRowsPerWarp + lane]);
  }
  if (lane < rows_here)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < nr) a.y[(r0 + r) * a.y_stride + g * out + o0 + lane] = a.round_bf16 ? dev::bf16_round(total[r]) : total[r];
}

EnvSetting g_mode{"DSV41_DENSE_RING", 0, 0, 2};

EnvSetting g_split{"DSV41_DENSE_RING_SPLIT", 0, 0, 4};

// Row tiles of a call (32 output rows each, all groups).
int64_t row_tiles(const DenseArgs& a) { return (a.out + kRowsPerWarp - 1) / kRowsPerWarp * a.groups; }
int64_t k_blocks(const DenseArgs& a) { return (a.in + dev::kGemmKBlock - 1) / dev::kGemmKBlock; }

// The K split of a call: forced (set_dense_ring_split), else the smallest of 1, 2, 4 that gives two
// CTAs of warps an SM (the head: 1; wo_a's 256 tiles: 4); 0 when even 4 leaves fewer than one CTA
// of warps an SM (the tiled kernel's K split or the warp kernel then serve better).
int pick_split(const DenseArgs& a) {
  const int64_t forced = g_split.get();
  if (forced == 1 || forced == 2 || forced == 4) return static_cast<int>(forced);
  const int64_t sms = sm_count(), tiles = row_tiles(a);
  for (int p : {1, 2, 4})
    if (tiles * p >= 2 * kWarpsPerCta * sms) return p;
  return tiles * 4 >= kWarpsPerCta * sms ? 4 : 0;
}

template <class W, int R, int P>
bool variant_fits(int64_t blocks) {
  // launch() raises the kernel's limit once to the largest launch, so that one must fit as well
  return launch_bytes<W, R>(P, blocks) <= RingShape<W, R>::kRingBytes + kMaxFoldBytes &&
         smem_fits(dense_ring_kernel<W, R, P>, RingShape<W, R>::kRingBytes + kMaxFoldBytes);
}
template <class W, int R>
bool fits_p(int p, int64_t blocks) {
  if (p == 1) return variant_fits<W, R, 1>(blocks);
  if (p == 2) return variant_fits<W, R, 2>(blocks);
  return variant_fits<W, R, 4>(blocks);
}
template <class W>
bool fits(int64_t m, int p, int64_t blocks) {
  if (m == 1) return fits_p<W, 1>(p, blocks);
  if (m == 2) return fits_p<W, 2>(p, blocks);
  return fits_p<W, 4>(p, blocks);
}

template <class W, int R, int P>
cudaError_t launch(const DenseArgs& a, cudaStream_t s) {
  // the attribute once, at the largest launch the shape checks allow
  static std::atomic<uint64_t> configured{0};
  const cudaError_t e = allow_smem(dense_ring_kernel<W, R, P>, RingShape<W, R>::kRingBytes + kMaxFoldBytes, configured);
  if (e != cudaSuccess) return e;
  const int64_t tiles_per_group = (a.out + kRowsPerWarp - 1) / kRowsPerWarp, tiles_per_cta = kWarpsPerCta / P;
  const dim3 grid(static_cast<unsigned>((tiles_per_group + tiles_per_cta - 1) / tiles_per_cta),
                  static_cast<unsigned>((a.m + R - 1) / R), static_cast<unsigned>(a.groups));
  return launch_pdl(dense_ring_kernel<W, R, P>, grid, dim3(kThreads), launch_bytes<W, R>(P, k_blocks(a)), s, a);
}
template <class W, int R>
cudaError_t launch_p(const DenseArgs& a, int p, cudaStream_t s) {
  if (p == 1) return launch<W, R, 1>(a, s);
  if (p == 2) return launch<W, R, 2>(a, s);
  return launch<W, R, 4>(a, s);
}
template <class W>
cudaError_t launch_rows(const DenseArgs& a, int p, cudaStream_t s) {
  if (a.m == 1) return launch_p<W, 1>(a, p, s);
  if (a.m == 2) return launch_p<W, 2>(a, p, s);
  return launch_p<W, 4>(a, p, s);
}

// The shapes the kernel takes with split p, whatever the mode and size.
bool shape_ok(const DenseArgs& a, int p) {
  if (a.wt != DenseType::BF16 && a.wt != DenseType::F16) return false;
  if (a.m < 1 || a.m > raw::kDenseRingMaxRows || a.in <= 0 || a.out <= 0 || a.groups < 1) return false;
  if (a.in % 8 != 0 || a.x_stride % 4 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.w) % 16 != 0)
    return false;
  return a.wt == DenseType::BF16 ? fits<uint16_t>(a.m, p, k_blocks(a)) : fits<__half>(a.m, p, k_blocks(a));
}

}  // namespace

namespace raw {
bool dense_ring_takes(const DenseArgs& a) {
  const int64_t mode = g_mode.get();
  if (mode == 1) return false;
  const int p = pick_split(a);
  if (mode == 2) return shape_ok(a, p == 0 ? 4 : p);
  return p != 0 && shape_ok(a, p);
}

cudaError_t dense_ring(const DenseArgs& a, cudaStream_t s) {
  if (a.m == 0) return cudaSuccess;
  int p = pick_split(a);
  if (p == 0) p = 4;
  if (!shape_ok(a, p)) return cudaErrorInvalidValue;
  return a.wt == DenseType::BF16 ? launch_rows<uint16_t>(a, p, s) : launch_rows<__half>(a, p, s);
}

int set_dense_ring_mode(int mode) { return static_cast<int>(g_mode.set(mode)); }
int set_dense_ring_split(int p) { return static_cast<int>(g_split.set(p)); }
}  // namespace raw

}  // namespace dsv41::ops::gpu
