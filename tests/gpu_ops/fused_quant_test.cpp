// RMSNorm and SwiGLU kernels that also quantise their output rows (RmsNormArgs / SwigluArgs codes
// and scales, the input of the FP8/FP4 linears reading them): the float outputs must be the CPU
// engine's, and the codes and scales those of the CPU engine's act_quant8 over each output row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"
#include "act_quant_check.h"
#include "harness.h"
#include "model/cpu_impl.h"
#include "model/ops/quant.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// The rows of a strided [rows][stride] buffer, first d values of each.
std::vector<float> packed_rows(const std::vector<float>& v, int64_t rows, int64_t stride, int64_t d) {
  std::vector<float> o(static_cast<size_t>(rows * d));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&v[r * stride], d, &o[r * d]);
  return o;
}

struct NormCase {
  int64_t d, rows, x_stride, out_stride;
  bool in_place;
};

TEST(GpuFusedQuant, RmsNormWritesActQuant8OfItsOutput) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    std::vector<NormCase> cases;
    // The norms whose outputs feed FP8 linears (attention / ffn norm, q_norm, DSpark main_norm)
    // and the other norm widths; in place as the forward runs them, and strided.
    for (int64_t d : {c.hidden_size, c.q_lora_rank, c.head_dim, c.index_head_dim}) {
      cases.push_back({d, 9, d, d, true});
      cases.push_back({d, 5, d + 32, d + 64, false});
    }
    // A row too wide for the staged form: the warp-per-row kernel.
    cases.push_back({c.num_attention_heads * c.head_dim, 6, c.num_attention_heads * c.head_dim,
                     c.num_attention_heads * c.head_dim, true});
    cases.push_back({4096 * 8, 6, 4096 * 8, 4096 * 8, false});
    for (const NormCase& k : cases) {
      const std::string what = s.name + " rms_norm+quant d=" + std::to_string(k.d) + " rows=" + std::to_string(k.rows) +
                               (k.in_place ? " in place" : " strided");
      SCOPED_TRACE(what);
      Rng rng(static_cast<uint64_t>(k.d) * 17 + static_cast<uint64_t>(k.rows));
      std::vector<float> x = rng.bf16_vec(static_cast<size_t>(k.rows * k.x_stride), 3.0f);
      std::vector<float> w = rng.bf16_vec(static_cast<size_t>(k.d));
      for (int64_t i = 0; i < k.d; ++i) x[static_cast<size_t>(k.x_stride + i)] = bf16_round(x[k.x_stride + i] * 1e-6f);
      for (int64_t i = 0; i < 32; ++i) w[static_cast<size_t>(i)] = 0.0f;            // a zero block: amax floor
      for (int64_t i = 32; i < 64 && i < k.d; ++i) w[static_cast<size_t>(i)] *= 1e-7f;  // subnormal codes
      std::vector<float> want(static_cast<size_t>(k.rows * k.d));
      for (int64_t r = 0; r < k.rows; ++r)
        model::rms_norm(&x[r * k.x_stride], w.data(), k.d, c.rms_norm_eps, &want[r * k.d]);
      Guarded dx = Guarded::from(x), dw = Guarded::from(w);
      Guarded dout(static_cast<size_t>(k.rows * k.out_stride) * 4);
      Guarded dcodes(static_cast<size_t>(k.rows * k.d), 0x7F), dscales(static_cast<size_t>(k.rows * k.d / 32) * 4);
      gpu::RmsNormArgs a{dx.as<float>(), k.x_stride, dw.as<float>(), k.in_place ? dx.as<float>() : dout.as<float>(),
                         k.out_stride, k.rows, k.d, static_cast<float>(c.rms_norm_eps)};
      a.codes = dcodes.as<uint8_t>();
      a.scales = dscales.as<float>();
      gpu::rms_norm(a, nullptr);
      sync_ok();
      const std::vector<float> got = packed_rows(k.in_place ? dx.host<float>() : dout.host<float>(), k.rows,
                                                 k.out_stride, k.d);
      expect_equal(what + " out", got, want);
      expect_act_quant(what, want, k.rows, k.d, dcodes, dscales);
      expect_guards(what, k.in_place ? dx : dout);
      if (s.name == "real" && k.in_place && k.rows == 9)
        report_time(what, time_us([&] { gpu::rms_norm(a, nullptr); }));
    }
  }
}

// The SwiGLU of block.cpp run_expert (the CPU engine's swiglu_rows).
std::vector<float> cpu_swiglu(const std::vector<float>& g, const std::vector<float>& u, const float* wts,
                              int64_t rows, int64_t inter, float lim) {
  std::vector<float> out(g.size());
  model::swiglu_rows(g.data(), u.data(), wts, rows, inter, lim, out.data());
  return out;
}

TEST(GpuFusedQuant, SwigluWritesActQuant8OfItsOutput) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t inter = c.moe_intermediate_size, K = c.num_experts_per_tok;
    const float lim = static_cast<float>(c.swiglu_limit);
    // Routed (pair rows with routing weights) and shared rows; decode-sized, prefill-sized, and (tiny)
    // more rows than one grid covers (the grid-stride loop).
    struct Case {
      int64_t rows;
      bool routed;
    };
    std::vector<Case> cases = {{K, true}, {1, false}, {256 * K, true}, {256, false}};
    if (s.name == "tiny") cases.push_back({65535 * 256 / inter + 77, true});
    for (const Case& k : cases) {
      const std::string what = s.name + " swiglu+quant rows=" + std::to_string(k.rows) + (k.routed ? " routed" : " shared");
      SCOPED_TRACE(what);
      Rng rng(static_cast<uint64_t>(k.rows) * 5 + k.routed);
      std::vector<float> g = rng.bf16_vec(static_cast<size_t>(k.rows * inter), 6.0f), u = rng.bf16_vec(g.size(), 6.0f);
      std::vector<float> wts = rng.f32_vec(static_cast<size_t>(k.rows), 0.5f);
      for (int64_t i = 0; i < 32; ++i) u[static_cast<size_t>(i)] = 0.0f;  // a zero block: amax floor
      const std::vector<float> want = cpu_swiglu(g, u, k.routed ? wts.data() : nullptr, k.rows, inter, lim);
      Guarded dg = Guarded::from(g), du = Guarded::from(u);
      DeviceBuffer dwts = DeviceBuffer::from(wts);
      Guarded dcodes(static_cast<size_t>(k.rows * inter), 0x7F), dscales(static_cast<size_t>(k.rows * inter / 32) * 4);
      // out aliases g, as the MoE runs it
      gpu::SwigluArgs a{dg.as<float>(), du.as<float>(), k.rows, inter, k.routed ? dwts.as<float>() : nullptr, lim,
                        dg.as<float>(), dcodes.as<uint8_t>(), dscales.as<float>()};
      gpu::swiglu(a, nullptr);
      sync_ok();
      const std::vector<float> got = dg.host<float>();
      // The floats as the existing SwiGLU parity (an exp may differ in its last bit from libm's);
      // the codes must be act_quant8 of exactly the floats the kernel wrote.
      expect_close(what + " out", got, want, kNmseBf16);
      expect_act_quant(what, got, k.rows, inter, dcodes, dscales);
      expect_guards(what, dg);
    }
  }
}

TEST(GpuFusedQuant, RefusesUnquantisableWidths) {
  DeviceBuffer buf(64 * 4), codes(64);
  gpu::RmsNormArgs a{buf.as<float>(), 48, buf.as<float>(), buf.as<float>(), 48, 1, 48, 1e-6f};
  a.codes = codes.as<uint8_t>();
  a.scales = buf.as<float>();
  EXPECT_THROW(gpu::rms_norm(a, nullptr), Error);
  a.d = 32;
  a.scales = nullptr;
  EXPECT_THROW(gpu::rms_norm(a, nullptr), Error);
  gpu::SwigluArgs sw{buf.as<float>(), buf.as<float>(), 1, 48, nullptr, 0.0f, buf.as<float>(), codes.as<uint8_t>(),
                     buf.as<float>()};
  EXPECT_THROW(gpu::swiglu(sw, nullptr), Error);
}

}  // namespace
}  // namespace dsv41::test
