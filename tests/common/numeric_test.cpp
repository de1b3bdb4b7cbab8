#include <gtest/gtest.h>

#include <cmath>

#include "dsv41/common/numeric.h"

using namespace dsv41;

TEST(Numeric, E4m3RoundTripsEveryCode) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN codes
    const float v = e4m3_to_f32(static_cast<uint8_t>(b));
    EXPECT_EQ(e4m3_round(v), v) << b;
    if (v != 0.0f) {
      EXPECT_EQ(f32_to_e4m3(v), b) << b;
    }
  }
}

TEST(Numeric, E4m3KnownValues) {
  EXPECT_EQ(e4m3_to_f32(0x3C), 1.5f);  // not 60: the byte is a float code
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_EQ(e4m3_round(1000.0f), 448.0f);
  // ties to even: 1.0625 lies between 1.0 (mantissa 0) and 1.125 (mantissa 1) -> 1.0
  EXPECT_EQ(e4m3_round(1.0625f), 1.0f);
  EXPECT_EQ(e4m3_round(1.1875f), 1.25f);
  // subnormal tie: 1.5 * 2^-9 -> 2 * 2^-9
  EXPECT_EQ(e4m3_round(1.5f * std::ldexp(1.0f, -9)), 2.0f * std::ldexp(1.0f, -9));
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_round(1.0f + std::ldexp(1.0f, -8)), 1.0f);                       // tie -> even
  EXPECT_EQ(bf16_round(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));  // tie -> even (up)
  EXPECT_EQ(bf16_round(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 1.0f + std::ldexp(1.0f, -7));
}

TEST(Numeric, E8m0AndE2m1) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e2m1_to_f32(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xB), -1.5f);
}

TEST(Numeric, F16Conversions) {
  EXPECT_EQ(f16_bits_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(e5m2_to_f32(0x3C), 1.0f);
}
