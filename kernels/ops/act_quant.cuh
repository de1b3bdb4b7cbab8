// ActQuant8 of one 32-value block (src/model/ops/quant.cpp act_quant8) held one value per lane of a
// warp: the one definition shared by the act_quant8 kernel and the kernels that quantise their own
// output rows in place of a separate launch (RMSNorm, SwiGLU), so all give the same codes and scales.
#pragma once
#include "ops/ops_common.cuh"

namespace dsv41::ops::gpu::dev {

constexpr float kFp8MaxInv = static_cast<float>(1.0 / 448.0);

// Every lane of the warp calls this with its value x of the block (lane l holds element l). The
// amax is floored at 1e-4, the scale is the power of two at or above amax/448, the code is
// e4m3(clamp(x / scale, ±448)). Returns this lane's e4m3 byte; *scale gets the block's scale.
__device__ __forceinline__ uint8_t act_quant8_block(float x, float* scale) {
  const float amax = fmaxf(warp_max(fabsf(x)), 1e-4f);
  const float sc = pow2_ceil_scale(amax, kFp8MaxInv);
  *scale = sc;
  return e4m3_bits(e4m3_round(clampf(__fdiv_rn(x, sc), -448.0f, 448.0f)));
}

// Quantised output row r of a kernel that writes rows of k values: codes [rows][k], scales
// [rows][k/32] (the layout act_quant8 writes and Lin8/Lin4 read). `i` is the element's index in
// its row; the calling warp holds the whole 32-block of i (i % 32 == lane).
__device__ __forceinline__ void act_quant8_store(float x, int64_t r, int64_t i, int64_t k, uint8_t* codes,
                                                 float* scales) {
  float sc;
  codes[r * k + i] = act_quant8_block(x, &sc);
  if ((i & 31) == 0) scales[r * (k / 32) + i / 32] = sc;
}

}  // namespace dsv41::ops::gpu::dev
