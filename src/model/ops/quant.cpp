#include "model/ops/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "dsv41/common/numeric.h"

namespace dsv41::model {

float pow2_ceil_scale(float amax, float max_inv) {
  const float x = amax * max_inv;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xFF);
  const uint32_t man = bits & ((1u << 23) - 1);
  const int32_t log2_ceil = exp - 127 + (man != 0 ? 1 : 0);
  return std::bit_cast<float>(static_cast<uint32_t>(log2_ceil + 127) << 23);
}

void act_quant8(const float* x, int64_t k, float* codes, float* scales) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    amax = std::max(amax, 1e-4f);
    const float s = pow2_ceil_scale(amax, kFp8MaxInv);
    scales[b] = s;
    for (int i = 0; i < 32; ++i) codes[b * 32 + i] = e4m3_round(std::clamp(xb[i] / s, -448.0f, 448.0f));
  }
}

void qdq8_inplace(float* x, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    float* xb = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    amax = std::max(amax, 1e-4f);
    const float s = pow2_ceil_scale(amax, kFp8MaxInv);
    for (int i = 0; i < 32; ++i) xb[i] = bf16_round(e4m3_round(std::clamp(xb[i] / s, -448.0f, 448.0f)) * s);
  }
}

float e2m1_round(float v) {
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  static constexpr float kMids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  static constexpr bool kTieUp[7] = {false, true, false, true, false, true, false};
  const float mag = std::fabs(v);
  int code = 0;
  for (int i = 0; i < 7; ++i) {
    if (mag > kMids[i] || (mag == kMids[i] && kTieUp[i])) ++code;
  }
  const float r = kGrid[code];
  return std::signbit(v) ? -r : r;
}

namespace {
void qdq4_block(float* xb, int n, float s) {
  for (int i = 0; i < n; ++i) xb[i] = bf16_round(e2m1_round(std::clamp(xb[i] / s, -6.0f, 6.0f)) * s);
}
}  // namespace

void qdq4a_inplace(float* x, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    float* xb = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    amax = std::max(amax, 6.0f * std::ldexp(1.0f, -126));
    qdq4_block(xb, 32, pow2_ceil_scale(amax, kFp4MaxInv));
  }
}

void qdq4b_inplace(float* x, int64_t k) {
  for (int64_t b = 0; b < k / 16; ++b) {
    float* xb = x + b * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xb[i]));
    amax = std::max(amax, 6.0f * std::ldexp(1.0f, -9));
    // The reference divides by the constant 6 here (not a reciprocal multiply), then rounds to e4m3.
    qdq4_block(xb, 16, e4m3_round(amax / 6.0f));
  }
}

}  // namespace dsv41::model
