// scale_round: bf16(x · s) in place over the first `cols` values of each row, on the indexer head
// weights' shapes (real and tiny), against the CPU reference's expression; the columns past
// `cols` and the guard bytes stay untouched.
#include <gtest/gtest.h>

#include <cmath>

#include "dsv41/common/error.h"
#include "harness.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

TEST(GpuOps, ScaleRoundExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t rows = 37, cols = c.index_n_heads, stride = cols + 3;
    const float scale = static_cast<float>(std::pow(static_cast<double>(c.index_head_dim), -0.5) *
                                           std::pow(static_cast<double>(c.index_n_heads), -0.5));
    Rng rng(77);
    std::vector<float> x = rng.bf16_vec(static_cast<size_t>(rows * stride), 3.0f);
    x[5] = NAN;
    x[7] = INFINITY;
    std::vector<float> want = x;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) want[r * stride + k] = bf16_round(want[r * stride + k] * scale);
    Guarded dx = Guarded::from(x);
    gpu::ScaleRoundArgs a{dx.as<float>(), rows, cols, stride, scale};
    gpu::scale_round(a, nullptr);
    sync_ok();
    expect_close(s.name + " scale_round", dx.host<float>(), want, 0.0);
    expect_guards(s.name + " scale_round", dx);
  }
}

}  // namespace
}  // namespace dsv41::test

namespace dsv41::test {
namespace {

// fill_pointers: every slot of the array gets the pointer, nothing past it is written.
TEST(GpuOps, FillPointersExact) {
  for (int64_t n : {1, 7, 300, 5000}) {
    Guarded dst(static_cast<size_t>(n) * sizeof(void*));
    DeviceBuffer target(64);
    ops::gpu::FillPointersArgs a{dst.as<const uint16_t*>(), n, target.as<uint16_t>()};
    ops::gpu::fill_pointers(a, nullptr);
    sync_ok();
    const std::vector<uintptr_t> got = dst.host<uintptr_t>();
    expect_equal("fill_pointers n=" + std::to_string(n), got,
                 std::vector<uintptr_t>(static_cast<size_t>(n), reinterpret_cast<uintptr_t>(target.get())));
    expect_guards("fill_pointers", dst);
  }
}

}  // namespace
}  // namespace dsv41::test
