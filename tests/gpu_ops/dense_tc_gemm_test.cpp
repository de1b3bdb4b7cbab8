// The tensor-core GEMM for dense bf16 calls of prefill passes (kernels/ops/dense_tc_gemm.cu) against
// exact sums: its products are exact (fp32 activations split into three bf16 parts), so each
// output must lie within 2^-16 of sum |w·x| of the exact dot product (plus half a bf16 ulp when
// rounded), and the whole output within NMSE 1e-10 of the CPU reference engine's LinBF16 unrounded
// (the tensor core truncates as it accumulates, a bias that grows with K: 2.1e-12 at K = 512 and
// 8.2e-12 at 1024 on the H200, against ~1e-13 for fp32 chains) or the bf16 bound rounded. A second
// case with positive weights and activations whose low mantissa byte is full (no cancellation, a
// short K) holds each output within 2^-19 of the exact sum, which fails if any of the three parts
// were lost (the lowest alone is ~2^-15 of each activation).
// Grouped calls with strided rows (wo_a's form), output and row counts no multiple of the 128 tile,
// activations with full 24-bit mantissas and a wide exponent range; guard bytes and the stride gaps
// must stay untouched. The dispatch takes the path only when the caller allows it (tensor_core),
// for bf16 weights and from kDenseTcMinRows rows.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "harness.h"
#include "model/linears.h"
#include "ops/dense_gemm.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

struct TcCase {
  int64_t in, out, groups, m;
  bool round;
  int64_t x_pad = 0, y_pad = 0;
  int64_t cpu_rows = 0;  // rows checked against the CPU engine (0: all)
};

// A bf16 call over device weights w, activations x and outputs y, the tensor cores allowed.
gpu::DenseArgs tc_args(const void* w, int64_t in, int64_t out, int64_t groups, const float* x, int64_t x_stride,
                       int64_t m, float* y, int64_t y_stride, bool round) {
  gpu::DenseArgs a;
  a.w = w;
  a.wt = gpu::DenseType::BF16;
  a.in = in;
  a.out = out;
  a.groups = groups;
  a.x = x;
  a.x_stride = x_stride;
  a.m = m;
  a.y = y;
  a.y_stride = y_stride;
  a.round_bf16 = round;
  a.tensor_core = true;
  return a;
}

TEST(GpuOps, DenseTcGemmWithinItsBound) {
  const std::vector<TcCase> cases = {
      {800, 200, 3, 130, true, 8, 5},         // grouped, strided, ragged rows and outputs, rounded
      {1024, 72, 1, 64, false},               // the fewest rows it takes, one partial output tile
      {512, 256, 2, 300, false, 0, 3},        // unrounded: the bound without bf16's half ulp
      {4096, 1024, 8, 256, true, 0, 0, 12},   // wo_a's shape (8 groups of 1024 x 4096)
  };
  for (const TcCase& c : cases) {
    const std::string what = "dense tc " + std::to_string(c.groups) + "x" + std::to_string(c.out) + "x" +
                             std::to_string(c.in) + " m=" + std::to_string(c.m) + (c.round ? " round" : "");
    SCOPED_TRACE(what);
    Rng rng(static_cast<uint64_t>(c.in * 17 + c.out * 5 + c.m));
    const DenseWeights w =
        dense_weights(rng, gpu::DenseType::BF16, static_cast<size_t>(c.groups * c.out * c.in), 1.0f / std::sqrt(float(c.in)));
    const int64_t xs = c.groups * c.in + c.x_pad, ys = c.groups * c.out + c.y_pad;
    std::vector<float> x = rng.f32_vec(static_cast<size_t>(c.m * xs));
    for (size_t i = 0; i < x.size(); i += 7) x[i] = std::ldexp(x[i], static_cast<int>(i % 23) - 11);  // wide range
    const DeviceBuffer dx = DeviceBuffer::from(x);
    Guarded dy(static_cast<size_t>(c.m * ys) * 4);
    gpu::DenseArgs a = tc_args(w.device.get(), c.in, c.out, c.groups, dx.as<float>(), xs, c.m, dy.as<float>(), ys, c.round);
    ASSERT_TRUE(gpu::raw::dense_tc_gemm_takes(a));
    a.tensor_core = false;
    EXPECT_FALSE(gpu::raw::dense_tc_gemm_takes(a)) << "taken without tensor_core";
    a.tensor_core = true;
    gpu::lin_dense(a, nullptr);
    sync_ok();
    expect_guards(what, dy);
    const std::vector<float> got = strided_rows(what, dy, c.m, ys, c.groups * c.out);

    // Exact sums, each output against its bound: the rows checked against the CPU below, and the
    // last row (the ragged row tile).
    const int64_t n = c.cpu_rows > 0 ? c.cpu_rows : c.m;
    std::vector<int64_t> exact_rows;
    for (int64_t r = 0; r < n; ++r) exact_rows.push_back(r);
    if (n < c.m) exact_rows.push_back(c.m - 1);
    int64_t outside = 0, first = -1;
    for (const int64_t r : exact_rows)
      for (int64_t g = 0; g < c.groups; ++g)
        for (int64_t o = 0; o < c.out; ++o) {
          double s = 0.0, abs_sum = 0.0;
          const float* wr = &w.values[(g * c.out + o) * c.in];
          const float* xr = &x[r * xs + g * c.in];
          for (int64_t k = 0; k < c.in; ++k) {
            const double p = static_cast<double>(wr[k]) * static_cast<double>(xr[k]);
            s += p;
            abs_sum += std::fabs(p);
          }
          const double v = got[(r * c.groups + g) * c.out + o];
          const double bound = std::ldexp(abs_sum, -16) + (c.round ? std::ldexp(std::fabs(s), -8) : 0.0);
          if (!(std::fabs(v - s) <= bound) && outside++ == 0) first = (r * c.groups + g) * c.out + o;
        }
    EXPECT_EQ(outside, 0) << what << ": outputs outside 2^-16 sum|w x| of the exact sum, first at " << first;

    // Against the CPU engine's LinBF16 (its fp32 chains), on all rows or the first few.
    std::vector<float> want(static_cast<size_t>(n * c.groups * c.out)), part(static_cast<size_t>(n * c.out));
    for (int64_t g = 0; g < c.groups; ++g) {
      auto lin = model::make_dense_linear(
          std::vector<float>(w.values.begin() + g * c.out * c.in, w.values.begin() + (g + 1) * c.out * c.in), c.in, c.out);
      std::vector<float> xg(static_cast<size_t>(n * c.in));
      for (int64_t i = 0; i < n; ++i) std::copy_n(&x[i * xs + g * c.in], c.in, &xg[i * c.in]);
      if (c.round) model::linear_bf16(*lin, xg.data(), n, part.data());
      else lin->forward(xg.data(), n, part.data());
      for (int64_t i = 0; i < n; ++i) std::copy_n(&part[i * c.out], c.out, &want[(i * c.groups + g) * c.out]);
    }
    const std::vector<float> got_n(got.begin(), got.begin() + n * c.groups * c.out);
    expect_close(what + " against the CPU engine", got_n, want, c.round ? kNmseBf16 : 1e-10);
  }
}

TEST(GpuOps, DenseTcGemmKeepsEveryPartOfTheActivations) {
  constexpr int64_t in = 32, out = 64, m = 64;
  Rng rng(41);
  DenseWeights w = dense_weights(rng, gpu::DenseType::BF16, static_cast<size_t>(out * in), 1.0f);
  for (float& v : w.values) v = std::fabs(v);
  w.device = DeviceBuffer::from(to_bf16_bits(w.values));
  std::vector<float> x = rng.f32_vec(static_cast<size_t>(m * in));
  for (float& v : x) v = std::bit_cast<float>((std::bit_cast<uint32_t>(std::fabs(v)) & ~0xFFu) | 0xFFu);
  const DeviceBuffer dx = DeviceBuffer::from(x);
  Guarded dy(static_cast<size_t>(m * out) * 4);
  const gpu::DenseArgs a = tc_args(w.device.get(), in, out, 1, dx.as<float>(), in, m, dy.as<float>(), out, false);
  ASSERT_TRUE(gpu::raw::dense_tc_gemm_takes(a));
  gpu::lin_dense(a, nullptr);
  sync_ok();
  expect_guards("dense tc parts", dy);
  const std::vector<float> got = dy.host<float>();
  int64_t outside = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t k = 0; k < in; ++k) s += double(w.values[o * in + k]) * double(x[r * in + k]);
      const double rel = std::fabs(got[r * out + o] - s) / s;
      worst = std::max(worst, rel);
      outside += !(rel <= std::ldexp(1.0, -19));
    }
  EXPECT_EQ(outside, 0) << "outputs off by more than 2^-19 of the exact sum; worst " << worst;
}

TEST(GpuOps, DenseTcGemmDeclines) {
  DeviceBuffer buf(1 << 20);
  const gpu::DenseArgs a =
      tc_args(buf.get(), 256, 128, 1, buf.as<float>(), 256, gpu::raw::kDenseTcMinRows, buf.as<float>(), 128, true);
  EXPECT_TRUE(gpu::raw::dense_tc_gemm_takes(a));
  gpu::DenseArgs b = a;
  b.m = gpu::raw::kDenseTcMinRows - 1;  // decode and draft sizes keep the CPU's order
  EXPECT_FALSE(gpu::raw::dense_tc_gemm_takes(b));
  b = a;
  b.wt = gpu::DenseType::F32;  // fp32 weights: not bf16
  EXPECT_FALSE(gpu::raw::dense_tc_gemm_takes(b));
  b = a;
  b.in = 240;  // not a multiple of the 32-wide K step
  EXPECT_FALSE(gpu::raw::dense_tc_gemm_takes(b));
  b = a;
  b.x_stride = 258;  // rows not 16-byte aligned
  EXPECT_FALSE(gpu::raw::dense_tc_gemm_takes(b));
}

}  // namespace
}  // namespace dsv41::test
