// The FP4 expert banks at decode sizes on the tensor cores (numerics and contract: ops/lin4_tc_gemv.h).
//
// Why (bench/RESULTS.md, "The FP4 expert banks at decode sizes on the tensor cores"): the sequential
// kernel (lin_fp8.cu) is bound by instruction issue, ~0.165 warp instructions a weight, most of them
// widening e2m1 and e4m3 codes to fp32 for a 32-long fma chain per block and output; it reads a bank
// at ~40 % of the copy ceiling. Here a block's 32 products are two MMAs and the codes are widened only
// to f16 (~0.06 instructions a weight), and the weights reach shared memory through a per-warp ring
// of cp.async stages, so a warp computes one segment while the next ones load.
//
// Layout. A CTA serves one (token, slot) pair (blockIdx.y) and T 16-row tiles of the group's banks
// (their outputs dealt as if concatenated), W = 8 / T warps a tile; the warps of a tile take its
// 128-wide K segments (4 blocks) in turn. Lane (g, t) = (lane / 4, lane % 4) copies block 4s + t of
// rows g and g + 8 (16 bytes each), and for block u of the segment reads word t of the copy of lane
// (g, u): 8 codes of row g and of row g + 8, K 8t .. 8t + 7 of the block. Those become four f16x2
// (K pairs {0,2}, {4,6}, {1,3}, {5,7}) through e4m3 bytes and one cvt each (e2m1 · 2^-6, exact, as
// the sequential kernel decodes them), the A fragments of the block's two MMAs; the B fragments are
// the pair's activation codes at the same K, widened once per CTA into shared memory (every column
// of the MMA gets the same token, so any column holds the block sum). The sum times 2^6 is the
// block's part; lane (g, t) scales the parts of block 4s + t as the CPU does, term = (part ·
// x_scale) · w_scale, and after the loop one thread a row adds the terms in K order from zero.
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cp_async.cuh"
#include "ops/e4m3_decode.cuh"
#include "ops/env_setting.h"
#include "ops/lin4_tc_gemv.h"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/smem_limit.h"
#include "ops/tc_block.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kSegK = 128;  // K of one segment: 4 blocks, 64 bytes of a row
constexpr int kMaxParts = kLinGroupMax;
// Segments a warp's ring holds (4 or 8; DSV41_LIN4_TC_GEMV_STAGES, measured in bench/RESULTS.md).
constexpr int ring_pieces(int stages) { return stages * 2 * 32; }  // 16-byte pieces of a warp's ring
constexpr float kE2m1Unscale = 64.0f;          // the codes enter the MMAs as e2m1 · 2^-6
// Activation entries (8 codes each, nb · 4 a pair) a thread widens in the setup, all loaded at once:
// K up to kMaxIn.
constexpr int kXbPerThread = 4;
constexpr int64_t kMaxIn = int64_t{kThreads} * kXbPerThread * 8;

struct GemvArgs {
  int n_parts = 1;
  const uint8_t* w[kMaxParts] = {};   // packed [E][out][in/2]
  const uint8_t* ws[kMaxParts] = {};  // E8M0 [E][out][in/32]
  int64_t out[kMaxParts] = {};
  float* y[kMaxParts] = {};
  int64_t y_stride[kMaxParts] = {};
  int64_t tile0[kMaxParts] = {};  // first 16-row tile of each part
  int64_t in = 0, n_experts = 1, x_row_div = 1;
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  const int32_t* expert_ids = nullptr;
  bool round_bf16 = true;
  int64_t tiles = 0;      // 16-row tiles, all parts
  int tiles_per_cta = 1;  // T (1, 2, 4 or 8)
};

struct TileView {
  const uint8_t* w;   // the pair's expert in this part
  const uint8_t* ws;
  int64_t out, row0;
  float* y;
  int64_t y_stride;
};
// Static indices keep the argument arrays in the parameter space.
__device__ __forceinline__ TileView tile_of(const GemvArgs& a, int64_t tile, int64_t e) {
  const int64_t in = a.in, nb = in / 32;
  TileView v{a.w[0] + e * a.out[0] * (in / 2), a.ws[0] + e * a.out[0] * nb, a.out[0], tile * 16, a.y[0], a.y_stride[0]};
#pragma unroll
  for (int p = 1; p < kMaxParts; ++p)
    if (p < a.n_parts && tile >= a.tile0[p])
      v = {a.w[p] + e * a.out[p] * (in / 2), a.ws[p] + e * a.out[p] * nb, a.out[p], (tile - a.tile0[p]) * 16, a.y[p],
           a.y_stride[p]};
  return v;
}

// Eight e2m1 codes (a word, code i in bits 4i .. 4i + 3, K order) as four f16x2 of code · 2^-6:
// K {0, 2}, {4, 6}, {1, 3}, {5, 7}. Each code becomes the e4m3 byte with its sign in bit 7 and its
// three magnitude bits in bits 4..2 (the e2m1 value times 2^-6, normal and subnormal codes alike).
__device__ __forceinline__ void e2m1x8_f16x2(uint32_t w, uint32_t (&p)[4]) {
  const uint32_t even = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu);  // codes 0, 2, 4, 6
  const uint32_t odd = (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu);          // codes 1, 3, 5, 7
  p[0] = e4m3x2_to_f16x2(even);
  p[1] = e4m3x2_to_f16x2(even >> 16);
  p[2] = e4m3x2_to_f16x2(odd);
  p[3] = e4m3x2_to_f16x2(odd >> 16);
}

// Shared memory of a CTA: the pair's B fragments [nb][4 lanes] (16 bytes: K {0,2}, {4,6}, {1,3},
// {5,7} of the lane's 8), its activation scales [nb], the block terms [T][16][nb + 4] (padded: the
// lanes of a warp store to distinct banks), the tiles' weight-scale bytes [T][16][nb], then each
// warp's ring ([stage][row g / g + 8][u][g] 16-byte pieces: the reads of one block's word t by the
// 32 lanes fall in 32 distinct banks).
__host__ __device__ inline int64_t terms_stride(int64_t nb) { return nb + 4; }
__host__ __device__ inline int64_t xb_bytes(int64_t nb) { return nb * 64; }
__host__ __device__ inline int64_t xs_bytes(int64_t nb) { return nb * 4; }
__host__ __device__ inline int64_t terms_bytes(int T, int64_t nb) { return int64_t{T} * 16 * terms_stride(nb) * 4; }
__host__ __device__ inline int64_t wsc_bytes(int T, int64_t nb) { return (int64_t{T} * 16 * nb + 15) / 16 * 16; }
__host__ __device__ inline int64_t smem_bytes(int T, int64_t nb, int stages) {
  return xb_bytes(nb) + xs_bytes(nb) + terms_bytes(T, nb) + wsc_bytes(T, nb) + int64_t{kWarps} * ring_pieces(stages) * 16;
}

template <int kStages>
__global__ void __launch_bounds__(kThreads, 2) lin4_tc_gemv_kernel(const GemvArgs a) {
  constexpr int kRingPieces = ring_pieces(kStages);
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = a.tiles_per_cta, W = kWarps / T;
  const int tl = warp / W, wsub = warp % W;
  const int g = lane >> 2, t = lane & 3;
  const int64_t in = a.in, nb = in / 32, nseg = in / kSegK, ts = terms_stride(nb);
  const int64_t pair = blockIdx.y, tile0 = static_cast<int64_t>(blockIdx.x) * T;
  uint4* xb = reinterpret_cast<uint4*>(smem);
  float* xs = reinterpret_cast<float*>(smem + xb_bytes(nb));
  float* terms = xs + nb;
  uint8_t* wsc = reinterpret_cast<uint8_t*>(terms + int64_t{T} * 16 * ts);
  uint4* ring = reinterpret_cast<uint4*>(wsc + wsc_bytes(T, nb)) + static_cast<int64_t>(warp) * kRingPieces;

  dev::pdl_wait();  // expert ids and activation codes come from earlier kernels
  const int64_t e = a.expert_ids ? a.expert_ids[pair] : 0;
  if (e < 0 || e >= a.n_experts) {  // an empty slot (or another rank's expert): zero rows
    for (int i = tid; i < T * 16; i += kThreads) {
      const int64_t tt = tile0 + i / 16;
      if (tt >= a.tiles) continue;
      const TileView u = tile_of(a, tt, 0);
      if (u.row0 + i % 16 < u.out) u.y[pair * u.y_stride + u.row0 + i % 16] = 0.0f;
    }
    dev::pdl_launch_dependents();
    return;
  }
  // Every load of the setup in flight together: the pair's activation codes and scales into
  // registers, then (their address needs only the expert) the tiles' weight-scale bytes (4-byte
  // copies, the oldest copy group; rows past a part's end repeat its last row) and each warp's first
  // ring stages; the codes are widened while those land.
  const int64_t xrow = pair / a.x_row_div;
  const uint8_t* xc = a.x_codes + xrow * in;
  uint2 x8[kXbPerThread];  // K 8t .. 8t + 7 of block i / 4, i = tid + q * kThreads
#pragma unroll
  for (int q = 0; q < kXbPerThread; ++q) {
    const int64_t i = tid + int64_t{q} * kThreads;
    x8[q] = i < nb * 4 ? *reinterpret_cast<const uint2*>(xc + i * 8) : make_uint2(0, 0);
  }
  const float xs_mine = tid < nb ? a.x_scales[xrow * nb + tid] : 0.0f;
  for (int i = tid; i < T * 16 * static_cast<int>(nb / 4); i += kThreads) {
    const int rr = i / static_cast<int>(nb / 4), w4 = i % static_cast<int>(nb / 4);
    const int64_t tt = tile0 + rr / 16;
    if (tt >= a.tiles) continue;
    const TileView u = tile_of(a, tt, e);
    dev::cp_async4_if(wsc + int64_t{rr} * nb + 4 * w4, u.ws + min(u.row0 + rr % 16, u.out - 1) * nb + 4 * w4, true);
  }
  dev::cp_async_commit();
  const int64_t tile = tile0 + tl;
  const bool live = tile < a.tiles && wsub < nseg;
  TileView v{};
  if (live) v = tile_of(a, tile, e);
  const int64_t rg = live ? min(v.row0 + g, v.out - 1) : 0, rg8 = live ? min(v.row0 + g + 8, v.out - 1) : 0;
  const uint8_t* wg = v.w + rg * (in / 2) + 16 * t;
  const uint8_t* wg8 = v.w + rg8 * (in / 2) + 16 * t;
  const int n_seg = live ? static_cast<int>((nseg - 1 - wsub) / W + 1) : 0;
  auto seg_of = [&](int j) { return static_cast<int64_t>(wsub) + static_cast<int64_t>(j) * W; };
  auto piece = [&](int j, int half, int u) { return ring + ((j % kStages) * 2 + half) * 32 + u * 8 + g; };
  auto issue = [&](int j) {
    if (j < n_seg) {
      const int64_t off = seg_of(j) * (kSegK / 2);
      dev::cp_async16(piece(j, 0, t), wg + off);
      dev::cp_async16(piece(j, 1, t), wg8 + off);
    }
  };
  for (int j = 0; j < kStages - 1; ++j) {
    issue(j);
    dev::cp_async_commit();
  }
#pragma unroll
  for (int q = 0; q < kXbPerThread; ++q) {
    const int64_t i = tid + int64_t{q} * kThreads;
    const uint2 c = x8[q];
    if (i < nb * 4)
      xb[i] = make_uint4(e4m3x2_to_f16x2(__byte_perm(c.x, c.y, 0x20)), e4m3x2_to_f16x2(__byte_perm(c.x, c.y, 0x64)),
                         e4m3x2_to_f16x2(__byte_perm(c.x, c.y, 0x31)), e4m3x2_to_f16x2(__byte_perm(c.x, c.y, 0x75)));
  }
  if (tid < nb) xs[tid] = xs_mine;
  dev::cp_async_wait<kStages - 1>();  // this thread's scale bytes (the oldest group)
  __syncthreads();
  dev::pdl_launch_dependents();

  if (live) {
    float* trow_g = terms + (int64_t{tl} * 16 + g) * ts;
    float* trow_g8 = trow_g + 8 * ts;
    const uint8_t* sw_g = wsc + (int64_t{tl} * 16 + g) * nb;
    const uint8_t* sw_g8 = sw_g + 8 * nb;
    for (int j = 0; j < n_seg; ++j) {
      __syncwarp();  // every lane is done reading the stage the next copy refills
      issue(j + kStages - 1);
      dev::cp_async_commit();
      dev::cp_async_wait<kStages - 1>();
      __syncwarp();  // the other lanes' copies of this stage are visible
      const int64_t s = seg_of(j);
      float part_g = 0.0f, part_g8 = 0.0f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        uint32_t pg[4], pg8[4];
        e2m1x8_f16x2(reinterpret_cast<const uint32_t*>(piece(j, 0, u))[t], pg);
        e2m1x8_f16x2(reinterpret_cast<const uint32_t*>(piece(j, 1, u))[t], pg8);
        const uint4 b = xb[(s * 4 + u) * 4 + t];
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint32_t a0[4] = {pg[0], pg8[0], pg[1], pg8[1]};
        const uint32_t a1[4] = {pg[2], pg8[2], pg[3], pg8[3]};
        tc::mma_f16(d, a0, b.x, b.y);
        tc::mma_f16(d, a1, b.z, b.w);
        if (u == t) part_g = d[0], part_g8 = d[2];  // lane (g, t) keeps block 4s + t
      }
      const int64_t kb = s * 4 + t;
      const float xsc = xs[kb];
      trow_g[kb] = __fmul_rn(__fmul_rn(__fmul_rn(part_g, kE2m1Unscale), xsc), dev::e8m0_value(sw_g[kb]));
      trow_g8[kb] = __fmul_rn(__fmul_rn(__fmul_rn(part_g8, kE2m1Unscale), xsc), dev::e8m0_value(sw_g8[kb]));
    }
  }
  dev::cp_async_wait_all();
  __syncthreads();

  // Each output: its block terms in K order from zero.
  for (int i = tid; i < T * 16; i += kThreads) {
    const int64_t tt = tile0 + i / 16;
    if (tt >= a.tiles) continue;
    const TileView u = tile_of(a, tt, e);
    const int r = i % 16;
    if (u.row0 + r >= u.out) continue;
    const float* tr = terms + static_cast<int64_t>(i) * ts;
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t b = 0; b < nb; ++b) acc = __fadd_rn(acc, tr[b]);
    u.y[pair * u.y_stride + u.row0 + r] = a.round_bf16 ? dev::bf16_round(acc) : acc;
  }
}

EnvSetting g_tc_gemv_on("DSV41_LIN4_TC_GEMV", 1, 0, 1);
EnvSetting g_stages("DSV41_LIN4_TC_GEMV_STAGES", 4, 4, 8);  // 4 or 8 (anything else: 4)
EnvSetting g_warps("DSV41_LIN4_TC_GEMV_WARPS", 0, 0, 8);    // warps a tile; 0: chosen per call

int stages() { return g_stages.get() == 8 ? 8 : 4; }
template <int S>
bool fits(int T, int64_t nb) {
  return smem_fits(lin4_tc_gemv_kernel<S>, static_cast<size_t>(smem_bytes(T, nb, S)));
}

// The tiles a CTA takes for `rows` pairs: warps a tile for about two waves of 16 warps an SM (at most
// one a segment), fewer tiles a CTA where the layout would not fit the device's shared memory.
int tiles_per_cta(int64_t tiles, int64_t rows, int64_t nseg, int64_t nb) {
  const int64_t want = static_cast<int64_t>(sm_count()) * 32;
  int W = 1;
  while (W < kWarps && W < nseg && tiles * rows * W < want) W *= 2;
  const int forced = static_cast<int>(g_warps.get());
  if (forced == 1 || forced == 2 || forced == 4 || forced == 8) W = forced;
  int T = kWarps / W;
  while (T > 1 && !(stages() == 8 ? fits<8>(T, nb) : fits<4>(T, nb))) T /= 2;
  return T;
}

template <int S>
cudaError_t launch(const GemvArgs& a, dim3 grid, int64_t nb, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(smem_bytes(a.tiles_per_cta, nb, S));
  const cudaError_t e = allow_dynamic_smem<lin4_tc_gemv_kernel<S>>(smem);
  if (e != cudaSuccess) return e;
  return launch_pdl(lin4_tc_gemv_kernel<S>, grid, dim3(kThreads), smem, s, a);
}

}  // namespace

namespace raw {

bool lin4_tc_gemv_takes(const Lin4GroupArgs& g) {
  if (g.count <= 0 || g.count > kMaxParts || g_tc_gemv_on.get() == 0) return false;
  const Lin4Args& l = g.lin[0];
  if (!l.row_invariant || l.exact_block_sums || l.w.in % kSegK != 0 || l.w.in <= 0 || l.w.in > kMaxIn) return false;
  if (l.rows > 65535 || reinterpret_cast<uintptr_t>(l.x_codes) % 16 != 0) return false;
  for (int p = 0; p < g.count; ++p)
    if (reinterpret_cast<uintptr_t>(g.lin[p].w.packed) % 16 != 0 || reinterpret_cast<uintptr_t>(g.lin[p].w.scales) % 4 != 0)
      return false;
  return stages() == 8 ? fits<8>(1, l.w.in / 32) : fits<4>(1, l.w.in / 32);
}

int set_lin4_tc_gemv(int on) { return static_cast<int>(g_tc_gemv_on.set(on)); }

cudaError_t lin4_tc_gemv(const Lin4GroupArgs& g, cudaStream_t s) {
  const Lin4Args& l = g.lin[0];
  if (g.count <= 0 || l.rows == 0) return cudaSuccess;
  GemvArgs a;
  a.n_parts = std::min(g.count, kMaxParts);
  int64_t tiles = 0;
  for (int p = 0; p < a.n_parts; ++p) {
    const Lin4Args& lp = g.lin[p];
    a.w[p] = lp.w.packed;
    a.ws[p] = lp.w.scales;
    a.out[p] = lp.w.out;
    a.y[p] = lp.y;
    a.y_stride[p] = lp.y_stride;
    a.tile0[p] = tiles;
    tiles += (lp.w.out + 15) / 16;
  }
  a.in = l.w.in;
  a.n_experts = l.w.n_experts;
  a.x_row_div = l.x_row_div;
  a.x_codes = l.x_codes;
  a.x_scales = l.x_scales;
  a.expert_ids = l.expert_ids;
  a.round_bf16 = l.round_bf16;
  a.tiles = tiles;
  const int64_t nb = l.w.in / 32;
  a.tiles_per_cta = tiles_per_cta(tiles, l.rows, l.w.in / kSegK, nb);
  const int T = a.tiles_per_cta;
  const dim3 grid(static_cast<unsigned>((tiles + T - 1) / T), static_cast<unsigned>(l.rows));
  if (stages() == 8) return launch<8>(a, grid, nb, s);
  return launch<4>(a, grid, nb, s);
}

}  // namespace raw
}  // namespace dsv41::ops::gpu
