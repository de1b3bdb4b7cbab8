// Lin8 / Lin4 (MODEL.md §4): the activation arrives quantised (ActQuant8 codes + scales); each
// 32-wide K block's code dot is summed sequentially in fp32 (products of e4m3 x e4m3/e2m1 codes are
// exact, so fmaf(x, w, part) equals the reference's part + x*w), scaled by act_scale·w_scale and the
// block terms are added in increasing K order from zero — the CPU reference's order, so outputs are
// bit-identical.
//
// Layout (decode bandwidth): a warp owns NO output rows per lane slot and R activation rows. Its
// lanes split one K chunk of `kw` blocks (kw = 32, 16 or 8, chosen to divide the block count) and
// 32/kw slots of outputs; lane (slot, kbl) loads block kbl of its NO rows with 16-byte coalesced
// loads (the blocks of up to 8/NO chunks at once, so ~8 blocks are in flight per lane), decodes the
// activation block once and reuses it for all NO outputs, and keeps the R x NO block dots in
// registers. The chunk's block terms go through a per-warp shared buffer and each
// (row, output) pair is folded by one lane in K order.
//
// Code decoding (no tables, no shared-memory loads per weight): e4m3 pairs become f16x2 in one
// cvt.rn.f16x2.e4m3x2 (exact: every e4m3 value is an f16 value), then f32 (exact). e2m1 codes are
// first placed into e4m3 bytes by bit moves: sign to bit 7, the three magnitude bits to bits 4..2,
// which is the e2m1 value times 2^-6 for normal and subnormal codes alike; then the same cvt. The
// FP4 block dot therefore runs on w·2^-6: each product x·w·2^-6 is exact (at most 6 significant
// bits, far above fp32's subnormal range), every partial sum is the reference's partial sum times
// 2^-6 rounded the same way (a power-of-two scaling of normal numbers commutes with rounding), and
// the block result is multiplied back by 2^6 exactly before the scale step.
//
// Rows sharing a weight: Lin8 takes R <= 4 activation rows per weight read; Lin4 groups the
// (token, slot) pairs that picked the same expert (in row order, up to R per group), so an expert is
// read once per group instead of once per pair.
//
// Latency hiding (Lin8 at decode sizes): a warp's loads of one chunk group and its arithmetic are
// serial, so each warp also asks the TMA unit to pull the weight rows of the next `prefetch_chunks` chunks into L2
// (cp.async.bulk.prefetch, one instruction per row range); the next demand loads then hit L2. The
// launcher sizes the window so that all resident warps together keep ~20 MB ahead (L2: 50 MB),
// for calls whose weights fit in half the L2.
// Launches use programmatic dependent launch (ops/pdl.cuh): for Lin8 the first weight ranges are
// prefetched before griddepcontrol.wait. That reads nothing an earlier kernel writes (weights are
// never written by kernels, and an L2 prefetch delivers nothing to the SM: L2 is the GPU's point of
// coherence), so it overlaps the previous kernel's tail safely; activations, expert ids and outputs
// are touched only after the wait.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "ops/lin8_tc_gemv.h"
#include "ops/lin_decode.h"
#include "ops/e4m3_decode.cuh"
#include "ops/lin_gemm.h"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

enum class Fmt : int { Fp8 = 0, Fp4 = 1 };

// The kernel's view of a Lin8 or a Lin4 call, or of up to kMaxParts of them that read the same
// input codes (a group): part p has its own weights, output count and output. The warp tiles of the
// parts are numbered as if their outputs were concatenated (part p's tiles start at tile0[p]), and
// each tile computes exactly what the part's own launch would, so a group's results equal separate
// calls bit for bit.
constexpr int kMaxParts = 3;
struct BlockScaledArgs {
  int n_parts = 1;
  const uint8_t* w[kMaxParts] = {};   // Fp8: codes [out][in]; Fp4: packed [E][out][in/2]
  const uint8_t* ws[kMaxParts] = {};  // Fp8: [ceil(out/32)][ceil(in/32)]; Fp4: [E][out][in/32]
  int64_t out[kMaxParts] = {};
  float* y[kMaxParts] = {};
  int64_t y_stride[kMaxParts] = {};
  int64_t tile0[kMaxParts] = {};  // first warp tile of each part
  int64_t in = 0, n_experts = 1;
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  int64_t rows = 0;                     // Fp8: m; Fp4: pairs
  const int32_t* expert_ids = nullptr;  // Fp4 only
  int64_t x_row_div = 1;                // Fp4 only
  bool round_bf16 = true;
  int kw = 32;              // K blocks per chunk (lanes per output slot)
  int64_t row_base = 0;     // Fp4: first pair row of this launch slice
  int64_t out_tiles = 0;    // warp tiles of NO * (32/kw) output rows, all parts
  int prefetch_chunks = 0;  // L2 prefetch window beyond the chunks being loaded (0: none)
  bool spread = false;      // warp tiles dealt warp-major over the grid (else CTA-major)
};

// Asks the TMA unit to fetch [p, p + bytes) into L2 (16-byte aligned, bytes % 16 == 0); no data
// reaches the SM, so it never changes a result.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// Four e4m3 codes (code k in byte k) -> their exact values.
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float (&v)[4]) {
  const uint32_t lo = e4m3x2_to_f16x2(w), hi = e4m3x2_to_f16x2(w >> 16);
  v[0] = f16_lo(lo), v[1] = f16_hi(lo), v[2] = f16_lo(hi), v[3] = f16_hi(hi);
}
// Eight e2m1 codes (code k in bits 4k..4k+3) -> value·2^-6 each, exact: the codes become e4m3
// bytes (sign to bit 7, magnitude to bits 4..2; even codes from the low nibbles, odd codes from the
// high ones), then f16 and f32 as above.
constexpr float kE2m1Unscale = 64.0f;  // 2^6: undoes the placement's 2^-6
__device__ __forceinline__ void e2m1x8_to_f32_scaled(uint32_t w, float (&v)[8]) {
  const uint32_t even = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu);
  const uint32_t odd = (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu);
  const uint32_t e01 = e4m3x2_to_f16x2(even), e23 = e4m3x2_to_f16x2(even >> 16);
  const uint32_t o01 = e4m3x2_to_f16x2(odd), o23 = e4m3x2_to_f16x2(odd >> 16);
  v[0] = f16_lo(e01), v[1] = f16_lo(o01), v[2] = f16_hi(e01), v[3] = f16_hi(o01);
  v[4] = f16_lo(e23), v[5] = f16_lo(o23), v[6] = f16_hi(e23), v[7] = f16_hi(o23);
}

// Every code through the kernels' decoders (unit test of the bit placements against numeric.h).
__global__ void lin_decode_all_kernel(float* e4m3_out, float* e2m1_out) {
  const int t = threadIdx.x;  // 256 threads, thread t decodes code t
  float v[4];
  // code t in each byte position of a word whose other bytes hold other codes
  for (int pos = 0; pos < 4; ++pos) {
    const uint32_t fill = 0x3AC17F00u ^ (static_cast<uint32_t>(t) * 0x01010101u);
    const uint32_t w = (fill & ~(0xFFu << (8 * pos))) | (static_cast<uint32_t>(t) << (8 * pos));
    e4m3x4_to_f32(w, v);
    e4m3_out[pos * 256 + t] = v[pos];
  }
  if (t < 16) {
    float f[8];
    for (int pos = 0; pos < 8; ++pos) {
      const uint32_t fill = 0x9E3779B9u ^ (static_cast<uint32_t>(t) * 0x11111111u);
      const uint32_t w = (fill & ~(0xFu << (4 * pos))) | (static_cast<uint32_t>(t) << (4 * pos));
      e2m1x8_to_f32_scaled(w, f);
      e2m1_out[pos * 16 + t] = __fmul_rn(f[pos], kE2m1Unscale);
    }
  }
}

// dev::e8m0_value without branches (the same values: 0 -> 2^-127, 255 -> NaN, else 2^(b-127)).
__device__ __forceinline__ float e8m0_value_nb(uint8_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 23;
  bits = b == 0 ? 0x00400000u : bits;
  bits = b == 255 ? 0x7fc00000u : bits;
  return __uint_as_float(bits);
}

// Fold buffer words per warp: R*ns*NO pairs of kw + 4 words plus the per-(r, slot) pads (< 32
// each), for any kw of 8, 16, 32 (ns = 32/kw); a multiple of 4 so every warp's part is 16-byte
// aligned.
template <int R, int NO>
__host__ __device__ constexpr int fold_words() {
  return R * NO * 48 + R * 128;
}

template <int N>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
}

// The part that global warp tile `tile` belongs to, and the tile's index within it (static indices:
// the argument arrays stay in the parameter space).
struct PartView {
  const uint8_t* w;
  const uint8_t* ws;
  int64_t out;
  float* y;
  int64_t y_stride;
  int64_t tile;
};
__device__ __forceinline__ PartView part_of(const BlockScaledArgs& a, int64_t tile) {
  PartView v{a.w[0], a.ws[0], a.out[0], a.y[0], a.y_stride[0], tile};
#pragma unroll
  for (int p = 1; p < kMaxParts; ++p)
    if (p < a.n_parts && tile >= a.tile0[p]) v = {a.w[p], a.ws[p], a.out[p], a.y[p], a.y_stride[p], tile - a.tile0[p]};
  return v;
}

// Per-CTA description of the activation rows it serves: up to R rows that share one weight.
template <int R>
struct RowGroup {
  int nr;               // rows in use (1..R)
  int64_t y_row[R];     // output rows
  int64_t x_row[R];     // activation rows
  int64_t expert;       // Fp4 bank index
};

template <Fmt F, int R, int NO>
__global__ void __launch_bounds__(kThreads, 2) block_scaled_kernel(BlockScaledArgs a) {
  extern __shared__ __align__(16) uint32_t smem[];
  float* fold_buf = reinterpret_cast<float*>(smem);
  __shared__ int s_count;
  __shared__ int64_t s_members[R];
  __shared__ int s_nr;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = a.kw, ns = 32 / kw, slot = lane / kw, kbl = lane % kw;
  const int64_t in = a.in, nb = in / 32;
  const int64_t tile_rows = static_cast<int64_t>(NO) * ns;  // output rows of one warp tile
  // Warp w of CTA b starts at tile b*kWarps + w (CTA-major: a CTA's warps read neighbouring rows)
  // or, when the grid has more warps than tiles (spread), at w*gridDim.x + b, so that every SM
  // gets an even share; either way it then steps by all the grid's warps.
  const int64_t first_tile = a.spread ? static_cast<int64_t>(warp) * gridDim.x + blockIdx.x
                                      : static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t tile_step = static_cast<int64_t>(gridDim.x) * kWarps;
  constexpr int kWW = F == Fmt::Fp8 ? 8 : 4;      // 32-bit words per weight block
  constexpr int64_t kRowBytesPerBlock = kWW * 4;
  const int n_chunks = static_cast<int>((nb + kw - 1) / kw);

  // L2 prefetch of chunks [c_begin, c_end) of the warp's rows in tile `tile`: lane q < NO*ns takes
  // row q (one bulk range per row). wexp: the expert's weight base.
  // pf_row: this lane's weight row in the tile, or null (one lane per row)
  auto prefetch_row = [&](const uint8_t* wexp, int64_t out, int64_t tile) -> const uint8_t* {
    const int64_t o = tile * tile_rows + lane;
    return lane < NO * ns && o < out ? wexp + o * (nb * kRowBytesPerBlock) : nullptr;
  };
  auto prefetch_rows = [&](const uint8_t* pf_row, int c_begin, int c_end) {
    if (c_end > n_chunks) c_end = n_chunks;
    if (c_begin >= c_end || pf_row == nullptr) return;
    const int kb0 = c_begin * kw, kb1 = c_end * kw < nb ? c_end * kw : static_cast<int>(nb);
    prefetch_l2(pf_row + kb0 * kRowBytesPerBlock, static_cast<uint32_t>((kb1 - kb0) * kRowBytesPerBlock));
  };
  constexpr int kBlocksInFlight = (R == 4 || (F == Fmt::Fp8 && R == 2)) ? 4 : 8;
  constexpr int kCU = kBlocksInFlight / NO > 1 ? kBlocksInFlight / NO : 1;
  // Lin8: the weights do not depend on earlier kernels; start the first tile's window now.
  int early_pf_end = kCU;  // the first tile's window start (later tiles: kCU)
  if constexpr (F == Fmt::Fp8) {
    if (a.prefetch_chunks > 0 && first_tile < a.out_tiles) {
      early_pf_end = kCU + a.prefetch_chunks;
      const PartView pv = part_of(a, first_tile);
      prefetch_rows(prefetch_row(pv.w, pv.out, pv.tile), 0, early_pf_end);
    }
  }
  dev::pdl_enter();

  RowGroup<R> grp;
  if constexpr (F == Fmt::Fp8) {
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * R;
    grp.nr = static_cast<int>(a.rows - r0 < R ? a.rows - r0 : R);
#pragma unroll
    for (int r = 0; r < R; ++r) grp.y_row[r] = grp.x_row[r] = r0 + (r < grp.nr ? r : 0);
    grp.expert = 0;
  } else {
    const int64_t row = a.row_base + blockIdx.y;
    const int64_t e = a.expert_ids ? a.expert_ids[row] : 0;
    if (e < 0 || e >= a.n_experts) {  // an empty slot: zeros, spread over the row's CTAs
      for (int p = 0; p < a.n_parts; ++p)
        for (int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + tid; o < a.out[p];
             o += static_cast<int64_t>(gridDim.x) * kThreads)
          a.y[p][row * a.y_stride[p] + o] = 0.0f;
      return;
    }
    // The pairs of expert e in row order form groups of R; only a group's first row runs it.
    if constexpr (R == 1) {
      if (tid == 0) s_nr = 1, s_members[0] = row;
    } else if (a.expert_ids == nullptr) {
      if (row % R != 0) return;
      const int nr = static_cast<int>(a.rows - row < R ? a.rows - row : R);
      if (tid == 0) {
        s_nr = nr;
        for (int r = 0; r < R; ++r) s_members[r] = row + (r < nr ? r : 0);
      }
    } else {
      if (tid == 0) s_count = 0;
      __syncthreads();
      int before = 0;
      for (int64_t i = tid; i < row; i += kThreads) before += a.expert_ids[i] == e;
      if (before) atomicAdd(&s_count, before);
      __syncthreads();
      if (s_count % R != 0) return;  // uniform: every thread read the same count
      if (warp == 0) {
        int found = 1;
        int64_t mem[R];
#pragma unroll
        for (int r = 0; r < R; ++r) mem[r] = row;
        for (int64_t base = row + 1; base < a.rows && found < R; base += 32) {
          const int64_t i = base + lane;
          unsigned mask = __ballot_sync(dev::kFull, i < a.rows && a.expert_ids[i] == e);
          while (mask && found < R) {
            const int b = __ffs(mask) - 1;
            mask &= mask - 1;
#pragma unroll
            for (int r = 1; r < R; ++r)
              if (r == found) mem[r] = base + b;
            ++found;
          }
        }
        if (lane == 0) {
          s_nr = found;
          for (int r = 0; r < R; ++r) s_members[r] = mem[r];
        }
      }
    }
    __syncthreads();
    grp.nr = s_nr;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      grp.y_row[r] = s_members[r];
      grp.x_row[r] = s_members[r] / a.x_row_div;
    }
    grp.expert = e;
  }

  // this warp's fold buffer: pair p = (r*ns + slot)*NO + j holds kw terms at fold_offset(p), read
  // back with 16-byte loads (stride kw + 4; the per-(r, slot) pad keeps the ns slots' writes of one
  // (row, output) on distinct banks)
  float* fb = fold_buf + warp * fold_words<R, NO>();
  const int fstride = kw + 4;
  const int gpad = ((kw - NO * fstride) % 32 + 32) % 32;
  auto fold_offset = [&](int p) { return p * fstride + (p / NO) * gpad; };
  const int pairs = grp.nr * ns * NO;
  constexpr int kFold = (R * NO * 4 + 31) / 32;  // pairs per lane at most (ns <= 4)
  // chunks whose weights are loaded together (kCU, above): ~8 blocks per lane (fewer where
  // registers run short)

  const int64_t snb = (in + 31) / 32;
  const int64_t w_row_bytes = F == Fmt::Fp8 ? in : in / 2;
  const int full_chunks = static_cast<int>(nb / kw);  // chunks in which every lane has its K block
  // K block index of the group's activation rows at this lane's block kbl (codes: 32 bytes and
  // scales: one float per block, in = 32·nb)
  int64_t x_blk[R];
#pragma unroll
  for (int r = 0; r < R; ++r) x_blk[r] = grp.x_row[r] * nb + kbl;

  for (int64_t gtile = first_tile; gtile < a.out_tiles; gtile += tile_step) {
    const PartView pv = part_of(a, gtile);
    const int64_t tile = pv.tile, out = pv.out;
    const uint8_t* wbase = F == Fmt::Fp8 ? pv.w : pv.w + grp.expert * out * (in / 2);
    const uint8_t* sbase = F == Fmt::Fp8 ? pv.ws : pv.ws + grp.expert * out * nb;
    const int64_t o_warp = tile * tile_rows;
    const int64_t o_lane = o_warp + static_cast<int64_t>(slot) * NO;
    float acc[kFold];
#pragma unroll
    for (int q = 0; q < kFold; ++q) acc[q] = 0.0f;
    // chunks below pf_end are requested into L2 already (or are about to be demand-loaded)
    int pf_end = early_pf_end;
    early_pf_end = kCU;
    const uint8_t* pf_row = F == Fmt::Fp8 && a.prefetch_chunks > 0 ? prefetch_row(wbase, out, tile) : nullptr;
    // this lane's NO weight rows and their scales at K block kbl. FP8 scales cover 32 x 32 blocks
    // and the lane's NO rows never cross a multiple of 32 (NO divides 32, o_lane is a multiple of
    // NO): one scale per K block serves all of them. (Pointers past the end are never read.)
    const uint8_t* w_lane = wbase + o_lane * w_row_bytes + kbl * kRowBytesPerBlock;
    const uint8_t* s_lane = F == Fmt::Fp8 ? sbase + (o_lane / 32) * snb + kbl : sbase + o_lane * nb + kbl;
    const bool rows_full = o_warp + tile_rows <= out;  // warp-uniform
    if (o_warp < out) {
      for (int c0 = 0; c0 < n_chunks; c0 += kCU) {
        // weights of kCU chunks x NO rows, issued together (16-byte loads, coalesced over the kw
        // lanes of a slot): ~8 blocks in flight per lane whatever NO is
        constexpr int kNS = F == Fmt::Fp8 ? 1 : NO;  // weight scales per K block and lane
        uint32_t wq[kCU][NO][kWW];
        float wsv[kCU][kNS];
        if (rows_full && c0 + kCU <= full_chunks) {  // warp-uniform: no bounds to check
#pragma unroll
          for (int u = 0; u < kCU; ++u) {
            const int koff = (c0 + u) * kw;
#pragma unroll
            for (int j = 0; j < NO; ++j) load_words(w_lane + j * w_row_bytes + koff * kRowBytesPerBlock, wq[u][j]);
#pragma unroll
            for (int j = 0; j < kNS; ++j) wsv[u][j] = e8m0_value_nb(s_lane[j * nb + koff]);
          }
        } else {
#pragma unroll
          for (int u = 0; u < kCU; ++u) {
            const int koff = (c0 + u) * kw;
            const bool k_ok = c0 + u < n_chunks && koff + kbl < nb;
#pragma unroll
            for (int j = 0; j < NO; ++j) {
              if (k_ok && o_lane + j < out) {
                load_words(w_lane + j * w_row_bytes + koff * kRowBytesPerBlock, wq[u][j]);
              } else {
#pragma unroll
                for (int i = 0; i < kWW; ++i) wq[u][j][i] = 0;
              }
            }
#pragma unroll
            for (int j = 0; j < kNS; ++j)
              wsv[u][j] = k_ok && o_lane + j < out ? e8m0_value_nb(s_lane[j * nb + koff]) : 0.0f;
          }
        }
        // keep the L2 window prefetch_chunks ahead of the chunks just loaded (warp-uniform)
        if (F == Fmt::Fp8 && a.prefetch_chunks > 0) {  // (the launcher gives Lin4 no window)
          const int want = static_cast<int>(c0) + kCU + a.prefetch_chunks;
          if (want > pf_end && pf_end < n_chunks) {
            prefetch_rows(pf_row, pf_end, want);
            pf_end = want;
          }
        }
#pragma unroll
        for (int u = 0; u < kCU; ++u) {
          const int c = c0 + u;
          if (c >= n_chunks) break;  // uniform over the warp
          const int koff = c * kw;
          const bool kb_ok = koff + kbl < nb;
          const int cnt = static_cast<int>(nb - koff < kw ? nb - koff : kw);
          float term[R][NO];
          if (kb_ok) {
            // activation codes of the R rows
            uint32_t xq[R][8];
            float xsv[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if (r < grp.nr) {
                load_words(a.x_codes + (x_blk[r] + koff) * 32, xq[r]);
                xsv[r] = a.x_scales[x_blk[r] + koff];
              } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) xq[r][i] = 0;
                xsv[r] = 0.0f;
              }
            }
            float part[R][NO];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < NO; ++j) part[r][j] = 0.0f;
            // the block dot, element by element in K order for every (row, output); the activation
            // codes are decoded once per group of elements and shared by the NO outputs
            if constexpr (F == Fmt::Fp8) {
#pragma unroll
              for (int q = 0; q < 8; ++q) {  // word q: elements 4q .. 4q+3
                float xv[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r) e4m3x4_to_f32(xq[r][q], xv[r]);
#pragma unroll
                for (int j = 0; j < NO; ++j) {
                  float wv[4];
                  e4m3x4_to_f32(wq[u][j][q], wv);
#pragma unroll
                  for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int e = 0; e < 4; ++e) part[r][j] = fmaf(xv[r][e], wv[e], part[r][j]);
                }
              }
            } else {
#pragma unroll
              for (int q = 0; q < 4; ++q) {  // weight word q: elements 8q .. 8q+7
                float xv[R][8];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                  float lo[4], hi[4];
                  e4m3x4_to_f32(xq[r][2 * q], lo);
                  e4m3x4_to_f32(xq[r][2 * q + 1], hi);
#pragma unroll
                  for (int e = 0; e < 4; ++e) xv[r][e] = lo[e], xv[r][4 + e] = hi[e];
                }
#pragma unroll
                for (int j = 0; j < NO; ++j) {
                  float wv[8];  // w·2^-6
                  e2m1x8_to_f32_scaled(wq[u][j][q], wv);
#pragma unroll
                  for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int e = 0; e < 8; ++e) part[r][j] = fmaf(xv[r][e], wv[e], part[r][j]);
                }
              }
#pragma unroll
              for (int r = 0; r < R; ++r)
#pragma unroll
                for (int j = 0; j < NO; ++j) part[r][j] = __fmul_rn(part[r][j], kE2m1Unscale);  // exact
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < NO; ++j)
                term[r][j] = __fmul_rn(__fmul_rn(part[r][j], xsv[r]), wsv[u][F == Fmt::Fp8 ? 0 : j]);
          } else {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < NO; ++j) term[r][j] = 0.0f;
          }
          // fold the chunk's terms in K order: pair p by lane p % 32
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (r < grp.nr)
#pragma unroll
              for (int j = 0; j < NO; ++j) fb[fold_offset((r * ns + slot) * NO + j) + kbl] = term[r][j];
          __syncwarp();
#pragma unroll
          for (int q = 0; q < kFold; ++q) {
            const int p = lane + 32 * q;
            if (p < pairs) {
              const float* src = fb + fold_offset(p);
              float v = acc[q];
              if (cnt == kw) {  // whole chunk: 16-byte reads (kw is a multiple of 4)
                for (int i = 0; i < kw; i += 4) {
                  const float4 t = *reinterpret_cast<const float4*>(src + i);
                  v = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(v, t.x), t.y), t.z), t.w);
                }
              } else {
                for (int i = 0; i < cnt; ++i) v = __fadd_rn(v, src[i]);
              }
              acc[q] = v;
            }
          }
          __syncwarp();
        }
      }
    }
    // lane p writes pair p = (r*ns + s)*NO + j
#pragma unroll
    for (int q = 0; q < kFold; ++q) {
      const int p = lane + 32 * q;
      if (p < pairs) {
        const int r = p / (ns * NO), s = (p / NO) % ns, j = p % NO;
        const int64_t o = o_warp + static_cast<int64_t>(s) * NO + j;
        int64_t yr = grp.y_row[0];
#pragma unroll
        for (int rr = 1; rr < R; ++rr)
          if (rr == r) yr = grp.y_row[rr];  // static indices keep the row list in registers
        if (o < out) pv.y[yr * pv.y_stride + o] = a.round_bf16 ? dev::bf16_round(acc[q]) : acc[q];
      }
    }
  }
}

// ---- launch ---------------------------------------------------------------------------------------
template <Fmt F, int R, int NO>
std::atomic<uint64_t>& configured() {
  static std::atomic<uint64_t> done{0};
  return done;
}

// Blocks per chunk: the largest of 32/16/8 that divides the block count (no idle lanes), else 8.
int pick_kw(int64_t nb) {
  if (nb % 32 == 0) return 32;
  if (nb % 16 == 0) return 16;
  return 8;
}

template <Fmt F, int R, int NO>
size_t smem_bytes() {
  return static_cast<size_t>(kWarps) * fold_words<R, NO>() * 4;
}

// DSV41_LIN_NO_L2_PREFETCH=1 turns the L2 window off (for measuring what it brings).
bool l2_prefetch_enabled() {
  static const bool on = std::getenv("DSV41_LIN_NO_L2_PREFETCH") == nullptr;
  return on;
}

// Lin4 calls of at most this many (token, expert) pairs are decode steps (m <= 4 tokens of 6 pairs):
// they get the decode grid below whatever their CTA tiles would fill.
constexpr int64_t kLin4DecodePairs = 24;

// CTAs of a variant resident per SM (registers, shared memory), once per process.
template <Fmt F, int R, int NO>
int resident_per_sm(size_t smem) {
  static std::atomic<int> cached{0};
  int n = cached.load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, block_scaled_kernel<F, R, NO>, kThreads, smem) != cudaSuccess ||
      n <= 0) {
    (void)cudaGetLastError();
    n = 2;
  }
  cached.store(n, std::memory_order_relaxed);
  return n;
}

template <Fmt F, int R, int NO>
cudaError_t launch_one(const BlockScaledArgs& a, int64_t groups, cudaStream_t s) {
  const size_t smem = smem_bytes<F, R, NO>();
  const cudaError_t attr = allow_smem(block_scaled_kernel<F, R, NO>, smem, configured<F, R, NO>());
  if (attr != cudaSuccess) return attr;
  BlockScaledArgs b = a;
  const int ns = 32 / b.kw;
  const int64_t tile_rows = static_cast<int64_t>(NO) * ns;  // output rows of one warp tile
  // the parts' tiles back to back (each part's last tile may be partial)
  b.out_tiles = 0;
  for (int p = 0; p < b.n_parts; ++p) {
    if (b.out[p] <= 0) return cudaSuccess;  // (the wrappers reject empty outputs)
    b.tile0[p] = b.out_tiles;
    b.out_tiles += (b.out[p] + tile_rows - 1) / tile_rows;
  }
  const int64_t g = groups > 0 ? groups : 1;
  // CTAs resident at once (registers usually allow two: __launch_bounds__(kThreads, 2))
  const int64_t resident = static_cast<int64_t>(sm_count()) * resident_per_sm<F, R, NO>(smem);
  const bool decode = g <= (F == Fmt::Fp8 ? 4 : 64);
  const int64_t cta_tiles = (b.out_tiles + kWarps - 1) / kWarps;
  // Lin4 expert banks at decode sizes: the CTA tiles of a few pairs come to 1-3 CTAs per SM (6
  // pairs of 2304x5120: 216 CTAs on 132 SMs, so 84 SMs carry twice the bytes and instructions of
  // the other 48; 24 pairs: 384 CTAs, 1.45 waves). One wave dealt evenly over all warps instead.
  // Measured on H200 (bench_gpu_linear, PDL on), CTA tiles -> this grid, us: gate/up 2304x5120
  // m = 2 50.3 -> 41.0, m = 4 92.1 -> 73.2; down 5120x2304 m = 4 98.1 -> 70.9; m = 1 and down m = 2
  // unchanged (22.9 -> 22.6, 39.1 -> 38.9).
  const bool lin4_decode = F == Fmt::Fp4 && g <= kLin4DecodePairs;
  int64_t gx;
  if (decode && (cta_tiles * g * 4 < resident * 3 || lin4_decode)) {
    // decode sizes whose CTA tiles would leave over a quarter of the resident CTAs idle (measured on
    // H200: wo_b 5120x8192 35.3 -> 33.6 us, shared w1 16.8 -> 15.7 us without PDL), and Lin4 banks
    // of a few pairs (above): one wave of resident CTAs, the warp tiles dealt evenly over all their
    // warps
    b.spread = true;
    gx = std::clamp<int64_t>(resident / g, 1, b.out_tiles);
  } else {
    // the grid round 1 measured (CTA tiles, CTAs sized by shared memory): where the CTA tiles fill
    // the GPU anyway, spreading measured slower (spread + L2 window, no PDL: Lin4 gate/up 34.9 ->
    // 37.7 us, wq_b 25.1 -> 28.0 us), and for passes of many row groups (prefill)
    const int per_sm = static_cast<int>(std::clamp<size_t>((227 * 1024) / (smem + 1024), 1, 3));
    gx = std::clamp<int64_t>(static_cast<int64_t>(sm_count()) * per_sm / g, 1, cta_tiles);
  }
  // L2 prefetch window (Lin8 at decode sizes): ~20 MB ahead over all resident warps, 1..8 chunks
  // per warp (bulk prefetches need 16-byte aligned row ranges). Measured on H200 at m = 1: Lin8
  // 0.5-1.4 us faster per call (wq_a, wkv, wq_b, shared w1/w2, engram wkv); Lin4 0.5-1 us slower
  // (its rows are short: many small bulk requests), so the expert bank goes without. Re-measured
  // with the decode grid, per-tile scale ranges and windows of 20-64 MB (whole tiles ahead, carried
  // into the next tile): still 2-3 us slower at m = 1 and 8-28 % slower at m = 4. At m = 1
  // the FP4 bank is bound by instruction issue as much as by bytes: its unrolled chunk is ~1030
  // SASS instructions per 256 weights and lane (per weight: 1 FFMA, 1.1 HADD2.F32, 0.56
  // F2FP.E4M3, ~1.2 bit moves), ~8.5 us of issue at 100 % for one 6-pair bank vs ~8.7 us of
  // copy time, so bringing the bytes in earlier does not shorten it.
  if (F == Fmt::Fp8 && decode) {
    constexpr int64_t kWindowBytes = int64_t{20} << 20;
    const int64_t block_bytes = F == Fmt::Fp8 ? 32 : 16;
    bool aligned = b.in % 32 == 0;
    for (int p = 0; p < b.n_parts; ++p) aligned = aligned && reinterpret_cast<uintptr_t>(b.w[p]) % 16 == 0;
    const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(gx * g, resident));
    const int64_t chunk_bytes = 32 * static_cast<int64_t>(NO) * block_bytes;  // one chunk of a warp's rows
    const int64_t w = kWindowBytes / (ctas * kWarps * chunk_bytes);
    // Only for calls whose weights fit in half the L2. Measured on H200 (bench_gpu_linear, window
    // on -> off, us): the 42 MB calls lose with it (wq_b m = 1 / 2 / 4 16.9 / 19.7 / 28.2 -> 16.4 /
    // 18.5 / 27.0, wo_b m = 2 25.6 -> 22.0), the 6.6-24 MB ones gain 0.3-0.7 (wq_a, shared w1/w2,
    // the grouped pairs).
    int64_t weight_bytes = 0;
    for (int p = 0; p < b.n_parts; ++p) weight_bytes += b.out[p] * b.in;
    const bool fits = weight_bytes <= l2_bytes() / 2;
    b.prefetch_chunks =
        aligned && fits && l2_prefetch_enabled() ? static_cast<int>(std::clamp<int64_t>(w, 1, 8)) : 0;
  }
  // grid.y is limited to 65535: row groups run in slices
  for (int64_t g0 = 0; g0 < groups; g0 += 65535) {
    const int64_t ng = groups - g0 < 65535 ? groups - g0 : 65535;
    BlockScaledArgs c = b;
    if constexpr (F == Fmt::Fp4) {
      c.row_base = g0;  // pair rows stay global: a group may reach into the next slice
    } else {
      // slice of m rows: shift the activation, scale and output pointers
      const int64_t r0 = g0 * R;
      c.x_codes = a.x_codes + r0 * a.in;
      c.x_scales = a.x_scales + r0 * (a.in / 32);
      for (int p = 0; p < a.n_parts; ++p) c.y[p] = a.y[p] + r0 * a.y_stride[p];
      c.rows = a.rows - r0;
    }
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(ng));
    const cudaError_t e = launch_pdl(block_scaled_kernel<F, R, NO>, grid, dim3(kThreads), smem, s, c);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Every instantiation's shared-memory opt-in at the first launch on a device (an eager call before
// any graph capture then covers the variants a captured call may pick).
template <Fmt F>
cudaError_t configure_all() {
  cudaError_t e = allow_smem(block_scaled_kernel<F, 1, 8>, smem_bytes<F, 1, 8>(), configured<F, 1, 8>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 1, 4>, smem_bytes<F, 1, 4>(), configured<F, 1, 4>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 1, 2>, smem_bytes<F, 1, 2>(), configured<F, 1, 2>());
  if constexpr (F == Fmt::Fp4)
    if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 2, 8>, smem_bytes<F, 2, 8>(), configured<F, 2, 8>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 2, 4>, smem_bytes<F, 2, 4>(), configured<F, 2, 4>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 2, 2>, smem_bytes<F, 2, 2>(), configured<F, 2, 2>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 4, 4>, smem_bytes<F, 4, 4>(), configured<F, 4, 4>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 4, 2>, smem_bytes<F, 4, 2>(), configured<F, 4, 2>());
  return e;
}

// R activation rows per weight read; NO outputs per lane, lowered while the grid has few warps.
template <Fmt F>
cudaError_t launch(BlockScaledArgs a, int R, int64_t groups, cudaStream_t s) {
  const cudaError_t conf = configure_all<F>();
  if (conf != cudaSuccess) return conf;
  a.kw = pick_kw(a.in / 32);
  const int ns = 32 / a.kw;
  const int64_t min_warps = 8 * static_cast<int64_t>(sm_count());
  // register budget: the NO weight blocks (8 words FP8, 4 words FP4) and R activation blocks
  int no = (R == 4 || (F == Fmt::Fp8 && R == 2)) ? 4 : 8;
  auto tiles = [&](int64_t rows_per_tile) {
    int64_t t = 0;
    for (int p = 0; p < a.n_parts; ++p) t += (a.out[p] + rows_per_tile - 1) / rows_per_tile;
    return t;
  };
  while (no > 2 && tiles(static_cast<int64_t>(no) * ns) * groups < min_warps) no /= 2;
  if (R == 1) {
    if (no == 8) return launch_one<F, 1, 8>(a, groups, s);
    if (no == 4) return launch_one<F, 1, 4>(a, groups, s);
    return launch_one<F, 1, 2>(a, groups, s);
  }
  if (R == 2) {
    if constexpr (F == Fmt::Fp4)
      if (no == 8) return launch_one<F, 2, 8>(a, groups, s);
    if (no == 4) return launch_one<F, 2, 4>(a, groups, s);
    return launch_one<F, 2, 2>(a, groups, s);
  }
  if (no == 4) return launch_one<F, 4, 4>(a, groups, s);
  return launch_one<F, 4, 2>(a, groups, s);
}

}  // namespace

namespace raw {
cudaError_t lin8_group(const Lin8GroupArgs& g, cudaStream_t s) {
  const Lin8Args& a = g.lin[0];
  if (g.count <= 0 || a.m == 0) return cudaSuccess;
  if (lin8_tc_gemv_takes(g)) return lin8_tc_gemv(g, s);  // decode passes (kernels/ops/lin8_tc_gemv.cu)
  if (a.row_invariant && !a.exact_block_sums) {
    // a shape the decode kernel does not take: the sequential sums (row-invariant too)
    Lin8GroupArgs e = g;
    for (int p = 0; p < e.count; ++p) e.lin[p].exact_block_sums = true;
    return lin8_group(e, s);
  }
  if (lin8_gemm_takes(g)) return lin8_gemm(g, s);  // passes of many rows (kernels/ops/lin_gemm.cu)
  BlockScaledArgs b;
  fill_lin8_parts(b, g, kMaxParts);
  const int R = a.m == 1 ? 1 : (a.m == 2 ? 2 : 4);
  return launch<Fmt::Fp8>(b, R, (a.m + R - 1) / R, s);
}
cudaError_t lin8(const Lin8Args& a, cudaStream_t s) {
  Lin8GroupArgs g;
  g.lin[0] = a;
  g.count = 1;
  return lin8_group(g, s);
}
cudaError_t lin4_group(const Lin4GroupArgs& g, cudaStream_t s) {
  const Lin4Args& a = g.lin[0];
  if (g.count <= 0 || a.rows == 0) return cudaSuccess;
  BlockScaledArgs b;
  b.n_parts = std::min(g.count, kMaxParts);
  for (int p = 0; p < b.n_parts; ++p) {
    b.w[p] = g.lin[p].w.packed;
    b.ws[p] = g.lin[p].w.scales;
    b.out[p] = g.lin[p].w.out;
    b.y[p] = g.lin[p].y;
    b.y_stride[p] = g.lin[p].y_stride;
  }
  b.in = a.w.in;
  b.n_experts = a.w.n_experts;
  b.x_codes = a.x_codes;
  b.x_scales = a.x_scales;
  b.rows = a.rows;
  b.expert_ids = a.expert_ids;
  b.x_row_div = a.x_row_div;
  b.round_bf16 = a.round_bf16;
  // Group size: one token's pairs never share an expert, and while there are fewer pairs than
  // experts (decode batches over a large bank) sharing is rare, so a group of R > 1 would mostly run
  // R-row arithmetic for one row; passes share often.
  const int64_t per_expert = a.expert_ids ? a.rows / std::max<int64_t>(1, a.w.n_experts) : a.rows;
  const int R = a.rows <= 8 || per_expert == 0 ? 1 : (a.rows <= 64 ? 2 : 4);
  return launch<Fmt::Fp4>(b, R, a.rows, s);
}
cudaError_t lin4(const Lin4Args& a, cudaStream_t s) {
  Lin4GroupArgs g;
  g.lin[0] = a;
  g.count = 1;
  return lin4_group(g, s);
}
cudaError_t lin_decode_all(float* e4m3_out, float* e2m1_out, cudaStream_t s) {
  lin_decode_all_kernel<<<1, 256, 0, s>>>(e4m3_out, e2m1_out);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
