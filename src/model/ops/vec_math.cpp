#include "model/ops/vec_math.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace dsv41::model {
namespace {

// 2^q for q in the normal exponent range, built from the exponent bits.
float pow2_int(int32_t q) { return std::bit_cast<float>(static_cast<uint32_t>(q + 127) << 23); }

}  // namespace

float torch_vec_exp_f32(float x) {
  // Range reduction x = q·ln2 + s with ln2 split into a short high part and a low correction, so
  // that q·ln2_hi is exact; q is rounded to nearest-even (cvtps2dq).
  if (std::isnan(x)) return x;
  if (x < -104.0f) return 0.0f;      // the vector code masks these lanes to 0 / +inf
  if (x > 100.0f) return INFINITY;
  constexpr float kInvLn2 = 1.442695040888963407359924681001892137426645954152985934135449406931f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  const int32_t q = static_cast<int32_t>(std::nearbyint(x * kInvLn2));
  const float qf = static_cast<float>(q);
  float s = std::fma(qf, -kLn2Hi, x);
  s = std::fma(qf, -kLn2Lo, s);
  // exp(s) ≈ 1 + s + s²·P(s), P of degree 5 (minimax coefficients of the SLEEF single-precision exp).
  float p = 0.000198527617612853646278381f;
  p = std::fma(p, s, 0.00139304355252534151077271f);
  p = std::fma(p, s, 0.00833336077630519866943359f);
  p = std::fma(p, s, 0.0416664853692054748535156f);
  p = std::fma(p, s, 0.166666671633720397949219f);
  p = std::fma(p, s, 0.5f);
  float u = 1.0f + std::fma(s * s, p, s);
  // Scale by 2^q in two steps so that q near the ends of the range neither overflows nor flushes.
  const int32_t half = q >> 1;
  return u * pow2_int(half) * pow2_int(q - half);
}

float torch_sigmoid_f32(float x, bool vector_path) {
  const float e = vector_path ? torch_vec_exp_f32(-x) : std::exp(-x);
  return 1.0f / (1.0f + e);
}

}  // namespace dsv41::model
