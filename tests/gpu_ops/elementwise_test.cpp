// scale_round: bf16(x · s) in place over the first `cols` values of each row, on the indexer head
// weights' shapes (real and tiny), against the CPU reference's expression; the columns past
// `cols` and the guard bytes stay untouched.
#include <gtest/gtest.h>

#include <bit>
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

namespace dsv41::test {
namespace {

// gather_rows: row r of dst is row idx[r] of src, bit for bit (NaN payloads, infinities, -0 too),
// for the EXL3 MoE's shapes (the real hidden width, 16-byte copies) and odd widths and strides
// (element copies); the columns past `cols` and the guard bytes stay untouched, a negative index
// gives a zero row, and an index past src a NaN row instead of a read out of bounds.
TEST(GpuOps, GatherRowsExact) {
  struct Case {
    int64_t src_rows, rows, cols, src_stride, dst_stride;
  };
  for (const Case& k : {Case{2048, 12288, 5120, 5120, 5120}, Case{7, 40, 33, 37, 35}, Case{300, 5, 4, 8, 4},
                        Case{1, 3, 1, 1, 2}}) {
    const std::string what = "gather_rows " + std::to_string(k.rows) + "x" + std::to_string(k.cols);
    Rng rng(static_cast<uint64_t>(k.rows * 31 + k.cols));
    std::vector<float> src = rng.f32_vec(static_cast<size_t>(k.src_rows * k.src_stride), 2.0f);
    src[0] = -0.0f;
    if (src.size() > 3) src[1] = INFINITY, src[2] = std::bit_cast<float>(0x7fc01234u);
    std::vector<int32_t> idx(static_cast<size_t>(k.rows));
    for (int32_t& i : idx) i = static_cast<int32_t>(rng.g() % static_cast<uint64_t>(k.src_rows));
    idx.back() = static_cast<int32_t>(k.src_rows);  // one past the end
    idx.front() = -1;                               // no row
    Guarded ds = Guarded::from(src), di = Guarded::from(idx);
    Guarded dd(static_cast<size_t>(k.rows * k.dst_stride) * 4);
    std::vector<uint32_t> want = dd.host<uint32_t>();  // the poison, kept past `cols`
    for (int64_t r = 0; r < k.rows; ++r)
      for (int64_t c = 0; c < k.cols; ++c)
        want[static_cast<size_t>(r * k.dst_stride + c)] =
            r + 1 == k.rows || r == 0 ? 0u
                                      : std::bit_cast<uint32_t>(src[static_cast<size_t>(idx[r] * k.src_stride + c)]);
    gpu::gather_rows({ds.as<float>(), k.src_rows, k.src_stride, di.as<int32_t>(), dd.as<float>(), k.dst_stride, k.rows,
                      k.cols},
                     nullptr);
    sync_ok();
    std::vector<uint32_t> got = dd.host<uint32_t>();
    for (int64_t c = 0; c < k.cols; ++c) {  // the last row: NaN (any payload)
      uint32_t& g = got[static_cast<size_t>((k.rows - 1) * k.dst_stride + c)];
      EXPECT_TRUE(std::isnan(std::bit_cast<float>(g))) << what << " column " << c;
      g = 0u;
    }
    expect_equal(what, got, want);
    expect_guards(what, dd);
  }
  // Bad arguments are refused before a launch.
  EXPECT_THROW(gpu::gather_rows({nullptr, 1, 4, nullptr, nullptr, 4, 1, 4}, nullptr), dsv41::Error);
  EXPECT_THROW(gpu::gather_rows({nullptr, 1, 2, nullptr, nullptr, 4, 1, 4}, nullptr), dsv41::Error);
}

}  // namespace
}  // namespace dsv41::test
