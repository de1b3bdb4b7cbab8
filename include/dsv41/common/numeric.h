// Scalar number formats used by the checkpoint and the reference numerics (MODEL.md §3.1, §4).
// All rounding is round-to-nearest-even unless a name says otherwise.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace dsv41 {

// ---- bfloat16 ----
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
// Rounds an fp32 value to the nearest bf16 value (returned widened to fp32).
inline float bf16_round(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// ---- IEEE binary16, in software: _Float16 is not available on every compiler/target (clang 14
// on x86-64 rejects it), and one rounding from double also serves the f64 path exactly ----
inline uint16_t f64_to_f16_bits(double d) {
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  if (std::isnan(d)) return static_cast<uint16_t>(sign | 0x7E00);
  const double a = std::fabs(d);
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7C00);  // beyond max + half ulp: inf (RNE)
  if (a < 0x1p-14) {  // subnormal grid 2^-24; nearbyint rounds half to even in the default mode
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24)));
  }
  int ex = 0;
  std::frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1)
  int e = ex - 1;      // a in [2^e, 2^(e+1))
  double m = std::nearbyint(std::ldexp(a, 10 - e));  // [1024, 2048], exact scaling
  if (m >= 2048.0) m = 1024.0, ++e;
  if (e > 15) return static_cast<uint16_t>(sign | 0x7C00);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | (static_cast<uint16_t>(m) - 1024));
}
inline uint16_t f32_to_f16_bits(float f) { return f64_to_f16_bits(static_cast<double>(f)); }
inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int e = (h >> 10) & 0x1F;
  const uint32_t m = h & 0x3FF;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));  // inf / NaN
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(e - 15 + 127) << 23) | (m << 13));
}
inline float f16_round(float f) { return f16_bits_to_f32(f32_to_f16_bits(f)); }

// ---- FP8 e4m3fn (bias 7, no inf, 0x7F/0xFF NaN, max 448, subnormals m*2^-9) ----
inline float e4m3_to_f32(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 0xF, m = b & 7;
  float v;
  if (e == 0xF && m == 7) return std::nanf("");
  if (e == 0) v = std::ldexp(static_cast<float>(m), -9);
  else v = std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
// Nearest e4m3 value (ties to even), saturating to +-448; NaN stays NaN.
inline float e4m3_round(float x) {
  if (std::isnan(x)) return x;
  float a = std::fabs(x);
  if (a >= 0.015625f) {  // normal range: keep 3 mantissa bits
    uint32_t u = std::bit_cast<uint32_t>(a);
    u = u + ((1u << 19) - 1) + ((u >> 20) & 1u);
    u &= ~((1u << 20) - 1);
    a = std::bit_cast<float>(u);
    if (a > 448.0f) a = 448.0f;
  } else {
    a = std::nearbyint(a * 512.0f) / 512.0f;  // subnormal grid 2^-9 (default rounding mode: RNE)
  }
  return std::signbit(x) ? -a : a;
}
// Encodes x (rounded as e4m3_round does) to its byte.
inline uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const float r = e4m3_round(x);
  const float a = std::fabs(r);
  uint8_t bits;
  if (a >= 0.015625f) {
    const uint32_t u = std::bit_cast<uint32_t>(a);
    const int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 7;
    bits = static_cast<uint8_t>((e << 3) | ((u >> 20) & 7));
  } else {
    bits = static_cast<uint8_t>(a * 512.0f);
  }
  return static_cast<uint8_t>(bits | (std::signbit(r) ? 0x80 : 0));
}

// ---- FP8 e5m2: the upper byte of an IEEE binary16 ----
inline float e5m2_to_f32(uint8_t b) { return f16_bits_to_f32(static_cast<uint16_t>(b) << 8); }

// ---- E8M0 scale byte: 2^(b-127); 255 is NaN ----
inline float e8m0_to_f32(uint8_t b) {
  if (b == 255) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(b) - 127);
}

// ---- FP4 e2m1 (MXFP4 code table, by nibble; bit 3 is the sign) ----
inline float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kTable[16] = {0.0f, 0.5f, 1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kTable[nibble & 0xF];
}

}  // namespace dsv41
