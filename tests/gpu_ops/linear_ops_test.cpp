// GPU parity of the linears: Lin8 (FP8 e4m3 + 32x32 E8M0 blocks), the FP4 expert bank (Lin4 with
// expert ids, gate/up and down forms), and the dense LinBF16 (grouped, as wo_a) / LinF32. The CPU
// side is the reference engine's own Linear objects, loaded from a temporary safetensors file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "harness.h"
#include "linear_inputs.h"
#include "model/linears.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

void run_lin8(const std::string& tag, int64_t in, int64_t out, int64_t m, bool time_it) {
  const std::string what = tag + " lin8 " + std::to_string(out) + "x" + std::to_string(in) + " m=" + std::to_string(m);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 3 + out + m));
  std::vector<uint8_t> codes = rng.e4m3_bytes(static_cast<size_t>(in * out));
  std::vector<uint8_t> scales = rng.e8m0_bytes(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)));
  SafetensorsWriter w;
  w.add("w.weight", DType::F8_E4M3, {out, in}, codes);
  w.add("w.scale", DType::F8_E8M0, {(out + 31) / 32, (in + 31) / 32}, scales);
  TempCheckpoint ck(w);
  auto lin = model::load_linear(*ck.ck, "w", in, out);
  std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in)), want(static_cast<size_t>(m * out));
  model::linear_bf16(*lin, x.data(), m, want.data());

  DeviceBuffer dcodes = DeviceBuffer::from(codes), dscales = DeviceBuffer::from(scales);
  QuantAct qa(x, m, in);
  const int64_t y_stride = out + 5;
  Guarded dy(static_cast<size_t>(m * y_stride) * 4);
  gpu::Lin8Args a;
  a.w = {dcodes.as<uint8_t>(), dscales.as<uint8_t>(), in, out};
  a.x_codes = qa.codes.as<uint8_t>();
  a.x_scales = qa.scales.as<float>();
  a.m = m;
  a.y = dy.as<float>();
  a.y_stride = y_stride;
  a.exact_block_sums = true;  // the sequential kernel, bit for bit with the CPU
  gpu::lin8(a, nullptr);
  sync_ok();
  std::vector<float> got_all = dy.host<float>(), got(want.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < out; ++o) got[r * out + o] = got_all[r * y_stride + o];
  expect_equal(what, got, want);  // bit for bit with the CPU engine
  for (int64_t r = 0; r < m; ++r)  // the stride gap stays untouched (poison)
    for (int64_t o = out; o < y_stride; ++o) EXPECT_TRUE(std::isnan(got_all[r * y_stride + o])) << what << ": gap written";
  expect_guards(what, dy);
  if (time_it) report_time(what, time_us([&] { gpu::lin8(a, nullptr); }));
}

TEST(GpuOps, Lin8) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const bool real = s.name == "real";
    run_lin8(s.name, c.hidden_size, c.q_lora_rank, 1, real);                             // wq_a, decode
    run_lin8(s.name, c.hidden_size, c.q_lora_rank, 5, real);                             // wq_a, 5 rows
    run_lin8(s.name, c.o_groups * c.o_lora_rank, c.hidden_size, 2, real);               // wo_b
    run_lin8(s.name, c.moe_intermediate_size, c.hidden_size, 1, real);                  // shared w2
    run_lin8(s.name, c.hidden_size, c.head_dim, 3, false);                               // wkv
  }
}

void run_lin4(const std::string& tag, int64_t in, int64_t out, int64_t n_experts, int64_t n_tok, int64_t top_k, bool gate_up,
              bool time_it) {
  const int64_t rows = n_tok * top_k, x_rows = gate_up ? n_tok : rows;
  const std::string what = tag + " lin4 bank " + std::to_string(out) + "x" + std::to_string(in) + " rows=" +
                           std::to_string(rows) + (gate_up ? " gate/up" : " down");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in + out * 5 + rows));
  std::vector<uint8_t> packed(static_cast<size_t>(n_experts * out * in / 2));
  for (auto& b : packed) b = static_cast<uint8_t>(rng.g());
  std::vector<uint8_t> scales = rng.e8m0_bytes(static_cast<size_t>(n_experts * out * (in / 32)));
  SafetensorsWriter w;
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string p = "e" + std::to_string(e);
    w.add(p + ".weight", DType::I8, {out, in / 2}, packed.data() + e * out * in / 2, static_cast<size_t>(out * in / 2));
    w.add(p + ".scale", DType::F8_E8M0, {out, in / 32}, scales.data() + e * out * (in / 32), static_cast<size_t>(out * (in / 32)));
  }
  TempCheckpoint ck(w);
  std::vector<std::unique_ptr<Linear>> lins;
  for (int64_t e = 0; e < n_experts; ++e) lins.push_back(model::load_linear(*ck.ck, "e" + std::to_string(e), in, out));
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(n_experts));
  ids[static_cast<size_t>(rows - 1)] = -1;  // an empty slot writes zeros
  std::vector<float> x = rng.bf16_vec(static_cast<size_t>(x_rows * in)), want(static_cast<size_t>(rows * out), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    if (ids[r] >= 0) model::linear_bf16(*lins[ids[r]], &x[(gate_up ? r / top_k : r) * in], 1, &want[r * out]);

  DeviceBuffer dpacked = DeviceBuffer::from(packed), dscales = DeviceBuffer::from(scales), dids = DeviceBuffer::from(ids);
  QuantAct qa(x, x_rows, in);
  Guarded dy(want.size() * 4);
  gpu::Lin4Args a;
  a.w = {dpacked.as<uint8_t>(), dscales.as<uint8_t>(), in, out, n_experts};
  a.x_codes = qa.codes.as<uint8_t>();
  a.x_scales = qa.scales.as<float>();
  a.rows = rows;
  a.expert_ids = dids.as<int32_t>();
  a.x_row_div = gate_up ? top_k : 1;
  a.y = dy.as<float>();
  a.y_stride = out;
  gpu::lin4(a, nullptr);
  sync_ok();
  expect_equal(what, dy.host<float>(), want);  // bit for bit with the CPU engine
  expect_guards(what, dy);
  if (time_it) report_time(what, time_us([&] { gpu::lin4(a, nullptr); }));
}

TEST(GpuOps, Lin4ExpertBank) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const bool real = s.name == "real";
    const int64_t E = std::min<int64_t>(c.n_routed_experts, 4), K = c.num_experts_per_tok;
    run_lin4(s.name, c.hidden_size, c.moe_intermediate_size, E, 1, K, true, real);   // w1/w3, decode
    run_lin4(s.name, c.hidden_size, c.moe_intermediate_size, E, 3, K, true, false);  // w1/w3, 3 tokens
    run_lin4(s.name, c.moe_intermediate_size, c.hidden_size, E, 1, K, false, real);  // w2, decode
  }
}

void run_dense(const std::string& tag, gpu::DenseType wt, int64_t in, int64_t out, int64_t groups, int64_t m,
               bool round, bool time_it) {
  const bool bf = wt == gpu::DenseType::BF16;
  const std::string what = tag + (bf ? " linbf16 " : " linf32 ") + std::to_string(groups) + "x" + std::to_string(out) +
                           "x" + std::to_string(in) + " m=" + std::to_string(m);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 7 + out + groups));
  const float sd = 1.0f / std::sqrt(static_cast<float>(in));
  std::vector<float> wv = bf ? rng.bf16_vec(static_cast<size_t>(groups * out * in), sd)
                             : rng.f32_vec(static_cast<size_t>(groups * out * in), sd);
  std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * groups * in));
  std::vector<float> want(static_cast<size_t>(m * groups * out));
  for (int64_t g = 0; g < groups; ++g) {
    auto lin = model::make_dense_linear(std::vector<float>(wv.begin() + g * out * in, wv.begin() + (g + 1) * out * in), in, out);
    std::vector<float> xg(static_cast<size_t>(m * in)), yg(static_cast<size_t>(m * out));
    for (int64_t r = 0; r < m; ++r) std::copy_n(&x[(r * groups + g) * in], in, &xg[r * in]);
    if (round) model::linear_bf16(*lin, xg.data(), m, yg.data());
    else lin->forward(xg.data(), m, yg.data());
    for (int64_t r = 0; r < m; ++r) std::copy_n(&yg[r * out], out, &want[(r * groups + g) * out]);
  }
  DeviceBuffer dw = bf ? DeviceBuffer::from(to_bf16_bits(wv)) : DeviceBuffer::from(wv);
  DeviceBuffer dx = DeviceBuffer::from(x);
  Guarded dy(want.size() * 4);
  gpu::DenseArgs a;
  a.w = dw.get();
  a.wt = wt;
  a.in = in;
  a.out = out;
  a.groups = groups;
  a.x = dx.as<float>();
  a.x_stride = groups * in;
  a.m = m;
  a.y = dy.as<float>();
  a.y_stride = groups * out;
  a.round_bf16 = round;
  gpu::lin_dense(a, nullptr);
  sync_ok();
  expect_close(what, dy.host<float>(), want, round ? kNmseBf16 : kNmseF32);
  expect_guards(what, dy);
  if (time_it) report_time(what, time_us([&] { gpu::lin_dense(a, nullptr); }));
}

TEST(GpuOps, LinDense) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const bool real = s.name == "real";
    const int64_t in_g = c.num_attention_heads * c.head_dim / c.o_groups;
    run_dense(s.name, gpu::DenseType::BF16, in_g, c.o_lora_rank, c.o_groups, 2, true, real);       // wo_a
    run_dense(s.name, gpu::DenseType::BF16, c.hidden_size, c.head_dim, 1, 3, true, real);          // compressor wkv r=1
    run_dense(s.name, gpu::DenseType::BF16, c.hidden_size, c.index_n_heads, 1, 2, true, false);    // weights_proj
    run_dense(s.name, gpu::DenseType::F32, c.hidden_size, c.head_dim, 1, 3, false, real);          // compressor r=2
    // scalar path: K not a multiple of 8, a partial last 256-block, m crossing the row tile
    run_dense(s.name, gpu::DenseType::BF16, 300, 37, 1, 6, true, false);
    run_dense(s.name, gpu::DenseType::F32, 300, 37, 2, 5, false, false);
  }
}

}  // namespace
}  // namespace dsv41::test
