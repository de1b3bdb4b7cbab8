// The K order of the mHC mixes GEMM (dsv41/model/mix_gemm_parts.h): the parts of each order written
// out by hand from the BLAS behaviour it models, the row-count rule, and hc_gemm_dot summing those
// parts (chains from zero, added in K order) on inputs where any other grouping rounds differently.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "dsv41/model/mix_gemm_parts.h"
#include "model/ops/mhc.h"

namespace dsv41::model {
namespace {

std::vector<std::pair<int64_t, int64_t>> parts_of(int64_t k, int64_t order) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t p = 0; p < mix_gemm_part_count(k, order); ++p) {
    int64_t k0 = 0, k1 = 0;
    mix_gemm_part_range(k, order, p, k0, k1);
    out.emplace_back(k0, k1);
  }
  return out;
}

using Parts = std::vector<std::pair<int64_t, int64_t>>;

TEST(MixGemmParts, BlockedOrderChainsOf384ThenHalves) {
  EXPECT_EQ(parts_of(1024, kMixGemmBlocked), (Parts{{0, 384}, {384, 704}, {704, 1024}}));
  EXPECT_EQ(parts_of(785, kMixGemmBlocked), (Parts{{0, 384}, {384, 585}, {585, 785}}));
  EXPECT_EQ(parts_of(1151, kMixGemmBlocked), (Parts{{0, 384}, {384, 768}, {768, 1151}}));
  EXPECT_EQ(parts_of(768, kMixGemmBlocked), (Parts{{0, 384}, {384, 768}}));
  EXPECT_EQ(parts_of(384, kMixGemmBlocked), (Parts{{0, 384}}));
  EXPECT_EQ(parts_of(100, kMixGemmBlocked), (Parts{{0, 100}}));
  const Parts real = parts_of(20480, kMixGemmBlocked);  // 52 chains of 384, then 256 + 256
  ASSERT_EQ(real.size(), 54u);
  EXPECT_EQ(real[51], (std::pair<int64_t, int64_t>{19584, 19968}));
  EXPECT_EQ(real[52], (std::pair<int64_t, int64_t>{19968, 20224}));
  EXPECT_EQ(real[53], (std::pair<int64_t, int64_t>{20224, 20480}));
}

TEST(MixGemmParts, ChunksAndExplicitParts) {
  EXPECT_EQ(parts_of(1024, kMixGemmChunks), (Parts{{0, 256}, {256, 512}, {512, 768}, {768, 1024}}));
  EXPECT_EQ(parts_of(600, kMixGemmChunks), (Parts{{0, 256}, {256, 512}, {512, 600}}));
  // 16 units of 64 over 3 parts: 6 + 5 + 5
  EXPECT_EQ(parts_of(1024, 3), (Parts{{0, 384}, {384, 704}, {704, 1024}}));
  EXPECT_EQ(parts_of(1024, 5), (Parts{{0, 256}, {256, 448}, {448, 640}, {640, 832}, {832, 1024}}));
}

TEST(MixGemmParts, RowCountRule) {
  EXPECT_EQ(resolve_mix_gemm_parts(kMixGemmAuto, 1), kMixGemmChunks);
  EXPECT_EQ(resolve_mix_gemm_parts(kMixGemmAuto, 96), kMixGemmChunks);
  EXPECT_EQ(resolve_mix_gemm_parts(kMixGemmAuto, 128), kMixGemmChunks);
  EXPECT_EQ(resolve_mix_gemm_parts(kMixGemmAuto, 129), kMixGemmBlocked);
  EXPECT_EQ(resolve_mix_gemm_parts(kMixGemmAuto, 300), kMixGemmBlocked);
  EXPECT_EQ(resolve_mix_gemm_parts(0, 300), 0);  // an explicit order wins
  EXPECT_EQ(resolve_mix_gemm_parts(3, 96), 3);
}

// A value that one fp32 chain absorbs but a fresh chain keeps: a = 1 at k = 0 and 2^-24 at every
// other index, b = 1. Summed in one chain every 2^-24 rounds away against 1; each part after the
// first starts from zero, so its sum survives and is added once. The result therefore counts the
// parts: 1 + (parts - 1) · (part length) · 2^-24, rounded.
TEST(MixGemmParts, DotSumsEachPartFromZeroInKOrder) {
  const int64_t k = 1024;
  std::vector<float> a(static_cast<size_t>(k), std::ldexp(1.0f, -24)), b(static_cast<size_t>(k), 1.0f);
  a[0] = 1.0f;
  const float tiny = std::ldexp(1.0f, -24);
  // blocked: 384 (1 + 383 tiny, all absorbed) + 320·tiny + 320·tiny
  EXPECT_EQ(hc_gemm_dot(a.data(), b.data(), k, kMixGemmBlocked), (1.0f + 320 * tiny) + 320 * tiny);
  // chunks of 256: 1, then three chunks of 256·tiny
  EXPECT_EQ(hc_gemm_dot(a.data(), b.data(), k, kMixGemmChunks), ((1.0f + 256 * tiny) + 256 * tiny) + 256 * tiny);
  EXPECT_NE(hc_gemm_dot(a.data(), b.data(), k, kMixGemmBlocked), hc_gemm_dot(a.data(), b.data(), k, kMixGemmChunks));
}

}  // namespace
}  // namespace dsv41::model
