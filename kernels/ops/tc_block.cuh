// Tensor-core sums of one 32-wide K block of exact code products, for the block-scaled linears
// (FP8 and FP4 weights against ActQuant8 activation codes).
//
// Why it is (nearly) exact. e4m3 and e2m1 codes are fp16 values, so a code product is exact in the
// tensor core, and a block's 32 products are added there in fp32 from zero - not one by one as the
// CPU engine's chain does: the hardware aligns a step's products to the largest and keeps a limited
// number of bits below it. The two agree when no rounding happens in either order, i.e. when the
// products and the running sums need at most 24 significant bits (products of similar magnitude,
// which the per-32 scales make the common case). Otherwise they can differ: a product far below the
// largest can be dropped by the tensor core while the chain keeps it after a cancellation, so the
// difference is bounded by the block's magnitude, not by its result: each way is within
// 31 * 2^-24 * sum |products| (~2^-19) of the exact sum (the tests allow 2^-18 * sum |products|).
// The caller then folds the block in K-block order exactly as the CPU does:
// acc = fma(part * x_scale, w_scale, acc), which equals the CPU's acc + (part * x_scale) * w_scale
// because the E8M0 weight scale is a power of two.
//
// One arrangement everywhere. Which products share a tensor-core addition step could in principle
// change the rounding of that sum, so every kernel (the prefill Lin8 GEMM, the grouped MoE) feeds a
// block through the same two chained m16n8k16 steps with the same K placement: weights are the A
// operand (M = weight rows), activations the B operand (N = tokens or pairs); thread (g = lane / 4,
// tig = lane % 4) supplies K 8tig .. 8tig+7 of its rows g and g+8 (A) and of its column g (B); step 0
// takes K 8tig .. 8tig+3 (slots 2tig, 2tig+1 <- K 8tig, 8tig+1; slots 2tig+8, 2tig+9 <- K 8tig+2,
// 8tig+3), step 1 the same with K + 4. A row's result therefore never depends on the tile or on the
// other rows of the call (the callers keep decode steps on kernels whose rows do not depend on m
// either: the sequential sums, or the row-only sums of ops/lin8_tc_gemv.h).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv41::ops::gpu::tc {

// D += A·B for one m16n8k16 step (fp16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3 codes (low byte first) -> fp16x2 (low half first); exact.
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t v16) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v16 & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// High bytes of the fp16 encodings of the e2m1 magnitudes 0, .5, 1, 1.5 | 2, 3, 4, 6, sign bit set.
constexpr uint32_t kE2m1F16NegLo = 0xBEBCB880u, kE2m1F16NegHi = 0xC6C4C2C0u;
// The same table for the magnitudes times 2^-13 (each nonzero entry's exponent field 13 lower: the
// smallest, .5·2^-13, is still an f16 normal). Adding t·kE2m1TableStepLo / t·kE2m1TableStepHi
// (t = 0..26) moves every nonzero entry's exponent up by t, byte by byte without carries (the
// largest entry, 6·2^13, then has exponent field 30): the table of the magnitudes times 2^(t-13).
constexpr uint32_t kE2m1F16NegLoM13 = 0x8A888480u, kE2m1F16NegHiM13 = 0x92908E8Cu;
constexpr uint32_t kE2m1TableStepLo = 0x04040400u, kE2m1TableStepHi = 0x04040404u;

// Four e2m1 codes (code i in bits 4i..4i+3 of q; the high 16 bits are ignored) -> byte i = high
// byte of code i's fp16 value (the low bytes of those encodings are all zero), through the table
// neg_lo | neg_hi (the high bytes of the eight magnitudes with the sign bit set). The widening is
// bound by the integer pipe, so the subtraction is a mad.lo (FMA pipe).
__device__ __forceinline__ uint32_t e2m1x4_f16_high(uint32_t q, uint32_t neg_lo, uint32_t neg_hi) {
  const uint32_t negative = __byte_perm(neg_lo, neg_hi, q & 0x7777u);
  // prmt's sign mode: a selector nibble with bit 3 set (a negative code) yields the replicated top
  // bit of the selected byte (0x00 here), otherwise the byte itself (0x01); only q[15:0] is read.
  uint32_t non_negative;
  asm("prmt.b32 %0, %1, %1, %2;" : "=r"(non_negative) : "r"(0x01010101u), "r"(q));
  // Clear the sign bit of the non-negative codes: every byte of `negative` has it set, so the
  // per-byte subtraction of 0x80 never borrows.
  uint32_t r;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(non_negative), "r"(0xFFFFFF80u), "r"(negative));
  return r;
}
__device__ __forceinline__ uint32_t e2m1x4_f16_high(uint32_t q) {
  return e2m1x4_f16_high(q, kE2m1F16NegLo, kE2m1F16NegHi);
}
// fp16x2 of the high bytes 0/1 (sel 0x1404) or 2/3 (sel 0x3424) of h: low bytes zero.
__device__ __forceinline__ uint32_t f16x2_from_high(uint32_t h, uint32_t sel) { return __byte_perm(h, 0u, sel); }

// A fragments of one block: [k16 step][mma A register].
struct BlockA {
  uint32_t r[2][4];
};
// From FP4 weights: row g's and row g+8's 4 bytes at byte 4tig of the block (8 codes each, low
// nibble first = K 8tig .. 8tig+7), each row through its own magnitude table (t_g: row g's).
struct E2m1Table {
  uint32_t lo, hi;
};
__device__ __forceinline__ BlockA block_a_fp4(uint32_t row_g, uint32_t row_g8, E2m1Table t_g, E2m1Table t_g8) {
  const uint32_t lo0 = e2m1x4_f16_high(row_g, t_g.lo, t_g.hi), hi0 = e2m1x4_f16_high(row_g >> 16, t_g.lo, t_g.hi);
  const uint32_t lo1 = e2m1x4_f16_high(row_g8, t_g8.lo, t_g8.hi), hi1 = e2m1x4_f16_high(row_g8 >> 16, t_g8.lo, t_g8.hi);
  BlockA a;
  a.r[0][0] = f16x2_from_high(lo0, 0x1404u);
  a.r[0][1] = f16x2_from_high(lo1, 0x1404u);
  a.r[0][2] = f16x2_from_high(lo0, 0x3424u);
  a.r[0][3] = f16x2_from_high(lo1, 0x3424u);
  a.r[1][0] = f16x2_from_high(hi0, 0x1404u);
  a.r[1][1] = f16x2_from_high(hi1, 0x1404u);
  a.r[1][2] = f16x2_from_high(hi0, 0x3424u);
  a.r[1][3] = f16x2_from_high(hi1, 0x3424u);
  return a;
}
// The codes' own values (e2m1 x 1).
__device__ __forceinline__ BlockA block_a_fp4(uint32_t row_g, uint32_t row_g8) {
  constexpr E2m1Table kUnit{kE2m1F16NegLo, kE2m1F16NegHi};
  return block_a_fp4(row_g, row_g8, kUnit, kUnit);
}
// From FP8 weights: row g's and row g+8's 8 bytes at byte 8tig of the block (K 8tig .. 8tig+7).
__device__ __forceinline__ BlockA block_a_fp8(uint2 row_g, uint2 row_g8) {
  BlockA a;
  a.r[0][0] = e4m3x2_f16x2(row_g.x);
  a.r[0][1] = e4m3x2_f16x2(row_g8.x);
  a.r[0][2] = e4m3x2_f16x2(row_g.x >> 16);
  a.r[0][3] = e4m3x2_f16x2(row_g8.x >> 16);
  a.r[1][0] = e4m3x2_f16x2(row_g.y);
  a.r[1][1] = e4m3x2_f16x2(row_g8.y);
  a.r[1][2] = e4m3x2_f16x2(row_g.y >> 16);
  a.r[1][3] = e4m3x2_f16x2(row_g8.y >> 16);
  return a;
}

// The same fragments times 2^t, m the f16x2 of 2^t in both halves (a normal power of two: t in
// [-14, 15]). Exact for e4m3 values while t lies in [-14, 7]: the smallest, 2^-9, stays on the f16
// grid (2^-23 >= 2^-24) and the largest, 448, stays finite (57344).
__device__ __forceinline__ void scale_block_a(BlockA& a, uint32_t m) {
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(a.r[s][i]) : "r"(m));
}

// B fragments of one block: [k16 step][mma B register].
struct BlockB {
  uint32_t r[2][2];
};
// From column g's 8 activation codes at byte 8tig of the block (K 8tig .. 8tig+7).
__device__ __forceinline__ BlockB block_b(uint2 col_g) {
  BlockB b;
  b.r[0][0] = e4m3x2_f16x2(col_g.x);
  b.r[0][1] = e4m3x2_f16x2(col_g.x >> 16);
  b.r[1][0] = e4m3x2_f16x2(col_g.y);
  b.r[1][1] = e4m3x2_f16x2(col_g.y >> 16);
  return b;
}

// Staged f16 rows (the scaled paths: 128 K values, 256 bytes a stage row) are unpadded, their 16-byte
// chunks swizzled by the row's parity, so that a quarter warp's block_b_f16 reads (rows g, g+1 x 4
// chunks) hit 32 distinct banks. Chunk `chunk` of row `row` is stored at this chunk index.
__host__ __device__ constexpr int f16_row_chunk(int row, int chunk) { return chunk ^ ((row & 1) << 2); }

// From column g's 8 f16 values at element 8tig of the block (K 8tig .. 8tig+7, low half first): the
// same registers block_b builds from codes.
__device__ __forceinline__ BlockB block_b_f16(uint4 col_g) {
  BlockB b;
  b.r[0][0] = col_g.x;
  b.r[0][1] = col_g.y;
  b.r[1][0] = col_g.z;
  b.r[1][1] = col_g.w;
  return b;
}

// The block's code dots: d[0] (row g, column 2tig), d[1] (row g, column 2tig+1), d[2] / d[3] the
// same for row g+8, each summed from zero over the block's 32 products.
__device__ __forceinline__ void block_dot(float (&d)[4], const BlockA& a, const BlockB& b) {
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  mma_f16(d, a.r[0], b.r[0][0], b.r[0][1]);
  mma_f16(d, a.r[1], b.r[1][0], b.r[1][1]);
}

// The CPU engine's block step: acc + (part * x_scale) * w_scale, as one fma (w_scale is a power of
// two, so the product's rounding is the multiplication's).
__device__ __forceinline__ float fold_block(float acc, float part, float x_scale, float w_scale) {
  return __fmaf_rn(__fmul_rn(part, x_scale), w_scale, acc);
}

// The same step when the B values already carry x_scale (times a power of two the caller removes at
// the end): part is the block's sum times x_scale, exactly, so one fma rounds as fold_block does.
__device__ __forceinline__ float fold_block_scaled(float acc, float part_scaled, float w_scale) {
  return __fmaf_rn(part_scaled, w_scale, acc);
}

}  // namespace dsv41::ops::gpu::tc
