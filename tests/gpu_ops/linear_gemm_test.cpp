// The Lin8 GEMM for passes of many rows (kernels/ops/lin_gemm.cu): every output must equal the CPU
// reference engine's own Lin8 and the GEMV kernel (kernels/ops/lin_fp8.cu) bit for bit, for each
// CTA tile variant, with ragged row counts (partial row tiles), output counts that are no multiple
// of the tile, grouped parts with their own strided outputs, K of 3 blocks and more, and bf16
// rounding on and off. Real shapes are checked against the CPU on a subset of rows (the full CPU
// product of 256 real rows takes too long) and against the GEMV kernel on all of them.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "gemm_dispatch.h"
#include "harness.h"
#include "linear_inputs.h"
#include "model/linears.h"
#include "ops/lin_gemm.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// Forces the dispatch threshold and CTA tile of the GEMM while in scope.
using GemmSettings = ScopedGemmDispatch<&gpu::raw::set_lin8_gemm_min_rows, &gpu::raw::set_lin8_gemm_tile>;
constexpr int64_t kNeverGemm = std::numeric_limits<int64_t>::max();

struct Part {
  int64_t out;
  std::vector<uint8_t> codes, scales;
  DeviceBuffer dcodes, dscales;
  std::unique_ptr<TempCheckpoint> ck;
  std::unique_ptr<Linear> lin;
};

// Rows compared with the CPU: all when the CPU product is small, else a spread that touches the
// first and last row tile and both halves of a tile.
std::vector<int64_t> cpu_rows(int64_t m, int64_t macs_per_row) {
  std::vector<int64_t> r;
  if (m * macs_per_row <= (int64_t{1} << 27)) {
    for (int64_t i = 0; i < m; ++i) r.push_back(i);
    return r;
  }
  for (int64_t i : {int64_t{0}, int64_t{5}, int64_t{33}, int64_t{70}, m / 2 + 3, m - 1})
    if (i < m && (r.empty() || r.back() < i)) r.push_back(i);
  return r;
}

void gemm_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16) {
  std::string what = tag + " in=" + std::to_string(in) + " outs=";
  for (int64_t o : outs) what += std::to_string(o) + ",";
  what += " m=" + std::to_string(m) + (round_bf16 ? " bf16" : " f32");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 11 + m * 7 + outs.size() * 3 + outs[0] + (round_bf16 ? 0 : 1)));
  std::vector<Part> parts(outs.size());
  int64_t sum_out = 0;
  for (size_t p = 0; p < outs.size(); ++p) {
    Part& P = parts[p];
    P.out = outs[p];
    sum_out += P.out;
    P.codes = rng.e4m3_bytes(static_cast<size_t>(in * P.out));
    P.scales = rng.e8m0_bytes(static_cast<size_t>(((P.out + 31) / 32) * (in / 32)));
    SafetensorsWriter w;
    w.add("w.weight", DType::F8_E4M3, {P.out, in}, P.codes);
    w.add("w.scale", DType::F8_E8M0, {(P.out + 31) / 32, in / 32}, P.scales);
    P.ck = std::make_unique<TempCheckpoint>(w);
    P.lin = model::load_linear(*P.ck->ck, "w", in, P.out);
    P.dcodes = DeviceBuffer::from(P.codes);
    P.dscales = DeviceBuffer::from(P.scales);
  }
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);

  gpu::Lin8GroupArgs g;
  g.count = static_cast<int>(outs.size());
  std::vector<int64_t> strides;
  for (size_t p = 0; p < outs.size(); ++p) {
    strides.push_back(outs[p] + 3 + static_cast<int64_t>(p));  // gaps that must stay untouched
    gpu::Lin8Args& a = g.lin[p];
    a.w = {parts[p].dcodes.as<uint8_t>(), parts[p].dscales.as<uint8_t>(), in, outs[p]};
    a.x_codes = qa.codes.as<uint8_t>();
    a.x_scales = qa.scales.as<float>();
    a.m = m;
    a.y_stride = strides[p];
    a.round_bf16 = round_bf16;
    a.exact_block_sums = true;  // the sequential kernels, bit for bit with the CPU
  }
  auto alloc = [&](size_t p) { return std::make_unique<Guarded>(static_cast<size_t>(m * strides[p]) * 4); };

  // the GEMV kernel, each part as its own call
  std::vector<std::vector<float>> gemv(outs.size());
  {
    GemmSettings never(kNeverGemm, 0);
    ASSERT_FALSE(gpu::raw::lin8_gemm_takes(g));
    for (size_t p = 0; p < outs.size(); ++p) {
      auto y = alloc(p);
      gpu::Lin8Args a = g.lin[p];
      a.y = y->as<float>();
      gpu::lin8(a, nullptr);
      sync_ok();
      gemv[p] = strided_rows(what + " gemv", *y, m, strides[p], outs[p]);
    }
  }
  // the CPU reference engine on the checked rows
  const std::vector<int64_t> rows = cpu_rows(m, in * sum_out);
  std::vector<float> xs(rows.size() * in);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&x[rows[i] * in], in, &xs[i * in]);
  std::vector<std::vector<float>> cpu(outs.size());
  for (size_t p = 0; p < outs.size(); ++p) {
    cpu[p].resize(rows.size() * outs[p]);
    if (round_bf16) model::linear_bf16(*parts[p].lin, xs.data(), static_cast<int64_t>(rows.size()), cpu[p].data());
    else parts[p].lin->forward(xs.data(), static_cast<int64_t>(rows.size()), cpu[p].data());
  }

  // tile 0: the automatic choice (the GEMM or, where the time model prefers it, the GEMV kernel);
  // 1..5: each CTA tile forced, the unsplit ones and those that split K over warp groups
  // (tiles beyond the device's shared memory, GB10's K-split ones, are refused:
  // GpuLin8TcGemm.TilesBeyondTheDeviceAreRefused)
  for (int tile = 0; tile <= 5; ++tile) {
    if (tile > 0 && !gpu::raw::lin8_gemm_tile_fits(tile)) continue;
    GemmSettings gemm(1, tile);
    if (tile > 0) ASSERT_TRUE(gpu::raw::lin8_gemm_takes(g));
    std::vector<std::unique_ptr<Guarded>> ys;
    for (size_t p = 0; p < outs.size(); ++p) {
      ys.push_back(alloc(p));
      g.lin[p].y = ys[p]->as<float>();
    }
    if (g.count == 1) gpu::lin8(g.lin[0], nullptr);
    else gpu::lin8_group(g, nullptr);
    sync_ok();
    for (size_t p = 0; p < outs.size(); ++p) {
      const std::string wp = what + " tile " + std::to_string(tile) + " part " + std::to_string(p);
      const std::vector<float> got = strided_rows(wp, *ys[p], m, strides[p], outs[p]);
      expect_equal(wp + " vs gemv", got, gemv[p]);
      std::vector<float> got_rows(rows.size() * outs[p]);
      for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&got[rows[i] * outs[p]], outs[p], &got_rows[i * outs[p]]);
      expect_equal(wp + " vs cpu", got_rows, cpu[p]);
      expect_guards(wp, *ys[p]);
    }
  }
}

TEST(GpuLinearGemm, TinyShapes) {
  const ModelConfig& c = shape_sets()[1].cfg;
  for (int64_t m : {17, 64, 256, 300}) {
    gemm_case("tiny wq_a", c.hidden_size, {c.q_lora_rank}, m, true);
    gemm_case("tiny wq_b", c.q_lora_rank, {c.num_attention_heads * c.head_dim}, m, true);
    gemm_case("tiny wo_b", c.o_groups * c.o_lora_rank, {c.hidden_size}, m, true);
    gemm_case("tiny shared w2", c.moe_intermediate_size, {c.hidden_size}, m, false);
    gemm_case("tiny wq_a+wkv", c.hidden_size, {c.q_lora_rank, c.head_dim}, m, true);
  }
}

TEST(GpuLinearGemm, RaggedAndGrouped) {
  // outputs no multiple of any tile, three parts, K of 3, 16 and 160 blocks
  for (int64_t m : {17, 64, 129, 300}) {
    gemm_case("ragged", 96, {70, 9}, m, true);
    gemm_case("ragged", 512, {37, 300, 5}, m, true);
    gemm_case("ragged", 5120, {96, 33}, m, false);
    gemm_case("ragged", 1280, {544, 1, 100}, m, m % 2 == 0);
  }
  gemm_case("single row", 256, {200}, 1, true);
  gemm_case("one output", 64, {1}, 70, false);
}

TEST(GpuLinearGemm, RealShapes) {
  const ModelConfig& c = shape_sets()[0].cfg;
  const int64_t dim = c.hidden_size, qlr = c.q_lora_rank, hd = c.head_dim, H = c.num_attention_heads;
  gemm_case("real wq_b", qlr, {H * hd}, 256, true);
  gemm_case("real wo_b", c.o_groups * c.o_lora_rank, {dim}, 256, true);
  gemm_case("real wq_a+wkv", dim, {qlr, hd}, 300, true);
  gemm_case("real shared w1+w3", dim, {c.moe_intermediate_size, c.moe_intermediate_size}, 256, true);
  gemm_case("real shared w2", c.moe_intermediate_size, {dim}, 64, true);
  gemm_case("real index wq_b", qlr, {c.index_n_heads * c.index_head_dim}, 17, true);
}

// The dispatch of lin8 / lin8_group: passes of many rows over many outputs take the GEMM, small
// calls the GEMV kernel.
TEST(GpuLinearGemm, Dispatch) {
  GemmSettings defaults(gpu::raw::kLin8GemmMinRows, 0);
  DeviceBuffer codes(4096), scales(64), xc(4096 * 4), xsc(4096);
  gpu::Lin8GroupArgs g;
  g.count = 1;
  g.lin[0].w = {codes.as<uint8_t>(), scales.as<uint8_t>(), 1280, 32768};  // wq_b (pointers never read)
  g.lin[0].x_codes = xc.as<uint8_t>();
  g.lin[0].x_scales = xsc.as<float>();
  g.lin[0].m = gpu::raw::kLin8GemmMinRows;
  g.lin[0].exact_block_sums = true;  // the CUDA-core GEMM's dispatch (the tensor-core one: lin8_tc_gemm_test)
  // At the threshold the time model takes a K-split tile over the GEMV kernel; where those tiles do
  // not fit (GB10's shared memory) the GEMV kernel keeps the call.
  EXPECT_EQ(gpu::raw::lin8_gemm_takes(g), gpu::raw::lin8_gemm_tile_fits(4) || gpu::raw::lin8_gemm_tile_fits(5));
  g.lin[0].m = gpu::raw::kLin8GemmMinRows - 1;
  EXPECT_FALSE(gpu::raw::lin8_gemm_takes(g));
  g.lin[0].m = 256;
  g.lin[0].x_codes = xc.as<uint8_t>() + 32;  // row views of a bigger buffer stay 16-byte aligned...
  EXPECT_TRUE(gpu::raw::lin8_gemm_takes(g));
  g.lin[0].x_codes = xc.as<uint8_t>() + 8;  // ...an unaligned one goes to the GEMV kernel
  EXPECT_FALSE(gpu::raw::lin8_gemm_takes(g));
  g.lin[0].x_codes = xc.as<uint8_t>();
  g.lin[0].w.out = 32;  // too few outputs to fill the GPU: the GEMV kernel
  EXPECT_FALSE(gpu::raw::lin8_gemm_takes(g));
}

}  // namespace
}  // namespace dsv41::test
