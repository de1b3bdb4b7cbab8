// Software binary16 conversions (numeric.h): exhaustive round trips, ties to even, overflow and
// subnormals; cross-checked against the compiler's _Float16 where the compiler has one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "dsv41/common/numeric.h"

namespace dsv41 {
namespace {

TEST(F16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7C00u, 0x7C00u);
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16_bits(f), h) << std::hex << h;
    ASSERT_EQ(f64_to_f16_bits(static_cast<double>(f)), h) << std::hex << h;
  }
}

TEST(F16, MidpointsRoundToEven) {
  // between consecutive positive finite values a < b the midpoint goes to the even pattern
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const double a = f16_bits_to_f32(static_cast<uint16_t>(h)), b = f16_bits_to_f32(static_cast<uint16_t>(h + 1));
    const double mid = (a + b) / 2;
    const uint32_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(f64_to_f16_bits(mid), even) << std::hex << h;
    ASSERT_EQ(f64_to_f16_bits(-mid), even | 0x8000u) << std::hex << h;
    ASSERT_EQ(f64_to_f16_bits(std::nextafter(mid, 0.0)), h) << std::hex << h;
    ASSERT_EQ(f64_to_f16_bits(std::nextafter(mid, 1e9)), h + 1) << std::hex << h;
  }
}

TEST(F16, OverflowAndSpecials) {
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);  // tie between max and "65536" rounds to even = inf
  EXPECT_EQ(f32_to_f16_bits(-1e30f), 0xFC00);
  EXPECT_EQ(f32_to_f16_bits(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);  // half of the smallest subnormal: even
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_bits_to_f32(0x7C00)));
}

#if defined(__FLT16_MANT_DIG__) && !defined(__clang__)
TEST(F16, MatchesCompilerFloat16) {
  // a spread of fp32 values, including many that need rounding
  uint32_t x = 12345;
  for (int i = 0; i < 1000000; ++i) {
    x = x * 1664525u + 1013904223u;
    const float f = std::bit_cast<float>((x & 0x8FFFFFFFu) | 0x30000000u);  // exponents around the f16 range
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16_bits(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << f;
  }
}
#endif

}  // namespace
}  // namespace dsv41
