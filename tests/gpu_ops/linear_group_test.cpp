// Grouped Lin8 / Lin4 launches (up to kLinGroupMax linears over the same input codes in one
// launch): every output must equal its separate lin8 / lin4 call bit for bit, and the CPU reference
// engine's own Linear. Real shapes (wq_a + wkv, shared w1 + w3) and tiny ones with ragged output
// counts (partial warp tiles in every part), m = 1, 2, 4 (one launch per row-group size) and 256
// (the pass grid); Lin4 banks with shared expert ids, empty slots and row groups of 1, 2 and 4.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "harness.h"
#include "linear_inputs.h"
#include "model/linears.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// One FP8 linear of the group: host weights, device copies, the CPU reference's Linear.
struct Fp8Part {
  int64_t out;
  std::vector<uint8_t> codes, scales;
  DeviceBuffer dcodes, dscales;
  std::unique_ptr<TempCheckpoint> ck;
  std::unique_ptr<Linear> lin;
};

void lin8_group_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m) {
  std::string what = tag + " lin8 group in=" + std::to_string(in) + " outs=";
  for (int64_t o : outs) what += std::to_string(o) + ",";
  what += " m=" + std::to_string(m);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 7 + m * 131 + outs.size() * 17 + outs[0]));
  std::vector<Fp8Part> parts(outs.size());
  for (size_t p = 0; p < outs.size(); ++p) {
    Fp8Part& P = parts[p];
    P.out = outs[p];
    P.codes = rng.e4m3_bytes(static_cast<size_t>(in * P.out));
    P.scales = rng.e8m0_bytes(static_cast<size_t>(((P.out + 31) / 32) * ((in + 31) / 32)));
    SafetensorsWriter w;
    w.add("w.weight", DType::F8_E4M3, {P.out, in}, P.codes);
    w.add("w.scale", DType::F8_E8M0, {(P.out + 31) / 32, (in + 31) / 32}, P.scales);
    P.ck = std::make_unique<TempCheckpoint>(w);
    P.lin = model::load_linear(*P.ck->ck, "w", in, P.out);
    P.dcodes = DeviceBuffer::from(P.codes);
    P.dscales = DeviceBuffer::from(P.scales);
  }
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  std::vector<std::unique_ptr<Guarded>> grouped, separate;
  gpu::Lin8GroupArgs g;
  g.count = static_cast<int>(outs.size());
  for (size_t p = 0; p < outs.size(); ++p) {
    const int64_t stride = outs[p] + 1 + static_cast<int64_t>(p);  // gaps that must stay untouched
    grouped.push_back(std::make_unique<Guarded>(static_cast<size_t>(m * stride) * 4));
    separate.push_back(std::make_unique<Guarded>(static_cast<size_t>(m * stride) * 4));
    gpu::Lin8Args& a = g.lin[p];
    a.w = {parts[p].dcodes.as<uint8_t>(), parts[p].dscales.as<uint8_t>(), in, outs[p]};
    a.x_codes = qa.codes.as<uint8_t>();
    a.x_scales = qa.scales.as<float>();
    a.m = m;
    a.y = grouped[p]->as<float>();
    a.y_stride = stride;
    a.round_bf16 = true;
    a.exact_block_sums = true;  // the sequential kernel, bit for bit with the CPU
  }
  gpu::lin8_group(g, nullptr);
  for (size_t p = 0; p < outs.size(); ++p) {
    gpu::Lin8Args a = g.lin[p];
    a.y = separate[p]->as<float>();
    gpu::lin8(a, nullptr);
  }
  sync_ok();
  for (size_t p = 0; p < outs.size(); ++p) {
    const std::string wp = what + " part " + std::to_string(p);
    std::vector<float> want(static_cast<size_t>(m * outs[p]));
    model::linear_bf16(*parts[p].lin, x.data(), m, want.data());
    const std::vector<float> got = strided_rows(wp, *grouped[p], m, g.lin[p].y_stride, outs[p]);
    expect_equal(wp + " grouped vs separate", got, strided_rows(wp, *separate[p], m, g.lin[p].y_stride, outs[p]));
    expect_equal(wp + " grouped vs cpu", got, want);
    expect_guards(wp, *grouped[p]);
  }
}

TEST(GpuLinearGroup, Lin8Groups) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const bool real = s.name == "real";
    for (int64_t m : {1, 2, 4, 256}) {
      if (real && m == 256) continue;  // the CPU reference of 256 real rows takes too long; tiny covers the pass grid
      lin8_group_case(s.name + " wq_a+wkv", c.hidden_size, {c.q_lora_rank, c.head_dim}, m);
      lin8_group_case(s.name + " shared w1+w3", c.hidden_size, {c.moe_intermediate_size, c.moe_intermediate_size}, m);
    }
  }
  // ragged output counts (partial tiles in every part), three parts, K chunks of 32, 16, 8 and 3
  for (int64_t m : {1, 2, 3, 4, 9, 256}) {
    lin8_group_case("ragged", 512, {37, 300, 5}, m);
    lin8_group_case("ragged", 5120, {96, 33}, m);
    lin8_group_case("ragged", 1280, {544, 1, 100}, m);
    lin8_group_case("ragged", 96, {70, 9}, m);
  }
  // more tiles than the grid has warps: warps cross from one part into the next
  lin8_group_case("tall", 64, {60000, 50001}, 1);
  // a group of one is a plain call
  lin8_group_case("single", 512, {300}, 2);
}

struct Fp4Bank {
  int64_t out;
  std::vector<uint8_t> packed, scales;
  DeviceBuffer dpacked, dscales;
  std::unique_ptr<TempCheckpoint> ck;
  std::vector<std::unique_ptr<Linear>> lins;
};

void lin4_group_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t n_experts,
                     const std::vector<int32_t>& ids, int64_t x_row_div) {
  const int64_t rows = static_cast<int64_t>(ids.size()), x_rows = (rows + x_row_div - 1) / x_row_div;
  std::string what = tag + " lin4 group in=" + std::to_string(in) + " outs=";
  for (int64_t o : outs) what += std::to_string(o) + ",";
  what += " rows=" + std::to_string(rows);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 3 + rows * 11 + outs[0] * 5 + outs.size()));
  std::vector<Fp4Bank> banks(outs.size());
  for (size_t p = 0; p < outs.size(); ++p) {
    Fp4Bank& B = banks[p];
    B.out = outs[p];
    B.packed.resize(static_cast<size_t>(n_experts * B.out * in / 2));
    for (auto& b : B.packed) b = static_cast<uint8_t>(rng.g());
    B.scales = rng.e8m0_bytes(static_cast<size_t>(n_experts * B.out * (in / 32)));
    SafetensorsWriter w;
    for (int64_t e = 0; e < n_experts; ++e) {
      const std::string n = "e" + std::to_string(e);
      w.add(n + ".weight", DType::I8, {B.out, in / 2}, B.packed.data() + e * B.out * in / 2,
            static_cast<size_t>(B.out * in / 2));
      w.add(n + ".scale", DType::F8_E8M0, {B.out, in / 32}, B.scales.data() + e * B.out * (in / 32),
            static_cast<size_t>(B.out * (in / 32)));
    }
    B.ck = std::make_unique<TempCheckpoint>(w);
    for (int64_t e = 0; e < n_experts; ++e) B.lins.push_back(model::load_linear(*B.ck->ck, "e" + std::to_string(e), in, B.out));
    B.dpacked = DeviceBuffer::from(B.packed);
    B.dscales = DeviceBuffer::from(B.scales);
  }
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(x_rows * in));
  QuantAct qa(x, x_rows, in);
  DeviceBuffer dids = DeviceBuffer::from(ids);
  std::vector<std::unique_ptr<Guarded>> grouped, separate;
  gpu::Lin4GroupArgs g;
  g.count = static_cast<int>(outs.size());
  for (size_t p = 0; p < outs.size(); ++p) {
    const int64_t stride = outs[p] + 2;
    grouped.push_back(std::make_unique<Guarded>(static_cast<size_t>(rows * stride) * 4));
    separate.push_back(std::make_unique<Guarded>(static_cast<size_t>(rows * stride) * 4));
    gpu::Lin4Args& a = g.lin[p];
    a.w = {banks[p].dpacked.as<uint8_t>(), banks[p].dscales.as<uint8_t>(), in, outs[p], n_experts};
    a.x_codes = qa.codes.as<uint8_t>();
    a.x_scales = qa.scales.as<float>();
    a.rows = rows;
    a.expert_ids = dids.as<int32_t>();
    a.x_row_div = x_row_div;
    a.y = grouped[p]->as<float>();
    a.y_stride = stride;
    a.round_bf16 = true;
  }
  gpu::lin4_group(g, nullptr);
  for (size_t p = 0; p < outs.size(); ++p) {
    gpu::Lin4Args a = g.lin[p];
    a.y = separate[p]->as<float>();
    gpu::lin4(a, nullptr);
  }
  sync_ok();
  for (size_t p = 0; p < outs.size(); ++p) {
    const std::string wp = what + " part " + std::to_string(p);
    std::vector<float> want(static_cast<size_t>(rows * outs[p]), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t e = ids[r];
      if (e >= 0 && e < n_experts)
        model::linear_bf16(*banks[p].lins[e], &x[(r / x_row_div) * in], 1, &want[r * outs[p]]);
    }
    const std::vector<float> got = strided_rows(wp, *grouped[p], rows, g.lin[p].y_stride, outs[p]);
    expect_equal(wp + " grouped vs separate", got, strided_rows(wp, *separate[p], rows, g.lin[p].y_stride, outs[p]));
    expect_equal(wp + " grouped vs cpu", got, want);
    expect_guards(wp, *grouped[p]);
  }
}

TEST(GpuLinearGroup, Lin4BankGroups) {
  // real gate/up banks at decode sizes (one token: distinct experts, rows of one)
  const ModelConfig& c = shape_sets()[0].cfg;
  {
    std::vector<int32_t> ids;
    for (int64_t k = 0; k < c.num_experts_per_tok; ++k) ids.push_back(static_cast<int32_t>((k * 5) % 8));
    lin4_group_case("real w1+w3", c.hidden_size, {c.moe_intermediate_size, c.moe_intermediate_size}, 8, ids,
                    c.num_experts_per_tok);
  }
  // tiny, ragged outputs; an empty slot and an id past the bank (zero rows in every part)
  lin4_group_case("decode", 512, {96, 40}, 8, {3, 0, 7, 5, 1, 6}, 6);
  lin4_group_case("batch2", 512, {96, 33, 5}, 8, {3, 0, 7, 5, 1, 6, 0, 3, -1, 5, 2, 8}, 6);
  // rows in (8, 64]: groups of two; rows > 64: groups of four
  {
    std::vector<int32_t> ids;
    for (int i = 0; i < 30; ++i) ids.push_back(static_cast<int32_t>((i * 7) % 5));
    ids[11] = -1;
    lin4_group_case("pairs gate/up", 256, {200, 72}, 5, ids, 3);
  }
  {
    Rng rng(7);
    std::vector<int32_t> ids;
    for (int i = 0; i < 256; ++i) ids.push_back(static_cast<int32_t>(rng.below(10) < 6 ? 1 : rng.below(6)));
    ids[40] = -1;
    lin4_group_case("pass gate/up", 1280, {40, 72}, 6, ids, 4);
  }
}

}  // namespace
}  // namespace dsv41::test
