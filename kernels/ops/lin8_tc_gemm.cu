// Lin8 as a tensor-core GEMM (mma.sync m16n8k16, fp16 inputs, fp32 accumulate), for prefill passes
// of calls that allow tensor-core block sums (Lin8Args::exact_block_sums == false).
//
// Arithmetic. Per (token, output) and 32-wide K block, the block's 32 exact code products are
// summed in the tensor core by the one arrangement every tensor-core block-scaled kernel uses
// (tc::block_a_fp8 / tc::block_b / tc::block_dot, ops/tc_block.cuh); the block is folded into the
// output's accumulator in increasing K-block order from zero as the CPU reference does (acc +=
// (part * act_scale) * w_scale, as tc::fold_block); bf16 rounding at the end if asked. An output
// therefore depends only on its own token's codes and scales and its own weight row: the tile, the
// row count, the token tile it lands in and the other parts of a group change nothing. It equals the
// CPU reference whenever no block sum rounds in either order (ops/tc_block.cuh has the bound otherwise).
// The scaled path's default goes further (Lin8Args::block_fold off): every row in f16 and, for the
// 32-row weight groups whose block scales allow it, the whole K summed in the MMAs (the whole-K
// form in the kernel); still a function of the output's own row, token and weight group alone.
//
// Tiles. The MMA's M side is the weight rows (outputs), its N side the tokens. A CTA computes BM
// weight rows x BN tokens with WM x WN warps, each warp MT 16-row m-tiles x NT 8-token n-tiles, and
// walks K 128 bytes (four scale blocks) per stage through an S-stage cp.async pipeline. Staged rows
// are 128 + 32 bytes apart, so a warp's 8-byte fragment reads (8 rows x 4 K quarters) hit 32
// distinct banks per half warp.
//
// Widening. Each warp widens the codes of its fragments (tc::block_a_fp8 / tc::block_b) at every
// read. A variant that widened each staged stage once into fp16 rows shared by all warps (one more
// barrier per stage, twice the shared-memory reads) measured 1.25-1.9x slower on H200 at every
// real shape and row count (bench_gpu_linear --gemm). The scaled path (Lin8Args::rows16) has no
// activation widening at all: a separate kernel writes the input once as f16 rows that carry their
// block scales (ops/scaled_rows.h), read here as they are, with one fma per block fold or none.
//
// Grid: x = token tiles (fastest, so the CTAs that read one weight tile run together and the weight
// comes from DRAM about once), y = weight-row tiles over the parts of a group numbered as if their
// outputs were concatenated (each part's last tile may be partial).
#include <algorithm>
#include <atomic>
#include <limits>
#include <type_traits>

#include "ops/cp_async.cuh"
#include "ops/lin8_tc_gemm.h"
#include "ops/lin_gemm.h"
#include "ops/lin8_gemm_parts.cuh"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"
#include "ops/scaled_rows.h"
#include "ops/tc_block.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kMaxParts = kLinGroupMax;
constexpr int kBK = 128;                   // K bytes (codes) per pipeline stage
constexpr int kStageBlocks = kBK / 32;     // scale blocks per stage
constexpr int kRowStride = kBK + 32;       // staged row pitch in bytes (bank-conflict padding)
constexpr int kRow16Stride = 2 * kBK;      // scaled path: f16 rows, unpadded (tc::f16_row_chunk)
constexpr int kMaxWsBytes = 16 * 1024;     // weight scales a CTA keeps (BM/32 rows x in/32 blocks)

using TcArgs = Lin8GemmParts;

// WM x WN warps of MT x NT MMA tiles, S stages (S16 on the scaled path, whose B stage holds f16
// rows: twice the bytes), MinBlocks CTAs per SM (__launch_bounds__).
template <int WM, int WN, int MT, int NT, int S, int MinBlocks, int S16>
struct TileShape {
  static constexpr int kWN = WN, kMT = MT, kNT = NT, kStages = S, kMinBlocks = MinBlocks, kStages16 = S16;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kBM = WM * MT * 16, kBN = WN * NT * 8;
  static constexpr int kABytes = kBM * kRowStride, kBBytes = kBN * kRowStride;
  static constexpr int kXsBytes = kStageBlocks * kBN * 4;  // fp32 activation scales [block][token]
  static constexpr int kStageBytes = kABytes + kBBytes + kXsBytes;
  static constexpr int kPipeBytes = S * kStageBytes;
  static constexpr int kAChunks = kBM * (kBK / 16) / kThreads;  // 16-byte copies per thread per stage
  static constexpr int kBChunks = kBN * (kBK / 16) / kThreads;
  static constexpr int kXsCopies = kStageBlocks * kBN / kThreads;
  static_assert(kBM % 32 == 0 && kAChunks * kThreads == kBM * (kBK / 16) && kBChunks * kThreads == kBN * (kBK / 16) &&
                kXsCopies * kThreads == kStageBlocks * kBN && kStageBytes % 16 == 0);
  // the scaled path: A, then the f16 rows (16-byte chunks: 16 a row per stage)
  static constexpr int kStage16Bytes = kABytes + kBN * kRow16Stride;
  static constexpr int kPipe16Bytes = S16 * kStage16Bytes;
  static constexpr int kB16Chunks = kBN * (2 * kBK / 16) / kThreads;
  static_assert(kB16Chunks * kThreads == kBN * (2 * kBK / 16) && kStage16Bytes % 16 == 0);
  template <bool kR16>
  static constexpr int pipe_bytes() { return kR16 ? kPipe16Bytes : kPipeBytes; }
  template <bool kR16>
  static size_t smem_bytes(int64_t nb) { return pipe_bytes<kR16>() + static_cast<size_t>((kBM / 32 * nb + 15) / 16 * 16); }
};
// Shared memory, codes path / scaled path (+ up to 16 KB of weight scales):
using BigTile = TileShape<2, 4, 4, 4, 4, 1, 3>;    // 128 x 128, 8 warps of 64 x 32, 172 / 160 KB: 1 CTA per SM
using SmallTile = TileShape<2, 2, 2, 4, 4, 2, 3>;  // 64 x 64, 4 warps of 32 x 32, 86 / 80 KB: 2 CTAs per SM

// Staging copies (ops/cp_async.cuh): ordered by the pipeline's stage barriers alone; a copy that is
// not `ok` zero-fills and reads nothing.
constexpr dev::CpOrder kCpOrder = dev::CpOrder::Free;

// With a.x16 (the scaled path, ops/scaled_rows.h) a call is two launches over the same grid: kR16
// takes the token tiles whose rows all have f16 rows (B = those rows, x_scale·2^c inside each value,
// so a block's fold is one fma with w_scale and the epilogue divides by 2^c: the same bits), the
// codes path the others. Without it, the codes path takes every tile.
template <class T, bool kR16>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) lin8_tc_gemm_kernel(const TcArgs a) {
  constexpr int kBM = T::kBM, kBN = T::kBN, kMT = T::kMT, kNT = T::kNT;
  constexpr int kStages = kR16 ? T::kStages16 : T::kStages;
  constexpr int kThreads = T::kThreads, kStageBytes = kR16 ? T::kStage16Bytes : T::kStageBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int warp_m = warp / T::kWN, warp_n = warp % T::kWN;
  const Lin8PartView pv = lin8_part_of(a, blockIdx.y);
  const int64_t f0 = pv.col * kBM, m0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t in = a.in, nb = in / 32, out = pv.out, rows = a.rows;
  const int n_steps = static_cast<int>((nb + kStageBlocks - 1) / kStageBlocks);
  uint8_t* s_ws = smem + T::template pipe_bytes<kR16>();  // [kBM/32][nb] E8M0 bytes of the tile's rows
  // Whether every row of this CTA's token tile has f16 rows (read after the wait: the conversion
  // is the previous kernel).
  auto tile_scaled = [&] {
    const bool mine = tid >= kBN || m0 + tid >= rows || a.x16_info[m0 + tid] != kScaledRowUnscaled;
    return __syncthreads_and(mine) != 0;
  };
  if constexpr (!kR16) {
    // The codes path of a scaled call decides first, so that the tiles it leaves load nothing.
    if (a.x16 != nullptr) {
      dev::pdl_enter();
      if (tile_scaled()) return;
    }
  }

  // Copy sources: chunk c = tid + i*kThreads is staged row c/8, bytes 16(c%8).. of the stage's K,
  // so chunk i's source is chunk 0's plus i·kThreads/8 rows (one base pointer and a 32-bit stride:
  // lin8_tc_gemm_supported keeps `in` small enough) and its row's validity is bit i of a mask.
  const int part16 = (tid & 7) * 16;
  const uint8_t* const a_base = pv.w + (f0 + (tid >> 3)) * in + part16;
  const uint32_t a_stride = static_cast<uint32_t>(kThreads / 8 * in);
  uint32_t a_rows_ok = 0u;
#pragma unroll
  for (int i = 0; i < T::kAChunks; ++i) a_rows_ok |= (f0 + (tid >> 3) + i * (kThreads / 8) < out ? 1u : 0u) << i;
  auto load_a = [&](int step, int buf) {
    uint8_t* sA = smem + buf * kStageBytes;
    const int64_t k = static_cast<int64_t>(step) * kBK;
    const bool k_ok = k + part16 < in;
    const uint8_t* const src = a_base + k;
#pragma unroll
    for (int i = 0; i < T::kAChunks; ++i) {
      const bool ok = ((a_rows_ok >> i) & 1u) != 0u && k_ok;
      dev::cp_async16_if<kCpOrder, dev::CpL2::B128>(sA + ((tid >> 3) + i * (kThreads / 8)) * kRowStride + part16,
                                                    ok ? src + i * a_stride : pv.w, ok);
    }
  };
  // weights first: they never change, so they may be read before the previous kernel finishes
  for (int i = tid; i < kBM / 32 * nb; i += kThreads) {
    const int64_t grp = i / nb, kb = i - grp * nb;
    s_ws[i] = f0 + grp * 32 < out ? pv.ws[(f0 / 32 + grp) * nb + kb] : uint8_t{0};
  }
  for (int st = 0; st < kStages - 1; ++st)
    if (st < n_steps) load_a(st, st);
  dev::pdl_enter();
  if constexpr (kR16) {
    if (!tile_scaled()) {  // the codes path's tile: drop the weight copies issued above
      dev::cp_async_commit<kCpOrder>();
      dev::cp_async_wait<0, kCpOrder>();
      return;
    }
  }

  // B the same way: on the scaled path chunk c = tid + i*kThreads is token row c/16, 8 values (16
  // bytes) at 8(c%16), so chunk i is chunk 0 plus i·kThreads/16 rows; on the codes path as A.
  constexpr int kBChunks = kR16 ? T::kB16Chunks : T::kBChunks;
  constexpr int kBRowsPerChunk = kR16 ? kThreads / 16 : kThreads / 8;
  const int b_row0 = kR16 ? tid / 16 : tid >> 3;
  const int b_part = kR16 ? (tid % 16) * 16 : part16;  // bytes into the stage's row
  const uint8_t* const b_base =
      kR16 ? reinterpret_cast<const uint8_t*>(a.x16 + (m0 + b_row0) * in) + b_part : a.x_codes + (m0 + b_row0) * in + b_part;
  const uint32_t b_stride = static_cast<uint32_t>(kBRowsPerChunk * in * (kR16 ? 2 : 1));
  uint32_t b_rows_ok = 0u;
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) b_rows_ok |= (m0 + b_row0 + i * kBRowsPerChunk < rows ? 1u : 0u) << i;
  // activation scale copy e = tid + i*kThreads: block e / kBN of the stage, token e % kBN
  const float* xs_src[T::kXsCopies];
  bool xs_ok[T::kXsCopies];
#pragma unroll
  for (int i = 0; i < T::kXsCopies; ++i) {
    const int e = tid + i * kThreads;
    const int64_t t = m0 + e % kBN;
    xs_ok[i] = t < rows;
    xs_src[i] = a.x_scales + (xs_ok[i] ? t : 0) * nb + e / kBN;
  }
  auto load_b = [&](int step, int buf) {
    uint8_t* sB = smem + buf * kStageBytes + T::kABytes;
    const int64_t k = static_cast<int64_t>(step) * kBK;
    if constexpr (kR16) {
      const bool k_ok = k + b_part / 2 < in;
      const uint8_t* const src = b_base + 2 * k;
#pragma unroll
      for (int i = 0; i < kBChunks; ++i) {
        const int row = b_row0 + i * kBRowsPerChunk;
        const bool ok = ((b_rows_ok >> i) & 1u) != 0u && k_ok;
        dev::cp_async16_if<kCpOrder, dev::CpL2::B128>(sB + row * kRow16Stride + tc::f16_row_chunk(row, tid % 16) * 16,
                                                      ok ? src + i * b_stride : reinterpret_cast<const uint8_t*>(a.x16), ok);
      }
    } else {
      float* sXs = reinterpret_cast<float*>(sB + T::kBBytes);
      const bool k_ok = k + part16 < in;
      const uint8_t* const src = b_base + k;
#pragma unroll
      for (int i = 0; i < kBChunks; ++i) {
        const bool ok = ((b_rows_ok >> i) & 1u) != 0u && k_ok;
        dev::cp_async16_if<kCpOrder, dev::CpL2::B128>(sB + (b_row0 + i * kBRowsPerChunk) * kRowStride + part16,
                                                      ok ? src + i * b_stride : a.x_codes, ok);
      }
#pragma unroll
      for (int i = 0; i < T::kXsCopies; ++i) {
        const int e = tid + i * kThreads;
        const bool ok = xs_ok[i] && static_cast<int64_t>(step) * kStageBlocks + e / kBN < nb;
        dev::cp_async4_if<kCpOrder>(sXs + e, ok ? xs_src[i] + static_cast<int64_t>(step) * kStageBlocks : a.x_scales, ok);
      }
    }
  };
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_steps) load_b(st, st);
    dev::cp_async_commit<kCpOrder>();
  }

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  const int row_base = warp_m * kMT * 16, tok_base = warp_n * kNT * 8;
  // A warp's rows are whole 32-row groups of the weight scales (row_base is a multiple of 32), two
  // m-tiles each: m-tile mt lies in the warp's group mt / 2.
  static_assert(kMT % 2 == 0);
  constexpr int kWarpGroups = kMT / 2;
  auto group_of = [&](int mt) { return (row_base >> 5) + mt / 2; };

  // The scaled path's whole-K form (Lin8GemmParts::block_fold off): the weights enter the tensor
  // core as code · 2^(s_b - s_ref) in f16 (s_b a block's E8M0 byte, s_ref one per 32-row scale
  // group; tc::scale_block_a), so the products carry their block's weight scale relative to the
  // group's, and the MMAs accumulate the whole K in their fp32 accumulators: no per-block fold, no
  // scale decoding in the loop. The epilogue multiplies by 2^(s_ref - 127). A group takes it when
  // its scale bytes over the whole K are 1..254 and within 2^21 of each other (s_ref = min(smallest
  // + 14, 254) puts every t = s_b - s_ref in [-14, 7], where e4m3 · 2^t is exact in f16); otherwise
  // its m-tiles fold per block. The choice depends on the group's weights alone: never on the tile,
  // the tokens or the other rows.
  bool wk[kWarpGroups];
  uint32_t wk_bias[kWarpGroups];  // (15 - s_ref) · 0x04000400: plus s_b · 0x04000400, the f16x2 of 2^(s_b - s_ref)
  int wk_exp[kWarpGroups];        // s_ref - 127
  bool all_wk = kR16 && !a.block_fold, any_wk = false;
#pragma unroll
  for (int wg = 0; wg < kWarpGroups; ++wg) {
    wk[wg] = false, wk_bias[wg] = 0u, wk_exp[wg] = 0;
    if constexpr (kR16) {
      if (!a.block_fold) {  // s_ws is complete: tile_scaled's barrier came after its copies
        const uint8_t* srow = s_ws + static_cast<int64_t>(group_of(2 * wg)) * nb;
        uint32_t lo = 255u, hi = 0u;
        for (int64_t i = lane; i < nb; i += 32) {
          const uint32_t b = srow[i];
          lo = min(lo, b), hi = max(hi, b);
        }
        lo = __reduce_min_sync(dev::kFull, lo);
        hi = __reduce_max_sync(dev::kFull, hi);
        wk[wg] = lo >= 1u && hi <= 254u && hi - lo <= 21u;
        const int s_ref = min(static_cast<int>(lo) + 14, 254);
        if (wk[wg]) wk_bias[wg] = static_cast<uint32_t>(15 - s_ref) * 0x04000400u, wk_exp[wg] = s_ref - 127;
        all_wk = all_wk && wk[wg];
        any_wk = any_wk || wk[wg];
      }
    }
  }

  // One stage in one of three forms, so that a warp pays for a per-m-tile choice only when its
  // m-tiles differ: every m-tile folding per block (the codes path, block_fold, groups outside the
  // whole-K range), every one summing the whole K (the scaled path's common case), or each as its group.
  enum : int { kFoldAll, kWholeKAll, kPerTile };
  auto compute_stage = [&](int step, auto form_tag) {
    constexpr int kForm = decltype(form_tag)::value;
    auto whole_k = [&](int mt) { return kForm == kWholeKAll || (kForm == kPerTile && wk[mt / 2]); };
    const uint8_t* sA = smem + (step % kStages) * kStageBytes;
    const uint8_t* sB = sA + T::kABytes;
    const int64_t kb0 = static_cast<int64_t>(step) * kStageBlocks;
#pragma unroll
    for (int kbl = 0; kbl < kStageBlocks; ++kbl) {
      if (kb0 + kbl >= nb) break;  // the last stage of a K that is no multiple of 128
      tc::BlockA af[kMT];
      float ws[kMT];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r = row_base + mt * 16 + g;
        const uint2 w0 = *reinterpret_cast<const uint2*>(sA + r * kRowStride + kbl * 32 + tig * 8);
        const uint2 w1 = *reinterpret_cast<const uint2*>(sA + (r + 8) * kRowStride + kbl * 32 + tig * 8);
        af[mt] = tc::block_a_fp8(w0, w1);
        // rows g and g+8 of an m-tile share one 32-row scale group
        const uint32_t sb = s_ws[group_of(mt) * nb + kb0 + kbl];
        if (whole_k(mt)) tc::scale_block_a(af[mt], sb * 0x04000400u + wk_bias[mt / 2]);
        else ws[mt] = dev::e8m0_value(static_cast<uint8_t>(sb));
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int t = tok_base + nt * 8;  // even: row t + g has g's parity
        if constexpr (kR16) {
          const uint4 bv =
              *reinterpret_cast<const uint4*>(sB + (t + g) * kRow16Stride + tc::f16_row_chunk(g, kbl * 4 + tig) * 16);
          const tc::BlockB bf = tc::block_b_f16(bv);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            if (whole_k(mt)) {
              tc::mma_f16(acc[mt][nt], af[mt].r[0], bf.r[0][0], bf.r[0][1]);
              tc::mma_f16(acc[mt][nt], af[mt].r[1], bf.r[1][0], bf.r[1][1]);
            } else {
              float d[4];
              tc::block_dot(d, af[mt], bf);
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][nt][i] = tc::fold_block_scaled(acc[mt][nt][i], d[i], ws[mt]);
            }
          }
        } else {
          const uint2 bv = *reinterpret_cast<const uint2*>(sB + (t + g) * kRowStride + kbl * 32 + tig * 8);
          const tc::BlockB bf = tc::block_b(bv);
          const float* sXs = reinterpret_cast<const float*>(sB + T::kBBytes);
          const float2 xs = *reinterpret_cast<const float2*>(sXs + kbl * kBN + t + 2 * tig);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            float d[4];
            tc::block_dot(d, af[mt], bf);
            acc[mt][nt][0] = tc::fold_block(acc[mt][nt][0], d[0], xs.x, ws[mt]);
            acc[mt][nt][1] = tc::fold_block(acc[mt][nt][1], d[1], xs.y, ws[mt]);
            acc[mt][nt][2] = tc::fold_block(acc[mt][nt][2], d[2], xs.x, ws[mt]);
            acc[mt][nt][3] = tc::fold_block(acc[mt][nt][3], d[3], xs.y, ws[mt]);
          }
        }
      }
    }
  };

  for (int step = 0; step < n_steps; ++step) {
    dev::cp_async_wait<kStages - 2, kCpOrder>();
    __syncthreads();  // stage `step` visible to all; the buffer refilled below is no longer read
    {
      const int next = step + kStages - 1;
      if (next < n_steps) load_a(next, next % kStages), load_b(next, next % kStages);
      dev::cp_async_commit<kCpOrder>();
    }
    if (kR16 && all_wk) compute_stage(step, std::integral_constant<int, kWholeKAll>{});
    else if (kR16 && any_wk) compute_stage(step, std::integral_constant<int, kPerTile>{});
    else compute_stage(step, std::integral_constant<int, kFoldAll>{});
  }
  dev::cp_async_wait<0, kCpOrder>();

  // d[2h + c]: weight row g + 8h, token 2tig + c of the MMA tile. The scaled path's row exponents
  // are read once per token.
  int row_exp[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t t = m0 + tok_base + nt * 8 + 2 * tig + c;
      row_exp[nt][c] = kR16 && t < rows ? a.x16_info[t] : 0;
    }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t f = f0 + row_base + mt * 16 + g + 8 * (i >> 1);
        const int64_t t = m0 + tok_base + nt * 8 + 2 * tig + (i & 1);
        if (f < out && t < rows) {
          float v = acc[mt][nt][i];
          // back from the row's 2^c (0 <= c <= 100), and in the whole-K form times the group's
          // 2^(s_ref - 127): one power of two 2^e, e in [-212, 127], in at most two exact steps
          if constexpr (kR16) v = dev::times_pow2(v, wk_exp[mt / 2] - row_exp[nt][i & 1]);
          pv.y[t * pv.y_stride + f] = a.round_bf16 ? dev::bf16_round(v) : v;
        }
      }
}

// Whether tile T's launch of this path fits the device's shared memory with the weight scales of
// `in` columns (GB10's 99 KB: the 64 x 64 tile only, its scales sized to the call).
template <class T, bool kR16>
bool path_fits(int64_t in) {
  return smem_fits(lin8_tc_gemm_kernel<T, kR16>, T::template smem_bytes<kR16>(in / 32));
}
template <class T>
bool tile_fits(int64_t in) {
  return path_fits<T, false>(in) && path_fits<T, true>(in);
}

template <class T, bool kR16>
cudaError_t launch_tile(TcArgs a, cudaStream_t s) {
  // The opt-in covers the largest weight-scale table (kMaxWsBytes), or all the device gives a block
  // where that is less; a call needing more is refused.
  static std::atomic<uint64_t> configured{0};
  const size_t most = std::min<size_t>(T::template pipe_bytes<kR16>() + kMaxWsBytes,
                                       max_dynamic_smem(lin8_tc_gemm_kernel<T, kR16>));
  if (T::template smem_bytes<kR16>(a.in / 32) > most) return cudaErrorInvalidValue;
  cudaError_t e = allow_smem(lin8_tc_gemm_kernel<T, kR16>, most, configured);
  if (e != cudaSuccess) return e;
  const int64_t cols = lin8_number_part_tiles(a, T::kBM), token_tiles = (a.rows + T::kBN - 1) / T::kBN;
  const dim3 grid(static_cast<unsigned>(token_tiles), static_cast<unsigned>(cols));
  return launch_pdl(lin8_tc_gemm_kernel<T, kR16>, grid, dim3(T::kThreads), T::template smem_bytes<kR16>(a.in / 32), s, a);
}

// The scaled path when the call brings enough scratch (Lin8Args::rows16): the input's f16 rows,
// then its token tiles, then the codes path's; otherwise the codes path alone.
template <class T>
cudaError_t launch_call(TcArgs a, const Lin8Args& l, cudaStream_t s) {
  const bool scaled = l.rows16 != nullptr && reinterpret_cast<uintptr_t>(l.rows16) % 16 == 0 &&
                      l.rows16_bytes >= lin8_rows16_bytes(l.m, l.w.in);
  if (scaled) {
    auto* base = static_cast<uint8_t*>(l.rows16);
    a.x16 = reinterpret_cast<const uint16_t*>(base);
    a.x16_info = reinterpret_cast<const int32_t*>(base + lin8_rows16_info_offset(l.m, l.w.in));
    ScaledRowsArgs r{l.x_codes, l.x_scales, l.m, l.w.in, reinterpret_cast<uint16_t*>(base),
                     reinterpret_cast<int32_t*>(base + lin8_rows16_info_offset(l.m, l.w.in))};
    // The whole-K form converts every finite row (rounding a wide row's smallest blocks), so that no
    // row's neighbours send its token tile to the codes path and its other numerics.
    r.round_wide = !l.block_fold;
    cudaError_t e = raw::scaled_rows(r, s);
    if (e != cudaSuccess) return e;
    e = launch_tile<T, true>(a, s);
    if (e != cudaSuccess) return e;
  }
  return launch_tile<T, false>(a, s);
}

// Time model (µs, H200, bench_gpu_linear --gemm): a launch, then waves of CTAs times the K stages,
// each stage of a wave taking the tile's stage_us: on the scaled path's whole-K form (what the
// engine's prefill passes take) 2.1-2.6 µs for the 128 x 128 tile, one CTA per SM, and 1.28-1.57
// µs for a wave of two 64 x 64 CTAs per SM over the real shapes at m = 2,048 (the short-K ones
// highest).
struct TileCost {
  int bm, bn, per_sm;
  double stage_us;
};
constexpr double kLaunchUs = 3.0;
constexpr TileCost kTileCosts[raw::kLin8TcTiles + 1] = {
    {0, 0, 0, 0.0}, {128, 128, 1, 2.2}, {64, 64, 2, 1.35}};
double tile_us(int tile, int64_t m, int64_t in, const int64_t* outs, int n_parts) {
  const TileCost& t = kTileCosts[tile];
  int64_t cols = 0;
  for (int p = 0; p < n_parts; ++p) cols += (outs[p] + t.bm - 1) / t.bm;
  const int64_t ctas = cols * ((m + t.bn - 1) / t.bn), slots = sm_count() * t.per_sm;
  const int64_t waves = (ctas + slots - 1) / slots, steps = (in / 32 + kStageBlocks - 1) / kStageBlocks;
  return kLaunchUs + static_cast<double>(waves * steps) * t.stage_us;
}

}  // namespace

namespace raw {

bool lin8_tc_gemm_supported(const Lin8GroupArgs& g) {
  if (g.count <= 0 || g.count > kMaxParts) return false;
  const Lin8Args& l = g.lin[0];
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (l.w.in <= 0 || l.w.in % 32 != 0 || !aligned(l.x_codes)) return false;
  if (BigTile::kBM / 32 * (l.w.in / 32) > kMaxWsBytes) return false;
  int64_t cols = 0;
  for (int p = 0; p < g.count; ++p) {
    if (!aligned(g.lin[p].w.codes) || g.lin[p].w.out <= 0) return false;
    cols += (g.lin[p].w.out + SmallTile::kBM - 1) / SmallTile::kBM;
  }
  return cols <= 65535 && (l.m + SmallTile::kBN - 1) / SmallTile::kBN <= INT32_MAX &&
         (tile_fits<BigTile>(l.w.in) || tile_fits<SmallTile>(l.w.in));
}

bool lin8_tc_gemm_tile_fits(int tile, int64_t in) {
  return tile == 1 ? tile_fits<BigTile>(in) : tile == 2 ? tile_fits<SmallTile>(in) : false;
}

double lin8_tc_gemm_us(const Lin8GroupArgs& g, int* tile) {
  const int n = g.count < kMaxParts ? g.count : kMaxParts;
  int64_t outs[kMaxParts] = {};
  for (int p = 0; p < n; ++p) outs[p] = g.lin[p].w.out;
  const int64_t m = g.lin[0].m, in = g.lin[0].w.in;
  int best = 0;
  double us = std::numeric_limits<double>::infinity();
  for (int t = 1; t <= kLin8TcTiles; ++t) {
    if (!lin8_tc_gemm_tile_fits(t, in)) continue;  // GB10: not the 128 x 128 tile
    const double u = tile_us(t, m, in, outs, n);
    if (u < us) best = t, us = u;
  }
  if (tile) *tile = best;
  return us;
}

cudaError_t lin8_tc_gemm(const Lin8GroupArgs& g, int tile, cudaStream_t s) {
  if (g.count <= 0 || g.lin[0].m <= 0) return cudaSuccess;
  TcArgs a;
  fill_lin8_parts(a, g, kMaxParts);
  a.block_fold = g.lin[0].block_fold;
  if (tile < 1 || tile > kLin8TcTiles) lin8_tc_gemm_us(g, &tile);
  if (!lin8_tc_gemm_tile_fits(tile, g.lin[0].w.in)) return cudaErrorInvalidValue;
  return tile == 1 ? launch_call<BigTile>(a, g.lin[0], s) : launch_call<SmallTile>(a, g.lin[0], s);
}

}  // namespace raw
}  // namespace dsv41::ops::gpu
