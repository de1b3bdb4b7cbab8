// PyTorch's CPU transcendental paths (src/model/ops/vec_math.*) and the per-token arithmetic of the
// mHC mixes (src/model/ops/mhc.*).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "model/ops/mhc.h"
#include "model/ops/vec_math.h"

using namespace dsv41::model;

namespace {
int64_t ulp_distance(float a, float b) {
  const int32_t x = std::bit_cast<int32_t>(a), y = std::bit_cast<int32_t>(b);
  return std::llabs(static_cast<int64_t>(x) - static_cast<int64_t>(y));
}
}  // namespace

// The vector exp is a 1-ulp approximation (SLEEF's u10 bound): never more than 1 ulp from the
// correctly rounded value, and not the correctly rounded function (else the vector body would
// not matter for the reference's mixes).
TEST(VecMath, ExpWithinOneUlpButNotCorrectlyRounded) {
  int64_t off_by_one = 0, n = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.00731f, ++n) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t d = ulp_distance(torch_vec_exp_f32(x), want);
    ASSERT_LE(d, 1) << "x = " << x;
    off_by_one += d == 1;
  }
  EXPECT_GT(off_by_one, 0);
  EXPECT_LT(off_by_one, n / 4);
  EXPECT_EQ(torch_vec_exp_f32(0.0f), 1.0f);
  EXPECT_EQ(torch_vec_exp_f32(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(torch_vec_exp_f32(200.0f)));
  EXPECT_TRUE(std::isnan(torch_vec_exp_f32(NAN)));
}

TEST(VecMath, SigmoidPaths) {
  for (float x : {-3.7f, -0.2f, 0.0f, 0.9f, 5.5f}) {
    EXPECT_EQ(torch_sigmoid_f32(x, false), 1.0f / (1.0f + std::exp(-x)));
    EXPECT_EQ(torch_sigmoid_f32(x, true), 1.0f / (1.0f + torch_vec_exp_f32(-x)));
  }
}

// A tensor of n elements runs floor(n/16)·16 of them through the vector body.
TEST(MixArithmetic, VectorBodyOfThePrePostTensor) {
  EXPECT_EQ(hc_mix_arithmetic(4, 0, 1, 0).sigmoid_vector, 0);   // decode: 4 elements, scalar
  EXPECT_EQ(hc_mix_arithmetic(4, 1, 2, 0).sigmoid_vector, 0);   // DSpark block of 2: 8 elements
  EXPECT_EQ(hc_mix_arithmetic(4, 3, 4, 0).sigmoid_vector, 4);   // 16 elements: all vector
  EXPECT_EQ(hc_mix_arithmetic(4, 3, 5, 0).sigmoid_vector, 4);   // 20 elements: tokens 0..3 vector
  EXPECT_EQ(hc_mix_arithmetic(4, 4, 5, 0).sigmoid_vector, 0);   // ... token 4 in the scalar tail
  EXPECT_EQ(hc_mix_arithmetic(3, 5, 6, 0).sigmoid_vector, 1);   // 18 elements, token 5 = 15..17
  EXPECT_EQ(hc_mix_arithmetic(4, 299, 300, 3).k_parts, 3);
}

// K parts of whole 64-element units, the first (units mod P) parts one unit longer, each a
// sequential FMA chain, parts added in order. Checked on values whose partial sums are exact
// except at the part boundaries, so only the exact partition gives the expected result.
TEST(MixArithmetic, KPartitionBoundaries) {
  // ones everywhere; a 2^24 spike at the start of a part swallows that part's later +1s only if
  // the part boundary is where the documentation says.
  const int64_t n = 1024;
  std::vector<float> a(n, 1.0f), b(n, 1.0f);
  for (int64_t start : {0, 384, 704}) b[start] = 16777216.0f;  // 3 parts: 384 + 320 + 320
  // Inside a part the running sum is >= 2^24, so each later +1 rounds away (ties to even).
  const float three = hc_gemm_dot(a.data(), b.data(), n, 3);
  EXPECT_EQ(three, 3.0f * 16777216.0f);
  // Parts of 256 start at 0, 256, 512, 768: the +1s after 256 survive in the part [256, 512) etc.
  const float blocks = hc_gemm_dot(a.data(), b.data(), n, 0);
  EXPECT_NE(blocks, three);
}
