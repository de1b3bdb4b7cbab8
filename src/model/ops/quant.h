// Reference rounding primitives of MODEL.md §4: activation quantisation for FP8/FP4 matmuls and the
// quantise-dequantise steps applied to KV rows and indexer vectors. All inputs are bf16 values held
// in floats; outputs are bf16 values (QDQ*) or exact e4m3 codes plus power-of-two scales (ActQuant8).
#pragma once
#include <cstdint>

namespace dsv41::model {

// The next power of two >= amax * max_inv, computed on the fp32 bits of the product (the
// reference's fast_round_scale): exponent of the product, +1 when its mantissa is non-zero.
float pow2_ceil_scale(float amax, float max_inv);

// fp32(1/448) and fp32(1/6): the reference multiplies by these fp32 constants.
inline constexpr float kFp8MaxInv = static_cast<float>(1.0 / 448.0);
inline constexpr float kFp4MaxInv = static_cast<float>(1.0 / 6.0);

// ActQuant8 over k values (k % 32 == 0): codes[i] = e4m3 value of x[i]/scale (as a float, exact),
// scales[b] = the power-of-two scale of block b.
void act_quant8(const float* x, int64_t k, float* codes, float* scales);

// QDQ8: ActQuant8 then dequantise back in place (result is exact in bf16).
void qdq8_inplace(float* x, int64_t k);

// Nearest e2m1 value of v in [-6, 6], ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2,
// 2.5->2, 3.5->4, 5->4). Sign of zero follows v.
float e2m1_round(float v);

// QDQ4a (indexer q/k): blocks of 32, E8M0 power-of-two scales. In place, bf16 results.
void qdq4a_inplace(float* x, int64_t k);
// QDQ4b (compressed KV): blocks of 16, scale = e4m3(amax/6). In place, bf16 results.
void qdq4b_inplace(float* x, int64_t k);

}  // namespace dsv41::model
