// GPU parity of the grouped EXL3 MoE kernels against a CPU reference built from the CPU decoder:
// routed experts (per-expert K and codebook) + shared expert, clamped SwiGLU (MODEL.md §5.5),
// routing weights, deterministic sums; both the grouped kernels and the stream path (one K and
// codebook per projection).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "dsv41/common/error.h"
#include "gpu_util.h"

namespace dsv41::test {
namespace {

using ops::ActType;

struct MoeCase {
  int m, topk, n_experts;
  bool shared;
  int int8;       // MoeParams::int8
  bool mixed_cb;  // codebooks vary per expert (else MUL1)
  ActType xt, yt;
  float limit;
  bool bf16_points = false;  // MoeParams::bf16_points (the CPU engine's rounding points)
  // One K and codebook for every gate/up matrix and one for every down matrix, told to the planner
  // (MoeParams::gate_up_bits...), with this codebook; stream = MoeParams::stream.
  bool uniform = false;
  int cb = 2;
  int stream = -1;
};

void run_moe(const MoeCase& c, uint64_t seed) {
  SCOPED_TRACE("m=" + std::to_string(c.m) + " topk=" + std::to_string(c.topk) + " int8=" + std::to_string(c.int8) +
               " mixed=" + std::to_string(c.mixed_cb) + " bf16_points=" + std::to_string(c.bf16_points) +
               " uniform=" + std::to_string(c.uniform) + " cb=" + std::to_string(c.cb) +
               " stream=" + std::to_string(c.stream));
  const auto bf = [&](float v) { return c.bf16_points ? bf16_round(v) : v; };
  const int hidden = 384, inter = 256, x_cols = 380, y_cols = 383;
  const int ne = c.n_experts + (c.shared ? 1 : 0);
  std::vector<std::unique_ptr<RandomMatrix>> gate, up, down;
  std::vector<ops::Exl3Matrix> tg, tu, td;
  int max_bits = 0;
  for (int e = 0; e < ne; ++e) {
    const int kg = c.uniform ? 2 + static_cast<int>(seed) % 3 : 1 + (e * 3 + static_cast<int>(seed)) % 5;
    const int kd = c.uniform ? 2 + static_cast<int>(seed + 1) % 4 : 2 + (e + static_cast<int>(seed)) % 4;
    const int cb = c.uniform ? c.cb : c.mixed_cb ? e % 3 : 2;
    gate.push_back(std::make_unique<RandomMatrix>(hidden, inter, kg, cb, seed * 100 + e * 3 + 0, e == 1));
    up.push_back(std::make_unique<RandomMatrix>(hidden, inter, kg, cb, seed * 100 + e * 3 + 1));
    down.push_back(std::make_unique<RandomMatrix>(inter, hidden, kd, cb, seed * 100 + e * 3 + 2));
    tg.push_back(gate.back()->device());
    tu.push_back(up.back()->device());
    td.push_back(down.back()->device());
    max_bits = std::max({max_bits, kg, kd});
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.m) * x_cols);
  for (auto& v : x) v = nd(rng) * 3.0f;  // large enough that the clamp at the limit is active
  std::vector<uint8_t> xraw;
  x = round_acts(x, c.xt, xraw);
  std::vector<int32_t> ids(static_cast<size_t>(c.m) * c.topk);
  std::vector<float> wts(ids.size());
  for (int t = 0; t < c.m; ++t) {
    std::vector<int> perm(c.n_experts);
    for (int e = 0; e < c.n_experts; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < c.topk; ++j) {
      ids[t * c.topk + j] = perm[j];
      wts[t * c.topk + j] = 0.2f + 0.3f * static_cast<float>(j + 1) / c.topk;
    }
  }
  if (c.m > 1) ids[c.topk] = -1;  // a skipped slot (e.g. a masked expert)

  // CPU reference: per token, experts in increasing id, then the shared expert.
  std::vector<float> yref(static_cast<size_t>(c.m) * hidden, 0.0f);
  for (int t = 0; t < c.m; ++t) {
    std::vector<float> xt(hidden, 0.0f);
    for (int i = 0; i < x_cols; ++i) xt[i] = x[t * x_cols + i];
    std::vector<std::pair<int, float>> sel;
    for (int j = 0; j < c.topk; ++j)
      if (ids[t * c.topk + j] >= 0) sel.push_back({ids[t * c.topk + j], wts[t * c.topk + j]});
    std::sort(sel.begin(), sel.end());
    if (c.shared) sel.push_back({c.n_experts, 1.0f});
    for (auto [e, wt] : sel) {
      std::vector<float> g(inter), u(inter), d(hidden);
      exl3::exl3_matmul_f32(gate[e]->view(), xt.data(), 1, g.data());
      exl3::exl3_matmul_f32(up[e]->view(), xt.data(), 1, u.data());
      for (int i = 0; i < inter; ++i) {
        float gv = bf(g[i]), uv = bf(u[i]);
        if (c.limit > 0) {
          gv = std::min(gv, c.limit);
          uv = std::clamp(uv, -c.limit, c.limit);
        }
        g[i] = c.bf16_points ? bf16_round(wt * (gv / (1.0f + std::exp(-gv)) * uv)) : gv / (1.0f + std::exp(-gv)) * uv * wt;
      }
      exl3::exl3_matmul_f32(down[e]->view(), g.data(), 1, d.data());
      for (int i = 0; i < hidden; ++i) yref[t * hidden + i] += bf(d[i]);
    }
    for (int i = 0; i < hidden; ++i) yref[t * hidden + i] = bf(yref[t * hidden + i]);
  }

  DeviceBuffer d_tg = DeviceBuffer::from(tg), d_tu = DeviceBuffer::from(tu), d_td = DeviceBuffer::from(td);
  DeviceBuffer d_x = DeviceBuffer::from(xraw), d_ids = DeviceBuffer::from(ids), d_w = DeviceBuffer::from(wts);
  const int64_t y_stride = y_cols + 1;
  const size_t es = act_size(c.yt);
  DeviceBuffer d_y(static_cast<size_t>(c.m) * y_stride * es);
  ops::MoeParams p;
  p.gate = d_tg.as<ops::Exl3Matrix>();
  p.up = d_tu.as<ops::Exl3Matrix>();
  p.down = d_td.as<ops::Exl3Matrix>();
  p.n_experts = c.n_experts;
  p.has_shared = c.shared;
  p.hidden = hidden;
  p.inter = inter;
  p.max_bits = max_bits;
  p.swiglu_limit = c.limit;
  p.x = d_x.get();
  p.x_type = c.xt;
  p.m = c.m;
  p.x_cols = p.x_stride = x_cols;
  p.topk_ids = d_ids.as<int32_t>();
  p.topk_weights = d_w.as<float>();
  p.topk = c.topk;
  p.y = d_y.get();
  p.y_type = c.yt;
  p.y_cols = y_cols;
  p.y_stride = y_stride;
  p.int8 = c.int8;
  p.bf16_points = c.bf16_points;
  p.stream = c.stream;
  if (c.uniform) {
    p.gate_up_bits = tg[0].bits;
    p.gate_up_codebook = tg[0].codebook;
    p.down_bits = td[0].bits;
    p.down_codebook = td[0].codebook;
  }
  DeviceBuffer ws(ops::exl3_moe_workspace_bytes(p));
  ops::exl3_workspace_init(ws.get(), ws.bytes(), nullptr);
  p.workspace = ws.get();
  p.workspace_bytes = ws.bytes();
  std::vector<std::vector<uint8_t>> outs;
  for (int rep = 0; rep < 2; ++rep) {
    CUDA_OK(cudaMemset(d_y.get(), 0xFF, d_y.bytes()));
    ops::exl3_moe(p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    outs.push_back(d_y.to_host<uint8_t>(d_y.bytes()));
  }
  EXPECT_EQ(outs[0], outs[1]) << "two identical launches differ";
  std::vector<float> got, want;
  for (int t = 0; t < c.m; ++t) {
    for (int i = 0; i < y_stride; ++i) {
      const uint8_t* e = &outs[0][(static_cast<size_t>(t) * y_stride + i) * es];
      if (i < y_cols) {
        got.push_back(act_to_f32(e, c.yt));
        want.push_back(yref[t * hidden + i]);
      } else {
        for (size_t b = 0; b < es; ++b) ASSERT_EQ(e[b], 0xFF) << "wrote past y_cols";
      }
    }
  }
  if (c.bf16_points)
    for (float g : got) ASSERT_EQ(g, bf16_round(g)) << "bf16_points: an output that is not a bf16 value";
  const double tol = c.yt == ActType::BF16 || c.bf16_points ? 6e-3 : 2e-3;
  const double err = rel_rms(got, want);
  EXPECT_LE(err, tol) << "relative RMS error " << err;
}

TEST(Exl3GpuMoe, SingleTokenInt8) {
  run_moe({1, 6, 12, true, -1, false, ActType::BF16, ActType::F32, 10.0f}, 3);
}

TEST(Exl3GpuMoe, FewTokensInt8AndF16) {
  run_moe({3, 4, 9, true, -1, false, ActType::F16, ActType::F32, 10.0f}, 4);
  run_moe({3, 4, 9, true, 0, false, ActType::F16, ActType::F32, 10.0f}, 5);
  run_moe({4, 2, 5, false, -1, false, ActType::BF16, ActType::BF16, 0.0f}, 6);
}

TEST(Exl3GpuMoe, EightTokensMixedCodebooks) {
  run_moe({8, 3, 7, true, -1, true, ActType::BF16, ActType::F32, 10.0f}, 7);
  run_moe({2, 3, 7, true, -1, true, ActType::F16, ActType::F16, 10.0f}, 8);
}

// The CPU reference engine's rounding points (g, u, weighted activation, each expert's output, the
// sum) with fp32 activations and output, as the CUDA model backend runs it.
TEST(Exl3GpuMoe, Bf16RoundingPoints) {
  run_moe({1, 6, 12, true, -1, false, ActType::F32, ActType::F32, 10.0f, true}, 9);
  run_moe({5, 2, 4, true, -1, true, ActType::F32, ActType::F32, 10.0f, true}, 10);
  run_moe({3, 4, 9, true, 0, false, ActType::F32, ActType::F32, 10.0f, true}, 11);
}

// The stream path (one kind per projection): int8 and f16 fragments, every codebook, fewer slots
// than the grid's blocks expect (skipped ids), the CPU engine's rounding points, no shared expert.
TEST(Exl3GpuMoe, StreamPathMatchesCpu) {
  using A = ActType;
  run_moe({1, 6, 12, true, -1, false, A::BF16, A::F32, 10.0f, false, true, 2, 1}, 12);
  run_moe({3, 4, 9, true, -1, false, A::F16, A::F32, 10.0f, false, true, 2, 1}, 13);
  run_moe({3, 4, 9, true, 0, false, A::F16, A::BF16, 10.0f, false, true, 2, 1}, 14);
  run_moe({8, 3, 7, true, -1, false, A::BF16, A::F32, 10.0f, false, true, 0, 1}, 15);
  run_moe({2, 3, 7, false, -1, false, A::F16, A::F16, 0.0f, false, true, 1, 1}, 16);
  run_moe({1, 6, 12, true, -1, false, A::F32, A::F32, 10.0f, true, true, 2, 1}, 17);
  run_moe({5, 2, 4, true, -1, false, A::F32, A::F32, 10.0f, true, true, 1, 1}, 18);
  // The grouped kernels on the same kinds when the stream path is declined.
  run_moe({3, 4, 9, true, -1, false, A::F32, A::F32, 10.0f, true, true, 2, 0}, 19);
}

// With the kinds told, the planner takes the stream path by itself: the automatic call's output
// is the forced stream call's, bit for bit.
TEST(Exl3GpuMoe, UniformKindsTakeTheStreamPath) {
  const int hidden = 256, inter = 128, ne = 5;
  std::vector<std::unique_ptr<RandomMatrix>> mats;
  std::vector<ops::Exl3Matrix> tg, tu, td;
  for (int e = 0; e < ne; ++e) {
    mats.push_back(std::make_unique<RandomMatrix>(hidden, inter, 3, 2, 700 + e * 3));
    tg.push_back(mats.back()->device());
    mats.push_back(std::make_unique<RandomMatrix>(hidden, inter, 3, 2, 701 + e * 3));
    tu.push_back(mats.back()->device());
    mats.push_back(std::make_unique<RandomMatrix>(inter, hidden, 4, 2, 702 + e * 3));
    td.push_back(mats.back()->device());
  }
  std::mt19937_64 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(2 * hidden);
  for (auto& v : x) v = nd(rng);
  const std::vector<int32_t> ids{0, 3, 2, 1};
  const std::vector<float> wts{0.6f, 0.4f, 0.7f, 0.3f};
  DeviceBuffer d_tg = DeviceBuffer::from(tg), d_tu = DeviceBuffer::from(tu), d_td = DeviceBuffer::from(td);
  DeviceBuffer d_x = DeviceBuffer::from(x), d_ids = DeviceBuffer::from(ids), d_w = DeviceBuffer::from(wts);
  DeviceBuffer d_y(2 * hidden * sizeof(float));
  ops::MoeParams p;
  p.gate = d_tg.as<ops::Exl3Matrix>();
  p.up = d_tu.as<ops::Exl3Matrix>();
  p.down = d_td.as<ops::Exl3Matrix>();
  p.n_experts = ne - 1;
  p.has_shared = true;
  p.hidden = hidden;
  p.inter = inter;
  p.max_bits = 4;
  p.x = d_x.get();
  p.x_type = ActType::F32;
  p.m = 2;
  p.x_cols = p.x_stride = hidden;
  p.topk_ids = d_ids.as<int32_t>();
  p.topk_weights = d_w.as<float>();
  p.topk = 2;
  p.y = d_y.get();
  p.y_type = ActType::F32;
  p.y_cols = p.y_stride = hidden;
  p.gate_up_bits = 3;
  p.gate_up_codebook = 2;
  p.down_bits = 4;
  p.down_codebook = 2;
  std::vector<std::vector<float>> outs;
  std::vector<size_t> ws_bytes;
  for (int stream : {-1, 1, 0}) {
    p.stream = stream;
    ws_bytes.push_back(ops::exl3_moe_workspace_bytes(p));
    DeviceBuffer ws(ws_bytes.back());
    ops::exl3_workspace_init(ws.get(), ws.bytes(), nullptr);
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    ops::exl3_moe(p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    outs.push_back(d_y.to_host<float>(2 * hidden));
  }
  // The two paths lay out their workspaces differently: the automatic plan's is the stream one's.
  EXPECT_EQ(ws_bytes[0], ws_bytes[1]);
  EXPECT_NE(ws_bytes[0], ws_bytes[2]);
  EXPECT_EQ(outs[0], outs[1]) << "the automatic plan is not the stream path";
  // Other k-splits and int8 statistics: the grouped kernels agree to the int8 path's error.
  EXPECT_LE(rel_rms(outs[0], outs[2]), 1e-3);
}

TEST(Exl3GpuMoe, RejectsBadArguments) {
  DeviceBuffer d(1 << 16);
  ops::MoeParams p;
  p.gate = p.up = p.down = d.as<ops::Exl3Matrix>();
  p.n_experts = 4;
  p.hidden = 256;
  p.inter = 256;
  p.max_bits = 3;
  p.x = p.y = d.get();
  p.topk_ids = d.as<int32_t>();
  p.topk_weights = d.as<float>();
  p.topk = 2;
  p.m = 9;  // more than 8 tokens
  p.x_cols = p.x_stride = p.y_cols = p.y_stride = 256;
  EXPECT_THROW(ops::exl3_moe_workspace_bytes(p), Error);
  p.m = 1;
  p.inter = 200;
  EXPECT_THROW(ops::exl3_moe_workspace_bytes(p), Error);
  p.inter = 256;
  p.stream = 1;  // the stream path without uniform kinds
  EXPECT_THROW(ops::exl3_moe_workspace_bytes(p), Error);
  p.gate_up_bits = p.down_bits = 9;
  EXPECT_THROW(ops::exl3_moe_workspace_bytes(p), Error);
  p.stream = -1;
  p.workspace = d.get();
  p.workspace_bytes = 8;
  EXPECT_THROW(ops::exl3_moe(p, nullptr), Error);
}

}  // namespace
}  // namespace dsv41::test
