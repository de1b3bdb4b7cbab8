// Grouped tensor-core MoE (kernels/ops/moe_grouped.h): bucketing of the (token, slot) pairs by
// expert, the gate/up matmul with the SwiGLU epilogue, ActQuant8, the down matmul.
//
// Tiles. A CTA (4 or 8 warps) computes 32 weight rows a warp x BP pairs of one expert: for gate/up
// the features f0.. of w1 and the same ones of w3 (a warp holds 16 features of each, so g and u of
// one output meet in one thread), for down 32 features of w2 a warp. The MMA's M side is the
// weight rows and its N side the pairs (m16n8k16: a tile of 4 pairs costs one 8-wide step, not
// 16); a tile runs 1, 2, 4 or 8 such steps, whichever first covers its pairs. K advances 128 per stage (four 32-wide
// scale blocks) through a cp.async pipeline. BP is 64, 32 or 16 (TileShape): narrower tiles stage
// only what a small pass has per expert and fit more CTAs per SM; the launcher takes the shape
// that measured fastest (moe_grouped_auto_variant). With few pairs the kernel is bound by the integer
// pipe (widening, scale decoding, addresses), not by the tensor cores or DRAM: the code keeps
// those instructions few and moves what it can to the FMA pipe.
//
// Exact widening. e4m3 activation codes become fp16 with cvt (every e4m3 value is an fp16 value);
// e2m1 weight codes become fp16 through a byte table (prmt): the fp16 encodings of 0, .5, 1, 1.5,
// 2, 3, 4, 6 have zero low bytes, so a table of their high bytes plus the sign bit builds them.
// Products of two such values are exact in the tensor core; per 32-block two chained m16n8k16 steps
// sum them from zero, then acc = fma(d·x_scale, w_scale, acc) — with power-of-two scales the
// product is exact, so this is the reference's acc + (part·x_scale)·w_scale, block by block in K
// order. K within a block is permuted (thread tig owns K 8tig..8tig+7 of both operands), which only
// the tensor core's own summation order can see. The weight scale of a block is its E8M0 byte moved
// into the fp32 exponent field while every scale byte the warp reads in a stage is 1..254 (one
// vote per stage); otherwise the stage decodes them with e8m0_value (0 -> 2^-127, 255 -> NaN): the
// same values either way. The tile shape changes no arithmetic: every output element is the same
// sequence of operations on the same inputs whatever the tiling.
//
// Scaled path (MoeGroupedArgs::rows16). Each projection's input first becomes f16 rows that carry
// their block scales (ops/scaled_rows.h); the tiles whose rows all converted read those rows as the
// B operand (no cvt, no activation-scale loads), the others keep the codes above, in a second
// launch over the same grid. With block_fold a block is folded with one fma (the codes path's
// bits); by default every row converts (round_wide) and a warp whose weight rows allow it sums the
// whole K in the MMA accumulators, the weights' block scales moved into their f16 values through
// the e2m1 table (the whole-K form below): no fold, no scale decoding in the loop
// (docs/ARCHITECTURE.md, Numerics).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "ops/cp_async.cuh"
#include "ops/moe_grouped.h"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"
#include "ops/scaled_rows.h"
#include "ops/tc_block.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kBK = static_cast<int>(kMoeGroupedKStep);  // K per stage
constexpr int kKB = kBK / 32;                            // scale blocks per stage
// Row strides of the staged tiles, padded so the warp's fragment loads hit distinct banks.
constexpr int kAStride = kBK / 2 + 16;
constexpr int kBStride = kBK + 32;
constexpr int kB16Stride = 2 * kBK;  // f16 rows, unpadded (chunks swizzled: tc::f16_row_chunk)

// Tile shapes: BP pairs per tile (the N side), S pipeline stages (S16 on the scaled path, whose B
// stage is twice the bytes), MinBlocks CTAs per SM (the register cap of __launch_bounds__), Warps
// warps per CTA, 32 weight rows each (the M side: kRowsA). Narrow tiles stage only the pairs a small
// pass has per expert, so more CTAs (more warps to hide the widening's and the loads' latency) fit
// on an SM. A warp widens each of its weights once per tile and feeds it to BP/8 MMAs, so wide tiles
// spend fewer instructions per MMA; eight warps keep 16 of them on an SM where four-warp 64-pair
// tiles keep 8.
template <int BP, int S, int MinBlocks, int S16, int Warps = 4>
struct TileShape {
  static constexpr int kBP = BP, kStages = S, kMinBlocks = MinBlocks, kStages16 = S16;
  static constexpr int kThreads = 32 * Warps;
  static constexpr int kRowsA = 32 * Warps;  // weight rows per tile (M)
  static constexpr int kABytes = kRowsA * kAStride;
  static constexpr int kBBytes = BP * kBStride;
  static constexpr int kAsBytes = kRowsA * kKB;  // E8M0 weight scales
  static constexpr int kBsBytes = BP * kKB * 4;  // fp32 activation scales
  static constexpr int kStageBytes = kABytes + kBBytes + kAsBytes + kBsBytes;
  // Each thread copies four 16-byte parts of the A stage (kBK / 2 bytes a row).
  static_assert(kThreads * 4 == kRowsA * (kBK / 2) / 16);
  static_assert(BP % 16 == 0 && BP <= kThreads / 2 && kABytes % 16 == 0 && kBBytes % 16 == 0 && kAsBytes % 16 == 0 &&
                kStageBytes % 16 == 0);
};
// Shared memory, codes path / scaled path:
using Wide = TileShape<64, 4, 2, 3>;         // 86 / 80 KiB: 2 CTAs per SM
using Mid = TileShape<32, 4, 3, 3>;          // 64 / 56 KiB: 3 CTAs per SM
using Narrow = TileShape<16, 4, 4, 4>;       // 53 / 58 KiB: 4 / 3 CTAs per SM
using Narrow3 = TileShape<16, 3, 5, 3>;      // 40 / 43 KiB: 5 CTAs per SM
// 64 / 74 KiB, 8 warps, 2 CTAs per SM (16 warps, 128 registers each). Two stages: with three
// (96 / 111 KiB) it was 13 % slower at 2,048 tokens and 10 % at 8,192 on the H200, and does not fit
// GB10's 99 KiB a block.
using Wide8 = TileShape<64, 2, 2, 2, 8>;

// One pipeline stage in shared memory: A (FP4 weight rows), B (activation codes, or on the scaled
// path the pairs' f16 rows: twice the bytes), the weight scales and, on the codes path only, the
// activation scales.
template <class Sh, bool kR16>
struct StageLayout {
  static constexpr int kStages = kR16 ? Sh::kStages16 : Sh::kStages;
  static constexpr int kBRow = kR16 ? kB16Stride : kBStride;
  static constexpr int kB = Sh::kABytes, kAs = kB + Sh::kBP * kBRow, kBs = kAs + Sh::kAsBytes;
  static constexpr int kBytes = kBs + (kR16 ? 0 : Sh::kBsBytes);
  static constexpr int kPairs = kStages * kBytes;  // the tile's pair ids follow the stages
  static constexpr int kSmem = kPairs + Sh::kBP * 4;
  static_assert(kB % 16 == 0 && kAs % 16 == 0 && kBs % 16 == 0 && kBytes % 16 == 0);
};

// The scaled path's row exponents (MoeGroupedArgs::rows16, ops/scaled_rows.h): per token row of x,
// then per pair row of the SwiGLU output.
__host__ __device__ inline int32_t* rows16_info(const MoeGroupedArgs& a, bool gate_up) {
  auto* base = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(a.rows16) +
                                          moe_grouped_rows16_info_offset(a.n, a.top_k, a.w1.in, a.w1.out));
  return gate_up ? base : base + a.n;
}

constexpr int kBucketThreads = 1024;  // one bucketing block; also the most experts a bank may have

struct SortView {
  int32_t* offs;         // [E+1] first sorted row of each expert
  int32_t* n_tiles;      // [1]
  int32_t* tile_expert;  // [T]
  int32_t* tile_start;   // [T] first sorted row of the tile
  int32_t* perm;         // [pairs] pair ids grouped by expert
};

// ---- bucketing: counting sort of the pairs by expert, and the tile list ----
__global__ void __launch_bounds__(kBucketThreads) moe_bucket_kernel(const int32_t* ids, int pairs, int n_experts,
                                                                     int tile_pairs, SortView v) {
  dev::pdl_enter();
  __shared__ int count[kBucketThreads];
  __shared__ int cursor[kBucketThreads];
  __shared__ unsigned long long warp_total[32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  count[t] = 0;
  __syncthreads();
  for (int p = t; p < pairs; p += kBucketThreads) {
    const int e = ids[p];
    if (e >= 0 && e < n_experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // Exclusive scan over experts of (rows << 32 | tiles): thread t owns expert t.
  const int c = count[t];
  const int nt = (c + tile_pairs - 1) / tile_pairs;
  const unsigned long long mine = (static_cast<unsigned long long>(c) << 32) | static_cast<unsigned>(nt);
  unsigned long long incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long u = __shfl_up_sync(dev::kFull, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = warp_total[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long u = __shfl_up_sync(dev::kFull, w, o);
      if (lane >= o) w += u;
    }
    warp_total[lane] = w;
  }
  __syncthreads();
  const unsigned long long before = incl - mine + (warp > 0 ? warp_total[warp - 1] : 0ull);
  const int row0 = static_cast<int>(before >> 32), tile0 = static_cast<int>(before & 0xffffffffull);
  if (t < n_experts) {
    v.offs[t] = row0;
    cursor[t] = row0;
    for (int j = 0; j < nt; ++j) {
      v.tile_expert[tile0 + j] = t;
      v.tile_start[tile0 + j] = row0 + j * tile_pairs;
    }
  }
  if (t == kBucketThreads - 1) {
    const unsigned long long total = warp_total[31];
    v.offs[n_experts] = static_cast<int>(total >> 32);
    *v.n_tiles = static_cast<int>(total & 0xffffffffull);
  }
  __syncthreads();
  // The order of pairs inside an expert's rows is whatever the atomics give: every output element
  // depends only on its own pair's row, so results do not depend on it.
  for (int p = t; p < pairs; p += kBucketThreads) {
    const int e = ids[p];
    if (e >= 0 && e < n_experts) v.perm[atomicAdd(&cursor[e], 1)] = p;
  }
}

// ---- staging ----
// Copies (ops/cp_async.cuh) are ordered by the pipeline's stage barriers alone. Weight rows are read
// 64 bytes per stage: their L2 prefetch hint fetches 256 contiguous bytes (four stages of the row) at
// once, so DRAM sees whole lines instead of scattered 64-byte pieces; a weight copy that is not
// valid zero-fills and reads nothing.
constexpr dev::CpOrder kCpOrder = dev::CpOrder::Free;

// ---- exact widening and the block dot: ops/tc_block.cuh ----
// The kernel is bound by the integer (ALU) pipe: the widening, the scale decoding and the staging
// addresses; the multiply-adds that move work to the FMA pipe are written as mad.lo PTX.

// Staged row (0..kRowsA-1) of warp `warp`'s m-tile mt, half h (rows g / g+8): for gate/up, w1's
// rows are the tile's first half and w3's the second.
template <bool kGateUp, int kRowsA>
__device__ __forceinline__ int tile_row(int warp, int mt, int g, int h) {
  return kGateUp ? mt * (kRowsA / 2) + warp * 16 + g + 8 * h : warp * 32 + mt * 16 + g + 8 * h;
}

// E8M0 byte k (0..3) of w as an fp32 power of two, for bytes other than 0 (2^-127, a subnormal)
// and 255 (NaN): the byte alone (prmt), moved into the exponent field by a multiply (FMA pipe).
template <int k>
__device__ __forceinline__ float e8m0_normal_byte(uint32_t w) {
  const uint32_t b = __byte_perm(w, 0u, 0x4440u | k);
  uint32_t bits;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(bits) : "r"(b), "r"(1u << 23), "r"(0u));
  return __uint_as_float(bits);
}

// Nonzero when a byte of w is 0x00 or 0xFF (the two E8M0 codes e8m0_normal_byte gets wrong).
__device__ __forceinline__ uint32_t e8m0_special_bytes(uint32_t w) {
  return (((w - 0x01010101u) & ~w) | ((~w - 0x01010101u) & w)) & 0x80808080u;
}

// One tile with NQ 8-pair steps (NQ*8 >= the tile's pairs; straight-line code, no per-step
// branches, so the warp's independent MMA chains interleave). Columns past `rows` hold whatever
// the staging buffers held: each output column depends only on its own inputs, and those columns
// are never stored.
//
// kR16 (the scaled path): B is the pairs' f16 rows (x_scale · 2^c already in every value, c one
// power of two per row, ops/scaled_rows.h), so a block's tensor-core sum is d·x_scale·2^c exactly
// and its fold one fma with w_scale; the epilogue divides the accumulator by 2^c. Every rounding
// is the codes path's scaled by 2^c, so the bits are the same (outside fp32's subnormal range).
template <bool kGateUp, class Sh, int NQ, bool kR16>
__device__ __forceinline__ void gemm_tile(const MoeGroupedArgs& a, uint8_t* smem, const int32_t* s_pair, int e,
                                          int rows) {
  using L = StageLayout<Sh, kR16>;
  constexpr int kBP = Sh::kBP, kStages = L::kStages, kStageBytes = L::kBytes;
  constexpr int kThreads = Sh::kThreads, kRowsA = Sh::kRowsA;
  static_assert(NQ * 8 <= kBP);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const Fp4Weight& wa = kGateUp ? a.w1 : a.w2;
  const int64_t in = wa.in, out = wa.out, nb = in / 32;
  const int n_steps = static_cast<int>(in / kBK);
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * (kGateUp ? kRowsA / 2 : kRowsA);
  const uint8_t* xc = kGateUp ? a.x_codes : a.act_codes;
  const float* xsc = kGateUp ? a.x_scales : a.act_scales;
  const uint16_t* x16 = static_cast<const uint16_t*>(a.rows16);
  const int64_t div = kGateUp ? a.top_k : 1;

  // Copy sources of this thread: weight rows (tid>>2)+(kThreads/4)i (16-byte part tid&3), activation
  // rows tid/kParts + kRowsPerPass·i, the weight scales of row tid, the activation scales of pair tid.
  auto weight_row = [&](int row, const uint8_t*& packed, const uint8_t*& scales, bool& ok) {
    const Fp4Weight& w = kGateUp && row >= kRowsA / 2 ? a.w3 : wa;
    const int64_t f = f0 + (kGateUp ? row % (kRowsA / 2) : row);
    ok = f < out;
    const int64_t r = static_cast<int64_t>(e) * out + (ok ? f : 0);
    packed = w.packed + r * (in / 2);
    scales = w.scales + r * nb;
  };
  const uint8_t* a_src[4];
  bool a_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* sc;
    weight_row((tid >> 2) + (kThreads / 4) * i, a_src[i], sc, a_ok[i]);
    a_src[i] += (tid & 3) * 16;
  }
  const uint8_t* as_src;
  bool as_ok;
  {
    const uint8_t* pk;
    weight_row(tid, pk, as_src, as_ok);
  }
  // A stage row of codes is 8 16-byte parts, of f16 values 16: kRowsPerPass rows per pass of the CTA.
  constexpr int kParts = kR16 ? 16 : 8, kRowsPerPass = kThreads / kParts;
  constexpr int kBLoads = kBP / kRowsPerPass;
  static_assert(kBLoads >= 1 && kBP % kRowsPerPass == 0);
  // Sources as 16-byte-chunk offsets from the row data (32 bits: registers are what limits the CTAs
  // per SM; gpu::moe_grouped keeps rows x k below 2^34, so offsets below 2^31), -1 for rows past the
  // tile's.
  const void* b_rows = kR16 ? static_cast<const void*>(x16) : static_cast<const void*>(xc);
  const uint4* b_base = static_cast<const uint4*>(b_rows);
  uint32_t b_src[kBLoads];
#pragma unroll
  for (int i = 0; i < kBLoads; ++i) {
    const int j = tid / kParts + kRowsPerPass * i;
    const int64_t r = s_pair[j] / div;
    b_src[i] = j < rows ? static_cast<uint32_t>((r * in * (kR16 ? 2 : 1)) / 16 + tid % kParts) : 0xFFFFFFFFu;
  }
  const bool bs_ok = tid < rows;
  const float* bs_src = xsc + (s_pair[tid < kBP ? tid : 0] / div) * nb;

  auto load_stage = [&](int step, int buf) {
    uint8_t* sA = smem + buf * kStageBytes;
    uint8_t* sB = sA + L::kB;
    uint8_t* sAs = sA + L::kAs;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      dev::cp_async16_if<kCpOrder, dev::CpL2::B256>(sA + ((tid >> 2) + (kThreads / 4) * i) * kAStride + (tid & 3) * 16,
                                                    a_src[i] + step * (kBK / 2), a_ok[i]);
#pragma unroll
    for (int i = 0; i < kBLoads; ++i)
      if (b_src[i] != 0xFFFFFFFFu)
        dev::cp_async16<kCpOrder, dev::CpL2::B128>(
            sB + (tid / kParts + kRowsPerPass * i) * L::kBRow +
                (kR16 ? tc::f16_row_chunk(tid / kParts, tid % kParts) : tid % kParts) * 16,
            b_base + b_src[i] + step * (kBK * (kR16 ? 2 : 1) / 16));
    dev::cp_async4_if<kCpOrder>(sAs + tid * kKB, as_src + step * kKB, as_ok);
    if constexpr (!kR16)
      if (bs_ok) dev::cp_async16<kCpOrder, dev::CpL2::B128>(sA + L::kBs + tid * kKB * 4, bs_src + step * kKB);
  };

  float acc[2][NQ][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  // One staged K step. kNormalScales: every weight-scale byte of the warp's rows in this step is
  // 1..254, so each block's scale is its byte in the exponent field (two integer ops instead of
  // e8m0_value's selects); the value, and so every product and sum, is the same either way.
  auto compute_stage = [&](const uint8_t* sA, const uint8_t* sB, const float* sBs, const uint32_t (&wsb)[2][2],
                           auto normal_scales) {
    constexpr bool kNormalScales = decltype(normal_scales)::value;
    // Few pair steps: the four blocks unrolled for independent work; eight: one block at a time
    // (16 independent MMA chains already, and the registers for them).
#pragma unroll(NQ >= 8 ? 1 : kKB)
    for (int kb = 0; kb < kKB; ++kb) {
      // A fragments of both k16 steps (the arrangement of ops/tc_block.cuh).
      tc::BlockA af[2];
      float ws[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int ra = tile_row<kGateUp, kRowsA>(warp, mt, g, 0), rb = tile_row<kGateUp, kRowsA>(warp, mt, g, 1);
        const uint32_t w0 = *reinterpret_cast<const uint32_t*>(sA + ra * kAStride + kb * 16 + tig * 4);
        const uint32_t w1 = *reinterpret_cast<const uint32_t*>(sA + rb * kAStride + kb * 16 + tig * 4);
        af[mt] = tc::block_a_fp4(w0, w1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (kNormalScales) {
            const uint32_t w = wsb[mt][h];
            ws[mt][h] = kb == 0   ? e8m0_normal_byte<0>(w)
                        : kb == 1 ? e8m0_normal_byte<1>(w)
                        : kb == 2 ? e8m0_normal_byte<2>(w)
                                  : e8m0_normal_byte<3>(w);
          } else {
            ws[mt][h] = dev::e8m0_value(static_cast<uint8_t>(wsb[mt][h] >> (8 * kb)));
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt) {
        if constexpr (kR16) {
          const uint4 bv =
              *reinterpret_cast<const uint4*>(sB + (nt * 8 + g) * kB16Stride + tc::f16_row_chunk(g, kb * 4 + tig) * 16);
          const tc::BlockB bf = tc::block_b_f16(bv);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float d[4];
            tc::block_dot(d, af[mt], bf);
            acc[mt][nt][0] = tc::fold_block_scaled(acc[mt][nt][0], d[0], ws[mt][0]);
            acc[mt][nt][1] = tc::fold_block_scaled(acc[mt][nt][1], d[1], ws[mt][0]);
            acc[mt][nt][2] = tc::fold_block_scaled(acc[mt][nt][2], d[2], ws[mt][1]);
            acc[mt][nt][3] = tc::fold_block_scaled(acc[mt][nt][3], d[3], ws[mt][1]);
          }
        } else {
          const uint2 bv = *reinterpret_cast<const uint2*>(sB + (nt * 8 + g) * kBStride + kb * 32 + tig * 8);
          const tc::BlockB bf = tc::block_b(bv);
          const float xs0 = sBs[(nt * 8 + 2 * tig) * kKB + kb], xs1 = sBs[(nt * 8 + 2 * tig + 1) * kKB + kb];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float d[4];
            tc::block_dot(d, af[mt], bf);
            acc[mt][nt][0] = tc::fold_block(acc[mt][nt][0], d[0], xs0, ws[mt][0]);
            acc[mt][nt][1] = tc::fold_block(acc[mt][nt][1], d[1], xs1, ws[mt][0]);
            acc[mt][nt][2] = tc::fold_block(acc[mt][nt][2], d[2], xs0, ws[mt][1]);
            acc[mt][nt][3] = tc::fold_block(acc[mt][nt][3], d[3], xs1, ws[mt][1]);
          }
        }
      }
    }
  };

  // The scaled path's whole-K form (MoeGroupedArgs::block_fold off): the weights enter the tensor
  // core as code · 2^(s_b - s_ref) in f16 (s_b a block's E8M0 byte, s_ref one per row: the e2m1
  // table of the row moved by the difference, tc::kE2m1F16NegLoM13), so the products carry their
  // block's weight scale relative to the row's and the MMAs accumulate the whole K in their fp32
  // accumulators: no per-block fold. The epilogue multiplies by 2^(s_ref - 127). A warp takes it
  // when every one of its 32 rows has scale bytes 1..254 within 2^26 of each other over the whole K
  // (then s_ref = min(smallest + 13, 254) puts every difference in [-13, 13], where the widened
  // values stay f16 normals); otherwise the per-block fold below. The choice depends on the weights
  // alone, never on the pairs.
  const int check_row = tile_row<kGateUp, kRowsA>(warp, (lane >> 4) & 1, lane & 7, (lane >> 3) & 1);
  bool whole_k = false;
  // (s_ref - 13) in every byte, per row (mt, h): a stage's scale word minus it holds each block's
  // table step t = s_b - s_ref + 13 in [0, 26] byte by byte (no borrows).
  uint32_t t_base[2][2] = {{0x72727272u, 0x72727272u}, {0x72727272u, 0x72727272u}};
  if constexpr (kR16) {
    if (!a.block_fold) {
      const uint8_t* srow;
      bool rok;
      {
        const uint8_t* pk;
        weight_row(check_row, pk, srow, rok);
      }
      uint32_t vmin = 0xFFFFFFFFu, vmax = 0u, special = 0u;
      if (rok)
        for (int64_t i = 0; i < nb / 4; ++i) {
          const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(srow) + i);
          vmin = __vminu4(vmin, w);
          vmax = __vmaxu4(vmax, w);
          special |= e8m0_special_bytes(w);
        }
      const int mn = min(min(vmin & 0xFF, (vmin >> 8) & 0xFF), min((vmin >> 16) & 0xFF, vmin >> 24));
      const int mx = max(max(vmax & 0xFF, (vmax >> 8) & 0xFF), max((vmax >> 16) & 0xFF, vmax >> 24));
      const bool ok = !rok || (special == 0u && mx - mn <= 26);
      const int mine = rok ? min(mn + 13, 254) : 127;
      whole_k = __all_sync(dev::kFull, ok);
      // Row (mt, g, h) is lane mt·16 + h·8 + g's check_row.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          t_base[mt][h] = static_cast<uint32_t>(__shfl_sync(dev::kFull, mine, mt * 16 + h * 8 + g) - 13) * 0x01010101u;
    }
  }
  auto compute_stage_whole_k = [&](const uint8_t* sA, const uint8_t* sB, const uint32_t (&wsb)[2][2]) {
    uint32_t steps[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) steps[mt][h] = wsb[mt][h] - t_base[mt][h];
#pragma unroll(NQ >= 8 ? 1 : kKB)
    for (int kb = 0; kb < kKB; ++kb) {
      tc::BlockA af[2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int ra = tile_row<kGateUp, kRowsA>(warp, mt, g, 0), rb = tile_row<kGateUp, kRowsA>(warp, mt, g, 1);
        const uint32_t w0 = *reinterpret_cast<const uint32_t*>(sA + ra * kAStride + kb * 16 + tig * 4);
        const uint32_t w1 = *reinterpret_cast<const uint32_t*>(sA + rb * kAStride + kb * 16 + tig * 4);
        tc::E2m1Table t[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // The table of 2^(t - 13) = 2^(s_b - s_ref): t steps up from the table at 2^-13.
          const uint32_t tb = __byte_perm(steps[mt][h], 0u, 0x4440u | static_cast<uint32_t>(kb));
          uint32_t lo, hi;
          asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(lo) : "r"(tb), "r"(tc::kE2m1TableStepLo), "r"(tc::kE2m1F16NegLoM13));
          asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(hi) : "r"(tb), "r"(tc::kE2m1TableStepHi), "r"(tc::kE2m1F16NegHiM13));
          t[h] = {lo, hi};
        }
        af[mt] = tc::block_a_fp4(w0, w1, t[0], t[1]);
      }
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt) {
        const uint4 bv =
            *reinterpret_cast<const uint4*>(sB + (nt * 8 + g) * kB16Stride + tc::f16_row_chunk(g, kb * 4 + tig) * 16);
        const tc::BlockB bf = tc::block_b_f16(bv);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          tc::mma_f16(acc[mt][nt], af[mt].r[0], bf.r[0][0], bf.r[0][1]);
          tc::mma_f16(acc[mt][nt], af[mt].r[1], bf.r[1][0], bf.r[1][1]);
        }
      }
    }
  };

  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_steps) load_stage(st, st);
    dev::cp_async_commit<kCpOrder>();
  }
  for (int step = 0; step < n_steps; ++step) {
    dev::cp_async_wait<kStages - 2, kCpOrder>();
    __syncthreads();  // stage `step` visible to all; the buffer refilled below is no longer read
    {
      const int next = step + kStages - 1;
      if (next < n_steps) load_stage(next, next % kStages);
      dev::cp_async_commit<kCpOrder>();
    }
    const int buf = step % kStages;
    const uint8_t* sA = smem + buf * kStageBytes;
    const uint8_t* sB = sA + L::kB;
    const uint8_t* sAs = sA + L::kAs;
    const float* sBs = reinterpret_cast<const float*>(sA + L::kBs);  // codes path only
    uint32_t wsb[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wsb[mt][h] = *reinterpret_cast<const uint32_t*>(sAs + tile_row<kGateUp, kRowsA>(warp, mt, g, h) * kKB);
    if (kR16 && whole_k) {
      compute_stage_whole_k(sA, sB, wsb);
      continue;
    }
    // Each lane checks one of the warp's 32 rows (the quads hold the same rows).
    const uint32_t lane_scales = *reinterpret_cast<const uint32_t*>(sAs + check_row * kKB);
    if (__any_sync(dev::kFull, e8m0_special_bytes(lane_scales) != 0))
      compute_stage(sA, sB, sBs, wsb, std::false_type{});
    else
      compute_stage(sA, sB, sBs, wsb, std::true_type{});
  }
  dev::cp_async_wait<0, kCpOrder>();

  // Epilogue: pair column nt*8 + 2tig + c, feature row g / g+8 of each m-tile.
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = nt * 8 + 2 * tig + c;
      if (col >= rows) continue;
      const int64_t p = s_pair[col];
      if constexpr (kR16) {
        // Back from the row's 2^c (a power of two, 0 <= c <= 100), and in the whole-K form times
        // the weight row's 2^(s_ref - 127): one power of two 2^e, e in [-226, 127], applied in at
        // most two exact steps.
        const int cpow = rows16_info(a, kGateUp)[p / div];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            acc[mt][nt][2 * h + c] = dev::times_pow2(
                acc[mt][nt][2 * h + c], (whole_k ? static_cast<int>(t_base[mt][h] & 0xFFu) + 13 - 127 : 0) - cpow);
      }
      if constexpr (kGateUp) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t f = f0 + warp * 16 + g + 8 * h;
          if (f >= out) continue;
          // The clamped SwiGLU with the routing weight, as swiglu_kernel (moe.cu) computes it from
          // the bf16-rounded projections.
          float gv = dev::bf16_round(acc[0][nt][2 * h + c]), uv = dev::bf16_round(acc[1][nt][2 * h + c]);
          if (a.swiglu_limit > 0.0f) {
            uv = dev::clampf(uv, -a.swiglu_limit, a.swiglu_limit);
            gv = fminf(gv, a.swiglu_limit);
          }
          float act = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, dev::exp_ref(-gv))), uv);
          act = __fmul_rn(a.route_w[p], act);
          a.act[p * out + f] = dev::bf16_round(act);
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t f = f0 + warp * 32 + mt * 16 + g + 8 * h;
            if (f < out) a.y[p * out + f] = dev::bf16_round(acc[mt][nt][2 * h + c]);
          }
      }
    }
  }
}

// gate/up (kGateUp): rows 0..63 = w1 features f0.., rows 64..127 = w3 features f0..; output the
// SwiGLU row into a.act. down: rows = w2 features f0..f0+127; output bf16 rows into a.y.
// grid.x: feature tiles; grid.y: expert tiles (past *n_tiles: nothing to do). The tile's 8-pair
// steps are rounded up to 1, 2, 4 or 8 (compile-time loop bounds), at most Sh::kBP / 8.
// With a.rows16 a projection is two launches over the same tiles: the scaled path (kR16) takes the
// tiles whose rows all have an f16 form, the codes path the others; without it only the codes path.
template <bool kGateUp, class Sh, bool kR16>
__global__ void __launch_bounds__(Sh::kThreads, Sh::kMinBlocks) moe_gemm_kernel(const MoeGroupedArgs a, const SortView v) {
  constexpr int kBP = Sh::kBP;
  dev::pdl_enter();
  extern __shared__ __align__(16) uint8_t smem[];
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *v.n_tiles) return;
  const int e = v.tile_expert[tile], r0 = v.tile_start[tile];
  const int rows = min(kBP, v.offs[e + 1] - r0);
  int32_t* s_pair = reinterpret_cast<int32_t*>(smem + StageLayout<Sh, kR16>::kPairs);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kBP) s_pair[tid] = tid < rows ? v.perm[r0 + tid] : 0;
  __syncthreads();
  if (a.rows16 != nullptr) {
    const int32_t* info = rows16_info(a, kGateUp);
    const bool scaled = tid >= rows || info[s_pair[tid] / (kGateUp ? a.top_k : 1)] != kScaledRowUnscaled;
    if ((__syncthreads_and(scaled) != 0) != kR16) return;
  } else if constexpr (kR16) {
    return;
  }
  if (rows <= 8) {
    gemm_tile<kGateUp, Sh, 1, kR16>(a, smem, s_pair, e, rows);
  } else if (kBP == 16 || rows <= 16) {
    gemm_tile<kGateUp, Sh, 2, kR16>(a, smem, s_pair, e, rows);
  } else if constexpr (kBP >= 32) {
    if (kBP == 32 || rows <= 32) gemm_tile<kGateUp, Sh, 4, kR16>(a, smem, s_pair, e, rows);
    else if constexpr (kBP >= 64) gemm_tile<kGateUp, Sh, 8, kR16>(a, smem, s_pair, e, rows);
  }
}

// Rows of pairs without a bank expert are zero (the combine adds them; TP ranks all-reduce them).
__global__ void zero_skipped_rows_kernel(const int32_t* ids, int64_t pairs, int n_experts, float* y, int64_t dim) {
  dev::pdl_enter();
  for (int64_t p = blockIdx.x; p < pairs; p += gridDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < n_experts) continue;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[p * dim + i] = 0.0f;
  }
}

// One projection's launches with tile shape Sh: with a.rows16, the f16 rows of its input first,
// then the scaled path and the codes path over the same grid (each takes its own tiles).
template <bool kGateUp, class Sh>
cudaError_t moe_projection(const MoeGroupedArgs& a, const SortView& v, dim3 grid, cudaStream_t s) {
  if (a.rows16 != nullptr) {
    const int64_t rows = kGateUp ? a.n : a.n * a.top_k, k = kGateUp ? a.w1.in : a.w1.out;
    ScaledRowsArgs r{kGateUp ? a.x_codes : a.act_codes, kGateUp ? a.x_scales : a.act_scales, rows, k,
                     static_cast<uint16_t*>(a.rows16), rows16_info(a, kGateUp)};
    r.round_wide = !a.block_fold;
    cudaError_t err = raw::scaled_rows(r, s);
    if (err != cudaSuccess) return err;
    err = allow_dynamic_smem<moe_gemm_kernel<kGateUp, Sh, true>>(StageLayout<Sh, true>::kSmem);
    if (err != cudaSuccess) return err;
    launch_pdl(moe_gemm_kernel<kGateUp, Sh, true>, grid, Sh::kThreads, StageLayout<Sh, true>::kSmem, s, a, v);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  cudaError_t err = allow_dynamic_smem<moe_gemm_kernel<kGateUp, Sh, false>>(StageLayout<Sh, false>::kSmem);
  if (err != cudaSuccess) return err;
  launch_pdl(moe_gemm_kernel<kGateUp, Sh, false>, grid, Sh::kThreads, StageLayout<Sh, false>::kSmem, s, a, v);
  return cudaGetLastError();
}

// The two tiled matmuls and ActQuant8 between them, with tile shape Sh.
template <class Sh>
cudaError_t moe_gemms(const MoeGroupedArgs& a, const SortView& v, int64_t T, cudaStream_t s) {
  const int64_t pairs = a.n * a.top_k, dim = a.w1.in, inter = a.w1.out;
  constexpr int kRowsA = Sh::kRowsA;
  const dim3 grid_gu(static_cast<unsigned>((inter + kRowsA / 2 - 1) / (kRowsA / 2)), static_cast<unsigned>(T));
  cudaError_t err = moe_projection<true, Sh>(a, v, grid_gu, s);
  if (err != cudaSuccess) return err;

  ActQuantArgs q;
  q.x = a.act;
  q.rows = pairs;
  q.k = inter;
  q.x_stride = inter;
  q.codes = a.act_codes;
  q.scales = a.act_scales;
  err = raw::act_quant8(q, s);
  if (err != cudaSuccess) return err;

  const dim3 grid_down(static_cast<unsigned>((dim + kRowsA - 1) / kRowsA), static_cast<unsigned>(T));
  return moe_projection<false, Sh>(a, v, grid_down, s);
}

}  // namespace

// H200, bench_gpu_moe_grouped at 384 experts, ms for all three projections on the scaled path
// (64 / 32 / 16-pair tiles): 64 tokens 2.03 / 1.72 / 1.63, 128 tokens 2.78 / 2.34 / 2.23, 256 tokens
// 3.19 / 2.68 / 2.57, 512 tokens 3.49 / 2.93 / 2.85, 1024 tokens 4.19 / 3.70 / 4.26, 2048 tokens
// 6.65 / 5.70 / 7.45, 8192 tokens 19.8 / 18.6 / 26.1. Up to 8 pairs an expert 16-pair tiles lead
// (a tile's weights are read once either way, and four CTAs fit an SM); from 16, 32-pair tiles (16-
// pair tiles split an expert's pairs into tiles that each read its weights again; 64-pair tiles hold
// fewer CTAs per SM). The eight-warp 64-pair tile (whole-K sums, 2026-12-02; 32-pair / eight-warp
// 64-pair, ms): 256 tokens 2.83 (16-pair) / 3.04, 1024 tokens 3.90 / 3.86, 2048 tokens 6.05 / 5.46,
// 8192 tokens 19.3 / 14.8: it leads from 16 pairs an expert. The others stay for tests and the bench.
int moe_grouped_auto_variant(int64_t pairs, int64_t n_experts) { return pairs <= 8 * n_experts ? 3 : 5; }

namespace {
// Whether both projections' kernels of shape Sh, on both paths, fit the device's shared memory.
template <class Sh>
bool wide8_fits() {
  return smem_fits(moe_gemm_kernel<true, Sh, true>, StageLayout<Sh, true>::kSmem) &&
         smem_fits(moe_gemm_kernel<false, Sh, true>, StageLayout<Sh, true>::kSmem) &&
         smem_fits(moe_gemm_kernel<true, Sh, false>, StageLayout<Sh, false>::kSmem) &&
         smem_fits(moe_gemm_kernel<false, Sh, false>, StageLayout<Sh, false>::kSmem);
}
}  // namespace

namespace raw {
cudaError_t moe_grouped(const MoeGroupedArgs& a, cudaStream_t s) {
  const int64_t pairs = a.n * a.top_k;
  if (pairs == 0) return cudaSuccess;
  const int E = static_cast<int>(a.w1.n_experts);
  const int64_t dim = a.w1.in;
  // The forced or automatic shape; one whose tile list does not fit the scratch or the grid gives
  // way to a wider one (gpu::moe_grouped checks that the narrowest tiles' list fits, so this only
  // guards callers of the raw launcher).
  int variant = a.tile_variant >= 1 && a.tile_variant <= kMoeGroupedVariants ? a.tile_variant
                                                                              : moe_grouped_auto_variant(pairs, E);
  // The eight-warp shape where it fits the device's shared memory per block; the four-warp
  // 64-pair shape otherwise.
  if (variant == 5 && !wide8_fits<Wide8>()) variant = 1;
  auto fits = [&](int v) {
    const int64_t tp = moe_grouped_variant_tile_pairs(v);
    return moe_grouped_sort_ints(pairs, E, tp) <= a.sort_ints && moe_grouped_max_tiles(pairs, E, tp) <= 65535;
  };
  // A narrower shape whose tile list does not fit gives way to the next wider one (64-pair shapes
  // are the widest).
  while (moe_grouped_variant_tile_pairs(variant) < 64 && !fits(variant)) variant = variant == 4 ? 2 : variant - 1;
  const int64_t tp = moe_grouped_variant_tile_pairs(variant);
  const int64_t T = moe_grouped_max_tiles(pairs, E, tp);
  SortView v;
  v.offs = a.sort;
  v.n_tiles = a.sort + E + 1;
  v.tile_expert = v.n_tiles + 1;
  v.tile_start = v.tile_expert + T;
  v.perm = v.tile_start + T;
  launch_pdl(moe_bucket_kernel, 1, kBucketThreads, 0, s, a.expert_ids, static_cast<int>(pairs), E, static_cast<int>(tp), v);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  switch (variant) {
    case 1: err = moe_gemms<Wide>(a, v, T, s); break;
    case 2: err = moe_gemms<Mid>(a, v, T, s); break;
    case 3: err = moe_gemms<Narrow>(a, v, T, s); break;
    case 4: err = moe_gemms<Narrow3>(a, v, T, s); break;
    default: err = moe_gemms<Wide8>(a, v, T, s); break;
  }
  if (err != cudaSuccess) return err;

  launch_pdl(zero_skipped_rows_kernel, static_cast<unsigned>(pairs < 4096 ? pairs : 4096), 256, 0, s, a.expert_ids, pairs, E,
             a.y, dim);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
