// The code decoders inside the Lin8/Lin4 kernels (kernels/ops/lin_fp8.cu) on every code, against the
// reference conversions of dsv41/common/numeric.h, bit for bit. The kernels decode e4m3 with
// cvt.rn.f16x2.e4m3x2 (+ f16 -> f32) and e2m1 by moving its bits into an e4m3 byte (value·2^-6);
// each code is tried in every byte / nibble position of a word, with other codes around it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dsv41/common/numeric.h"
#include "dsv41/ops/gpu_buffer.h"
#include "ops/lin_decode.h"

namespace dsv41::test {
namespace {

TEST(GpuOps, LinCodeDecodersMatchReference) {
  ops::gpu::DeviceBuffer e4m3(4 * 256 * sizeof(float)), e2m1(8 * 16 * sizeof(float));
  ASSERT_EQ(ops::gpu::raw::lin_decode_all(e4m3.as<float>(), e2m1.as<float>(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got8 = e4m3.to_host<float>(4 * 256), got4 = e2m1.to_host<float>(8 * 16);
  int checked = 0;
  for (int pos = 0; pos < 4; ++pos)
    for (int c = 0; c < 256; ++c) {
      const float want = e4m3_to_f32(static_cast<uint8_t>(c)), got = got8[pos * 256 + c];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "e4m3 code " << c << " byte " << pos;
        continue;
      }
      // bit patterns: -0 stays -0, subnormal codes stay exact
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "e4m3 code " << c << " byte " << pos << ": got " << got << " want " << want;
      ++checked;
    }
  for (int pos = 0; pos < 8; ++pos)
    for (int c = 0; c < 16; ++c) {
      const float want = e2m1_to_f32(static_cast<uint8_t>(c)), got = got4[pos * 16 + c];
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "e2m1 code " << c << " nibble " << pos << ": got " << got << " want " << want;
      ++checked;
    }
  EXPECT_EQ(checked, 4 * 254 + 8 * 16);
}

}  // namespace
}  // namespace dsv41::test
