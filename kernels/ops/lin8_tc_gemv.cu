// Lin8 at decode sizes on the tensor cores (numerics and contract: ops/lin8_tc_gemv.h).
//
// Why this form (bench/RESULTS.md, "Decode-size linears on the tensor cores"): the sequential kernel
// spends ~0.18 warp instructions a weight (decoding, a 32-long fma chain per block, the fold through
// shared memory); here the block scales sit inside the activation operand, so there is no fold, and
// a weight costs ~0.06 instructions. With that few instructions the limit is bytes in flight, so the
// weights and activation codes reach shared memory through a per-warp ring of cp.async stages
// instead of registers, and a warp computes one segment while the next three are loading.
//
// Layout. A warp owns a 16-row tile of one part (rows g and g + 8 for lane g = lane / 4) and a set
// of K chunks; the 8 tokens of a column tile are the MMA's N (column g). K placement: in a 64-wide
// segment, lane t = lane % 4 reads K [16t, 16t + 16) of its two rows and of its column as one
// 16-byte piece each, and MMA q of the segment takes bytes 4q .. 4q + 3 of those pieces as the
// fragment slots 2t, 2t + 1, 2t + 8, 2t + 9. That maps the 16 slots onto 16 distinct K of the
// segment (a permutation of K, applied to both operands, changes no product). The lane's 16 K lie
// in one 32-wide block, so its activation values share one multiplier 2^(e_x + c + s_w - s_max).
// Each lane copies exactly the pieces it later reads, so the ring needs no barrier.
//
// A CTA holds T tiles and W = 8 / T warps a tile; the warps of a tile take its chunks in turn and
// leave each chunk's sums in shared memory, and after one barrier each output is summed over the
// chunks in K order by one thread: which warp ran a chunk never shows in the bits.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "ops/cp_async.cuh"
#include "ops/e4m3_decode.cuh"
#include "ops/env_setting.h"
#include "ops/lin8_gemm_parts.cuh"
#include "ops/lin8_tc_gemv.h"
#include "ops/lin_gemm.h"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/tc_block.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kSegK = 64;                                          // K of one segment (4 MMAs)
constexpr int kChunkSegs = static_cast<int>(raw::kLin8GemvChunk) / kSegK;  // segments a chunk
constexpr int kMaxParts = Lin8GemmParts::kMaxParts;
constexpr int kCols = 8;                   // tokens of a column tile (the MMA's N)
constexpr int kTileOut = 16 * kCols;       // outputs of a tile and column tile
constexpr int kMaxChunksTimesTiles = 32;   // T * chunks: 16 KB of chunk sums a CTA

struct GemvArgs {
  Lin8GemmParts p;        // the group's parts and input (col0: each part's first 16-row tile)
  int64_t tiles = 0;      // 16-row tiles, all parts
  int tiles_per_cta = 1;  // T (1, 2, 4 or 8); W = 8 / T warps a tile
  int chunks = 0;         // ceil(in / kLin8GemvChunk)
};

constexpr int kBadRow = -100000;  // a row exponent that marks a row without a form (NaN outputs)

// c = 7 - (largest block-scale exponent of the row), from the row's nb ActQuant8 scales, called by
// a whole warp; kBadRow when a scale is not a normal power of two (ActQuant8's always are; an
// infinite activation gives an infinite scale). Every lane returns the result.
__device__ __forceinline__ int row_exponent(const float* scales, int64_t nb, int lane) {
  int mx = -1000;
  bool bad = false;
  for (int64_t b = lane; b < nb; b += 32) {
    const uint32_t bits = __float_as_uint(scales[b]);
    const int ef = static_cast<int>(bits >> 23) & 0xFF;
    bad = bad || (bits & 0x807FFFFFu) != 0 || ef == 0 || ef == 255;
    mx = max(mx, ef - 127);
  }
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(dev::kFull, mx, o));
  return __any_sync(dev::kFull, bad) ? kBadRow : 7 - mx;
}

// The f16x2 multiplier 2^e (both halves) for e in [-24, 15]; NaN for `nan`.
__device__ __forceinline__ uint32_t pow2_f16x2(int e, bool nan) {
  const uint32_t h = nan ? 0x7E00u : (e >= -14 ? static_cast<uint32_t>(e + 15) << 10 : 1u << (e + 24));
  return h | (h << 16);
}

// Four e4m3 codes (word w, code i in byte i) times 2^e as two f16x2 (codes 0, 1 and 2, 3): exact
// while each code · 2^e is an f16 value (e >= -15); below, each value is rounded once from fp32
// (e < -24 has no f16 multiplier). NaN codes, and `nan`, give NaN.
__device__ __forceinline__ void codes_times_pow2(uint32_t w, int e, bool nan, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_to_f16x2(w);
  hi = e4m3x2_to_f16x2(w >> 16);
  if (nan || e >= -24) {
    const uint32_t mul = pow2_f16x2(e, nan);
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(lo) : "r"(mul));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(hi) : "r"(mul));
    return;
  }
  const float f = e >= -149 ? scalbnf(1.0f, e) : 0.0f;
  const __half2 l = __floats2half2_rn(__fmul_rn(f16_lo(lo), f), __fmul_rn(f16_hi(lo), f));
  const __half2 h = __floats2half2_rn(__fmul_rn(f16_lo(hi), f), __fmul_rn(f16_hi(hi), f));
  lo = *reinterpret_cast<const uint32_t*>(&l);
  hi = *reinterpret_cast<const uint32_t*>(&h);
}

struct TileView {
  const uint8_t* w;
  const uint8_t* ws;
  int64_t out, row0;
  float* y;
  int64_t y_stride;
};
__device__ __forceinline__ TileView tile_of(const Lin8GemmParts& a, int64_t tile) {
  TileView v{a.w[0], a.ws[0], a.out[0], tile * 16, a.y[0], a.y_stride[0]};
#pragma unroll
  for (int p = 1; p < kMaxParts; ++p)
    if (p < a.n_parts && tile >= a.col0[p]) v = {a.w[p], a.ws[p], a.out[p], (tile - a.col0[p]) * 16, a.y[p], a.y_stride[p]};
  return v;
}

// A fragments of MMA q from the lane's 16-byte pieces of rows g and g + 8.
__device__ __forceinline__ void row_a(uint32_t wg, uint32_t wg8, uint32_t (&a)[4]) {
  a[0] = e4m3x2_to_f16x2(wg);
  a[1] = e4m3x2_to_f16x2(wg8);
  a[2] = e4m3x2_to_f16x2(wg >> 16);
  a[3] = e4m3x2_to_f16x2(wg8 >> 16);
}

__device__ __forceinline__ uint32_t word(const uint4 v, int q) { return q == 0 ? v.x : (q == 1 ? v.y : (q == 2 ? v.z : v.w)); }

// The shared memory of a CTA: the chunk sums [T][chunks][16][8] floats, each tile's weight scale
// bytes [T][nb] and each column's activation scales [8][nb], then each warp's ring of kStages
// segments ([stage][piece: row g, row g + 8, column g][lane] 16-byte pieces: a quarter warp's
// reads of one piece are 128 contiguous bytes).
// Measured on H200 (bench_gpu_linear --decode): 4 stages against 8 (96 KB of rings a CTA, one CTA
// an SM fewer): 8 lost on every shape (wo_b m = 1 17.2 -> 30.0 us).
constexpr int kStages = 4;
constexpr int kPieces = 3;
constexpr int kRingBytes = kStages * kPieces * 32 * 16;  // a warp's
__host__ __device__ inline int64_t sums_bytes(int T, int chunks) { return int64_t{T} * chunks * kTileOut * 4; }
__host__ __device__ inline int64_t wscale_bytes(int T, int64_t nb) { return (int64_t{T} * nb + 15) / 16 * 16; }
__host__ __device__ inline int64_t xscale_bytes(int64_t nb) { return kCols * nb * 4; }
__host__ __device__ inline int64_t smem_bytes(int T, int chunks, int64_t nb) {
  return sums_bytes(T, chunks) + wscale_bytes(T, nb) + xscale_bytes(nb) + int64_t{kWarps} * kRingBytes;
}

__global__ void __launch_bounds__(kThreads, 2) lin8_tc_gemv_kernel(const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int s_row_exp[kCols];     // c of each column (kBadRow: NaN outputs)
  __shared__ int s_group_max[kWarps];  // s_max of each tile's 32-row group

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = a.tiles_per_cta, W = kWarps / T;
  const int tl = warp / W, wsub = warp % W;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * T + tl;
  const Lin8GemmParts& P = a.p;
  const int64_t in = P.in, nb = in / 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const int g = lane >> 2, t = lane & 3;
  float* sums = reinterpret_cast<float*>(smem);
  uint8_t* s_wsc = smem + sums_bytes(T, a.chunks);
  float* s_xsc = reinterpret_cast<float*>(s_wsc + wscale_bytes(T, nb));
  uint4* ring = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(s_xsc) + xscale_bytes(nb)) +
                static_cast<int64_t>(warp) * (kRingBytes / 16);
  const bool live = tile < a.tiles;
  TileView v{};
  if (live) v = tile_of(P, tile);
  const int64_t rg = live ? min(v.row0 + g, v.out - 1) : 0, rg8 = live ? min(v.row0 + g + 8, v.out - 1) : 0;
  const uint8_t* wg = v.w + rg * in + 16 * t;
  const uint8_t* wg8 = v.w + rg8 * in + 16 * t;
  const bool col = n0 + g < P.rows;
  const uint8_t* xrow = P.x_codes + (col ? n0 + g : 0) * in + 16 * t;

  // The warp's segments in order: chunk wsub, wsub + W, ..., each chunk's segments in K order.
  const int last_segs = static_cast<int>((in - static_cast<int64_t>(a.chunks - 1) * raw::kLin8GemvChunk) / kSegK);
  int my_chunks = 0;
  if (live && wsub < a.chunks) my_chunks = (a.chunks - 1 - wsub) / W + 1;
  const bool has_last = my_chunks > 0 && wsub + (my_chunks - 1) * W == a.chunks - 1;
  const int n_seg = my_chunks * kChunkSegs - (has_last ? kChunkSegs - last_segs : 0);
  auto seg_k = [&](int j) { return static_cast<int64_t>(wsub + (j / kChunkSegs) * W) * raw::kLin8GemvChunk + (j % kChunkSegs) * kSegK; };
  auto slot = [&](int j, int piece) { return ring + ((j % kStages) * kPieces + piece) * 32 + lane; };
  // Fenced copies: the compiler keeps the reads of a slot's previous segment ahead of the copy that
  // refills it.
  auto issue_weights = [&](int j) {
    if (j < n_seg) {
      const int64_t k = seg_k(j);
      dev::cp_async16(slot(j, 0), wg + k);
      dev::cp_async16(slot(j, 1), wg8 + k);
    }
  };
  auto issue_column = [&](int j) {
    if (j < n_seg) dev::cp_async16_if(slot(j, 2), xrow + seg_k(j), col);
  };

  // Weights only (nothing an earlier kernel writes), before the wait: the first stages' weight
  // pieces, each tile's scale bytes and the largest of them (255, NaN, left out).
  for (int j = 0; j < kStages - 1; ++j) issue_weights(j);
  if (live && wsub == 0) {
    const uint8_t* grow = v.ws + (v.row0 / 32) * nb;
    int mx = -1;
    for (int64_t b = lane; b < nb; b += 32) {
      const int sc = grow[b];
      s_wsc[tl * nb + b] = static_cast<uint8_t>(sc);
      mx = sc == 255 ? mx : max(mx, sc);
    }
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(dev::kFull, mx, o));
    if (lane == 0) s_group_max[tl] = mx < 0 ? 0 : mx;
  }
  dev::pdl_wait();
  for (int j = 0; j < kStages - 1; ++j) {
    issue_column(j);
    dev::cp_async_commit();
  }
  // Each column's c (row_exponent) and its scales.
  if (warp < kCols && n0 + warp < P.rows) {
    const float* xs = P.x_scales + (n0 + warp) * nb;
    for (int64_t b = lane; b < nb; b += 32) s_xsc[warp * nb + b] = xs[b];
    const int c = row_exponent(xs, nb, lane);
    if (lane == 0) s_row_exp[warp] = c;
  }
  __syncthreads();
  dev::pdl_launch_dependents();

  float* tile_sums = sums + static_cast<int64_t>(tl) * a.chunks * kTileOut;
  if (live) {
    const int c = col ? s_row_exp[g] : 0;
    const bool bad_row = c == kBadRow;
    const int smax = s_group_max[tl];
    const uint8_t* wsc = s_wsc + tl * nb + (t >> 1);
    const float* xsc = s_xsc + (col ? g : 0) * nb + (t >> 1);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < n_seg; ++j) {
      issue_weights(j + kStages - 1);
      issue_column(j + kStages - 1);
      dev::cp_async_commit();
      dev::cp_async_wait<kStages - 1>();
      const int64_t k = seg_k(j);
      const uint4 a0 = *slot(j, 0), a1 = *slot(j, 1), x = *slot(j, 2);
      const int sw = wsc[k / 32];
      const uint32_t xs = col ? __float_as_uint(xsc[k / 32]) : 0x3F800000u;
      const int e = (static_cast<int>(xs >> 23) & 0xFF) - 127 + c + sw - smax;
      const bool nan = bad_row || sw == 255;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t af[4], b0, b1;
        codes_times_pow2(word(x, q), e, nan, b0, b1);
        row_a(word(a0, q), word(a1, q), af);
        tc::mma_f16(d, af, b0, b1);
      }
      // a chunk's last segment: its sums to shared memory, d from zero again
      const int ch = wsub + (j / kChunkSegs) * W;
      if (j % kChunkSegs == kChunkSegs - 1 || j == n_seg - 1) {
        float* cs = tile_sums + static_cast<int64_t>(ch) * kTileOut;
        *reinterpret_cast<float2*>(cs + g * kCols + 2 * t) = make_float2(d[0], d[1]);
        *reinterpret_cast<float2*>(cs + (g + 8) * kCols + 2 * t) = make_float2(d[2], d[3]);
        d[0] = d[1] = d[2] = d[3] = 0.0f;
      }
    }
  }
  dev::cp_async_wait_all();
  __syncthreads();

  // Each output: its chunk sums in K order, times 2^(s_max - 127 - c).
  for (int i = tid; i < T * kTileOut; i += kThreads) {
    const int til = i / kTileOut, r = (i % kTileOut) / kCols, n = i % kCols;
    const int64_t tt = static_cast<int64_t>(blockIdx.x) * T + til;
    if (tt >= a.tiles || n0 + n >= P.rows) continue;
    const TileView u = tile_of(P, tt);
    if (u.row0 + r >= u.out) continue;
    const float* cs = sums + static_cast<int64_t>(til) * a.chunks * kTileOut + r * kCols + n;
    float acc = 0.0f;
    for (int ch = 0; ch < a.chunks; ++ch) acc = __fadd_rn(acc, cs[static_cast<int64_t>(ch) * kTileOut]);
    const int c = s_row_exp[n];
    float y = c == kBadRow ? __int_as_float(0x7FC00000) : scalbnf(acc, s_group_max[til] - 127 - c);
    if (P.round_bf16) y = dev::bf16_round(y);
    u.y[(n0 + n) * u.y_stride + u.row0 + r] = y;
  }
}

// On by default; DSV41_LIN8_TC_GEMV=0 puts decode passes back on the sequential sums (for comparisons).
EnvSetting g_tc_gemv_on("DSV41_LIN8_TC_GEMV", 1, 0, 1);

}  // namespace

namespace raw {

bool lin8_tc_gemv_takes(const Lin8GroupArgs& g) {
  if (g.count <= 0 || g_tc_gemv_on.get() == 0) return false;
  const Lin8Args& l = g.lin[0];
  if (!l.row_invariant || l.exact_block_sums || l.w.in % kSegK != 0 || l.w.in < kLin8GemvMinK) return false;
  if ((l.w.in + kLin8GemvChunk - 1) / kLin8GemvChunk > kMaxChunksTimesTiles) return false;
  if (reinterpret_cast<uintptr_t>(l.x_codes) % 16 != 0) return false;
  for (int p = 0; p < g.count; ++p)
    if (reinterpret_cast<uintptr_t>(g.lin[p].w.codes) % 16 != 0) return false;
  return g.count <= kMaxParts;
}

int set_lin8_tc_gemv(int on) { return static_cast<int>(g_tc_gemv_on.set(on)); }

cudaError_t lin8_tc_gemv(const Lin8GroupArgs& g, cudaStream_t s) {
  const Lin8Args& l = g.lin[0];
  if (g.count <= 0 || l.m == 0) return cudaSuccess;
  GemvArgs a;
  fill_lin8_parts(a.p, g, kMaxParts);
  a.tiles = lin8_number_part_tiles(a.p, 16);
  a.chunks = static_cast<int>((l.w.in + kLin8GemvChunk - 1) / kLin8GemvChunk);
  // Warps a tile: enough warps for about two waves of 16 an SM, at most one a chunk.
  const int64_t col_tiles = (l.m + kCols - 1) / kCols;
  const int64_t want = static_cast<int64_t>(sm_count()) * 32;
  int W = 1;
  while (W < kWarps && W < a.chunks && a.tiles * col_tiles * W < want) W *= 2;
  int T = kWarps / W;
  while (T > 1 && T * a.chunks > kMaxChunksTimesTiles) T /= 2;
  a.tiles_per_cta = T;
  const dim3 grid(static_cast<unsigned>((a.tiles + T - 1) / T), static_cast<unsigned>(col_tiles));
  const size_t smem = static_cast<size_t>(smem_bytes(T, a.chunks, l.w.in / 32));
  const cudaError_t e = allow_dynamic_smem<lin8_tc_gemv_kernel>(smem);
  if (e != cudaSuccess) return e;
  return launch_pdl(lin8_tc_gemv_kernel, grid, dim3(kThreads), smem, s, a);
}

}  // namespace raw
}  // namespace dsv41::ops::gpu
