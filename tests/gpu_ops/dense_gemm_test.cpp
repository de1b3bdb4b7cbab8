// The dense GEMM for passes of many rows (kernels/ops/dense_gemm.cu): every output must equal the
// CPU reference engine's own LinBF16 / LinF32 (dot.h order, then bf16 rounding if asked) bit for
// bit, for each CTA tile, with ragged row counts (partial row tiles), output counts that are no
// multiple of the tile, a partial last 256-wide K block, grouped calls (wo_a's form) with strided
// inputs and outputs, bf16, fp16 and fp32 weights, and fp32 activations (inexact products, so the fusing
// of every step matters). The real prefill shapes (wo_a, the compressor's fp32 wkv) are checked
// against the older dense kernel on every output and against the CPU on a subset of rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "gemm_dispatch.h"
#include "harness.h"
#include "model/linears.h"
#include "ops/dense_gemm.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// Forces the dispatch threshold and CTA tile of the dense GEMM while in scope.
using DenseGemmSettings = ScopedGemmDispatch<&gpu::raw::set_dense_gemm_min_rows, &gpu::raw::set_dense_gemm_tile>;

struct DenseCase {
  gpu::DenseType wt;
  int64_t in, out, groups, m;
  bool round;
  int64_t x_pad = 0, y_pad = 0;  // extra floats per row beyond groups*in / groups*out
};

std::string name_of(const DenseCase& c) {
  return std::string(dense_type_name(c.wt)) + " " + std::to_string(c.groups) + "x" +
         std::to_string(c.out) + "x" + std::to_string(c.in) + " m=" + std::to_string(c.m) +
         (c.round ? " round" : "");
}

// Inputs of a case on host and device.
struct DenseInputs {
  std::vector<float> w, x;
  DeviceBuffer dw, dx;
};
DenseInputs make_inputs(const DenseCase& c) {
  Rng rng(static_cast<uint64_t>(c.in * 131 + c.out * 7 + c.groups * 3 + c.m));
  const float sd = 1.0f / std::sqrt(static_cast<float>(c.in));
  DenseInputs d;
  DenseWeights w = dense_weights(rng, c.wt, static_cast<size_t>(c.groups * c.out * c.in), sd);
  d.w = std::move(w.values);
  d.x = rng.f32_vec(static_cast<size_t>(c.m * (c.groups * c.in + c.x_pad)));
  d.dw = std::move(w.device);
  d.dx = DeviceBuffer::from(d.x);
  return d;
}

// CPU reference for the listed rows: [rows.size()][groups*out].
std::vector<float> cpu_rows(const DenseCase& c, const DenseInputs& d, const std::vector<int64_t>& rows) {
  const int64_t xs = c.groups * c.in + c.x_pad, n = static_cast<int64_t>(rows.size());
  std::vector<float> want(static_cast<size_t>(n * c.groups * c.out));
  for (int64_t g = 0; g < c.groups; ++g) {
    auto lin = model::make_dense_linear(
        std::vector<float>(d.w.begin() + g * c.out * c.in, d.w.begin() + (g + 1) * c.out * c.in), c.in, c.out);
    std::vector<float> xg(static_cast<size_t>(n * c.in)), yg(static_cast<size_t>(n * c.out));
    for (int64_t i = 0; i < n; ++i) std::copy_n(&d.x[rows[i] * xs + g * c.in], c.in, &xg[i * c.in]);
    if (c.round) model::linear_bf16(*lin, xg.data(), n, yg.data());
    else lin->forward(xg.data(), n, yg.data());
    for (int64_t i = 0; i < n; ++i) std::copy_n(&yg[i * c.out], c.out, &want[(i * c.groups + g) * c.out]);
  }
  return want;
}

// The case's arguments over its device inputs (y left for the caller).
gpu::DenseArgs dense_args(const DenseCase& c, const DenseInputs& d) {
  gpu::DenseArgs a;
  a.w = d.dw.get();
  a.wt = c.wt;
  a.in = c.in;
  a.out = c.out;
  a.groups = c.groups;
  a.x = d.dx.as<float>();
  a.x_stride = c.groups * c.in + c.x_pad;
  a.m = c.m;
  a.y_stride = c.groups * c.out + c.y_pad;
  a.round_bf16 = c.round;
  return a;
}

// One lin_dense call; the output rows (groups*out values each, the stride gap checked untouched).
std::vector<float> gpu_call(const std::string& what, const DenseCase& c, const DenseInputs& d) {
  gpu::DenseArgs a = dense_args(c, d);
  const int64_t ys = a.y_stride;
  Guarded dy(static_cast<size_t>(c.m * ys) * 4);
  a.y = dy.as<float>();
  gpu::lin_dense(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  expect_guards(what, dy);
  return strided_rows(what, dy, c.m, ys, c.groups * c.out);
}

bool takes(const DenseCase& c, const DenseInputs& d) { return gpu::raw::dense_gemm_takes(dense_args(c, d)); }

// Both tiles against the CPU on every row.
TEST(GpuOps, DenseGemmMatchesCpu) {
  const std::vector<DenseCase> shapes = {
      // grouped as wo_a, K of 3 blocks and a partial fourth (800 = 3*256 + 32), strided rows
      {gpu::DenseType::BF16, 800, 200, 3, 0, true, 8, 5},
      // plain LinF32 (the compressor's form), outputs no multiple of 64, no rounding
      {gpu::DenseType::F32, 512, 136, 1, 0, false},
      // plain LinBF16 with rounding, fewer outputs than one 128 tile
      {gpu::DenseType::BF16, 1024, 72, 1, 0, true},
      // grouped fp32 weights, K shorter than one block
      {gpu::DenseType::F32, 96, 130, 2, 0, true, 4, 1},
      // fp16 weights (an EXL3 checkpoint's Engram wkv), a partial last block, rounded
      {gpu::DenseType::F16, 608, 192, 1, 0, true},
  };
  for (DenseCase c : shapes)
    for (int64_t m : {33, 256, 1024, 1100}) {
      c.m = m;
      const DenseInputs d = make_inputs(c);
      std::vector<int64_t> rows(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r) rows[r] = r;
      const std::vector<float> want = cpu_rows(c, d, rows);
      for (int tile : {1, 2}) {
        const std::string what = name_of(c) + " tile " + std::to_string(tile);
        SCOPED_TRACE(what);
        DenseGemmSettings set(1, tile);
        ASSERT_TRUE(takes(c, d)) << what;
        expect_equal(what, gpu_call(what, c, d), want);
      }
    }
}

// Real prefill shapes: the automatic choice and both tiles against the older dense kernel on every
// output, and against the CPU on the first rows and the last.
TEST(GpuOps, DenseGemmRealShapes) {
  const ModelConfig& cfg = shape_sets().front().cfg;  // the real configuration
  ASSERT_EQ(shape_sets().front().name, "real");
  const int64_t in_g = cfg.num_attention_heads * cfg.head_dim / cfg.o_groups;
  const std::vector<DenseCase> shapes = {
      {gpu::DenseType::BF16, in_g, cfg.o_lora_rank, cfg.o_groups, 1024, true},     // wo_a
      {gpu::DenseType::BF16, in_g, cfg.o_lora_rank, cfg.o_groups, 300, true},      // wo_a, a short pass
      {gpu::DenseType::F32, cfg.hidden_size, cfg.head_dim, 1, 1024, false},         // compressor wkv r>1
      {gpu::DenseType::BF16, cfg.hidden_size, cfg.head_dim, 1, 1024, true},         // compressor wkv r=1
  };
  for (const DenseCase& c : shapes) {
    const DenseInputs d = make_inputs(c);
    std::vector<float> older;
    {
      DenseGemmSettings set(std::numeric_limits<int64_t>::max(), 0);
      ASSERT_FALSE(takes(c, d));
      older = gpu_call(name_of(c) + " older kernel", c, d);
    }
    const std::vector<int64_t> rows = {0, 1, 2, c.m - 1};
    const std::vector<float> want = cpu_rows(c, d, rows);
    const int64_t w = c.groups * c.out;
    std::vector<float> older_rows;
    for (int64_t r : rows) older_rows.insert(older_rows.end(), older.begin() + r * w, older.begin() + (r + 1) * w);
    expect_equal(name_of(c) + " older kernel vs cpu", older_rows, want);
    for (int tile : {0, 1, 2}) {
      const std::string what = name_of(c) + " tile " + std::to_string(tile);
      SCOPED_TRACE(what);
      DenseGemmSettings set(1, tile);
      if (tile == 0 && !takes(c, d)) continue;  // the automatic choice keeps the older kernel here
      ASSERT_TRUE(takes(c, d));
      const std::vector<float> got = gpu_call(what, c, d);
      expect_equal(what + " vs older kernel", got, older);
      std::vector<float> got_rows;
      for (int64_t r : rows) got_rows.insert(got_rows.end(), got.begin() + r * w, got.begin() + (r + 1) * w);
      expect_equal(what + " vs cpu", got_rows, want);
    }
  }
}

// Calls the GEMM cannot take stay on the older kernels: K not a multiple of 32, misaligned rows.
TEST(GpuOps, DenseGemmDeclines) {
  DenseGemmSettings set(1, 2);
  DenseCase c{gpu::DenseType::BF16, 300, 64, 1, 128, true};
  EXPECT_FALSE(takes(c, make_inputs(c)));
  DenseCase odd_stride{gpu::DenseType::F32, 256, 64, 1, 128, false, 2, 0};  // x rows 8-byte aligned only
  EXPECT_FALSE(takes(odd_stride, make_inputs(odd_stride)));
  DenseCase ok{gpu::DenseType::F32, 256, 64, 1, 128, false, 4, 0};
  EXPECT_TRUE(takes(ok, make_inputs(ok)));
}

}  // namespace
}  // namespace dsv41::test
