// RoPE of a row's tail and QDQ8 / QDQ4a / QDQ4b (MODEL.md §4) on values held one per lane of a
// warp, 32 consecutive columns of one row per warp: the one definition shared by the rope and qdq
// kernels' arithmetic and the kernels that apply them to the rows they produce in place of separate
// launches (RMSNorm of the attention's kv rows, QDQ of the indexer's queries), so all round alike.
#pragma once
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::dev {

constexpr float kQdqFp8MaxInv = static_cast<float>(1.0 / 448.0);
constexpr float kQdqFp4MaxInv = static_cast<float>(1.0 / 6.0);

__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Position of row r under a RopeTail (r / row_div is the token).
__device__ __forceinline__ int64_t rope_tail_position(const RopeTail& t, int64_t r) {
  const int64_t tok = r / t.row_div;
  return t.positions ? t.positions[tok] : t.pos0 + tok * t.pos_step;
}

// The rope kernel's pair rotation (rope.cu, forward direction) of the pair (x0, x1) at pair index
// i and position p: returns the rotated even (odd = false) or odd element, bf16-rounded.
__device__ __forceinline__ float rope_pair_value(float x0, float x1, const float* freqs, int64_t i, int64_t p,
                                                 bool odd) {
  const float angle = __fmul_rn(static_cast<float>(p), freqs[i]);
  const float c = static_cast<float>(cos(static_cast<double>(angle)));
  const float sn = static_cast<float>(sin(static_cast<double>(angle)));
  return odd ? bf16_round(__fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)))
             : bf16_round(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
}

// Every lane of the warp calls this with value v at column col of row r (a row of k columns; the
// warp's 32 columns start at a multiple of 32). Columns [k - rope_dim, k) are rotated as pairs
// (the partner is the neighbouring lane: k - rope_dim is even); the rest come back unchanged.
__device__ __forceinline__ float rope_tail_lane(const RopeTail& t, float v, int64_t r, int64_t col, int64_t k) {
  const float other = __shfl_xor_sync(kFull, v, 1);
  const int64_t first = k - t.rope_dim;
  if (t.freqs == nullptr || col < first) return v;
  const bool odd = ((col - first) & 1) != 0;
  return rope_pair_value(odd ? other : v, odd ? v : other, t.freqs, (col - first) / 2, rope_tail_position(t, r), odd);
}

// QDQ of one 32-block held one value per lane (the qdq kernel's arithmetic); every lane calls it.
// Returns this lane's value quantised, dequantised and rounded to bf16.
__device__ __forceinline__ float qdq_lane(QdqKind kind, float x) {
  float out;
  if (kind == QdqKind::Q8) {
    const float amax = fmaxf(warp_max(fabsf(x)), 1e-4f);
    const float sc = pow2_ceil_scale(amax, kQdqFp8MaxInv);
    out = __fmul_rn(e4m3_round(clampf(__fdiv_rn(x, sc), -448.0f, 448.0f)), sc);
  } else if (kind == QdqKind::Q4a) {
    const float amax = fmaxf(warp_max(fabsf(x)), 6.0f * 0x1p-126f);
    const float sc = pow2_ceil_scale(amax, kQdqFp4MaxInv);
    out = __fmul_rn(e2m1_round(clampf(__fdiv_rn(x, sc), -6.0f, 6.0f)), sc);
  } else {
    // blocks of 16: each half-warp is one block; the reference divides by the constant 6
    const float amax = fmaxf(half_warp_max(fabsf(x)), 6.0f * 0x1p-9f);
    const float sc = e4m3_round(__fdiv_rn(amax, 6.0f));
    out = __fmul_rn(e2m1_round(clampf(__fdiv_rn(x, sc), -6.0f, 6.0f)), sc);
  }
  return bf16_round(out);
}

}  // namespace dsv41::ops::gpu::dev
