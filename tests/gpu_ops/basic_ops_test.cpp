// GPU parity of RMSNorm, RoPE (plain and YaRN, forward and inverse), ActQuant8, QDQ8/4a/4b and the
// mHC mix / collapse / expand against the CPU reference engine's functions (src/model/ops).
#include <gtest/gtest.h>

#include "harness.h"
#include "model/cpu_impl.h"
#include "model/ops/mhc.h"
#include "model/ops/quant.h"
#include "model/ops/rope.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

TEST(GpuOps, RmsNorm) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    for (int64_t d : {c.hidden_size, c.q_lora_rank, c.head_dim, c.index_head_dim}) {
      const std::string what = s.name + " rms_norm d=" + std::to_string(d);
      SCOPED_TRACE(what);
      Rng rng(static_cast<uint64_t>(d) * 31 + 7);
      const int64_t rows = 9;
      std::vector<float> x = rng.bf16_vec(static_cast<size_t>(rows * d), 3.0f), w = rng.bf16_vec(static_cast<size_t>(d));
      for (int64_t i = 0; i < d; ++i) x[static_cast<size_t>(d + i)] = bf16_round(x[d + i] * 1e-6f);  // tiny row
      x[static_cast<size_t>(2 * d + 5)] = NAN;  // a NaN row: NaN everywhere on both sides
      std::vector<float> want(x.size());
      for (int64_t r = 0; r < rows; ++r) model::rms_norm(&x[r * d], w.data(), d, c.rms_norm_eps, &want[r * d]);
      Guarded dx = Guarded::from(x), dw = Guarded::from(w), dout(x.size() * 4);
      gpu::RmsNormArgs a;
      a.x = dx.as<float>();
      a.x_stride = d;
      a.w = dw.as<float>();
      a.out = dout.as<float>();
      a.out_stride = d;
      a.rows = rows;
      a.d = d;
      a.eps = static_cast<float>(c.rms_norm_eps);
      gpu::rms_norm(a, nullptr);
      sync_ok();
      expect_close(what, dout.host<float>(), want, kNmseBf16);
      expect_guards(what, dout);
      if (s.name == "real") report_time(what + " x9", time_us([&] { gpu::rms_norm(a, nullptr); }));
    }
  }
}

TEST(GpuOps, Rope) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t H = c.num_attention_heads, hd = c.head_dim, rd = c.qk_rope_head_dim, n = 5;
    for (int64_t ratio : {int64_t{0}, int64_t{2}}) {
      const model::RopeTable table = model::RopeTable::for_ratio(c, ratio);
      for (bool inverse : {false, true}) {
        const std::string what = s.name + " rope ratio=" + std::to_string(ratio) + (inverse ? " inverse" : "");
        SCOPED_TRACE(what);
        Rng rng(static_cast<uint64_t>(ratio * 2 + inverse) + 11);
        std::vector<float> q = rng.bf16_vec(static_cast<size_t>(n * H * hd));
        std::vector<int64_t> pos(static_cast<size_t>(n));
        for (auto& p : pos) p = rng.below(c.max_position_embeddings);
        pos[0] = 0;
        std::vector<float> want = q;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = 0; h < H; ++h) table.apply(&want[(t * H + h) * hd + hd - rd], pos[t], inverse);
        Guarded dq = Guarded::from(q);
        DeviceBuffer dpos = DeviceBuffer::from(pos), dfreq = DeviceBuffer::from(table.freqs());
        gpu::RopeArgs a;
        a.v = dq.as<float>() + hd - rd;
        a.rows = n;
        a.vecs = H;
        a.vec_stride = hd;
        a.row_stride = H * hd;
        a.freqs = dfreq.as<float>();
        a.rope_dim = rd;
        a.positions = dpos.as<int64_t>();
        a.inverse = inverse;
        gpu::rope(a, nullptr);
        sync_ok();
        expect_close(what, dq.host<float>(), want, kNmseBf16);
        expect_guards(what, dq);
      }
    }
  }
}

TEST(GpuOps, ActQuant8Exact) {
  for (const Shapes& s : shape_sets()) {
    for (int64_t k : {s.cfg.hidden_size, s.cfg.moe_intermediate_size, s.cfg.q_lora_rank}) {
      const std::string what = s.name + " act_quant8 k=" + std::to_string(k);
      SCOPED_TRACE(what);
      Rng rng(static_cast<uint64_t>(k) + 3);
      const int64_t rows = 6;
      std::vector<float> x = rng.bf16_vec(static_cast<size_t>(rows * k), 2.0f);
      for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;                     // amax floor
      for (int64_t i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = bf16_round(x[i] * 1e-7f);  // subnormal codes
      for (int64_t i = 64; i < 96; ++i) x[static_cast<size_t>(i)] = bf16_round(x[i] * 3e4f);   // large
      const int64_t nb = k / 32;
      std::vector<float> want_codes(x.size()), want_scales(static_cast<size_t>(rows * nb));
      for (int64_t r = 0; r < rows; ++r) model::act_quant8(&x[r * k], k, &want_codes[r * k], &want_scales[r * nb]);
      Guarded dx = Guarded::from(x), dcodes(x.size(), 0x7F), dscales(want_scales.size() * 4);
      gpu::ActQuantArgs a;
      a.x = dx.as<float>();
      a.rows = rows;
      a.k = k;
      a.x_stride = k;
      a.codes = dcodes.as<uint8_t>();
      a.scales = dscales.as<float>();
      gpu::act_quant8(a, nullptr);
      sync_ok();
      std::vector<uint8_t> bytes = dcodes.host<uint8_t>();
      std::vector<float> got_codes(bytes.size());
      for (size_t i = 0; i < bytes.size(); ++i) got_codes[i] = e4m3_to_f32(bytes[i]);
      expect_equal(what + " codes", got_codes, want_codes);
      expect_equal(what + " scales", dscales.host<float>(), want_scales);
      expect_guards(what, dcodes);
      expect_guards(what, dscales);
      if (s.name == "real") report_time(what + " x6", time_us([&] { gpu::act_quant8(a, nullptr); }));
    }
  }
}

TEST(GpuOps, QdqExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    struct Case {
      gpu::QdqKind kind;
      int64_t k;
      const char* name;
      void (*ref)(float*, int64_t);
    };
    for (const Case& cs : {Case{gpu::QdqKind::Q8, c.head_dim, "qdq8", model::qdq8_inplace},
                           Case{gpu::QdqKind::Q4a, c.index_head_dim, "qdq4a", model::qdq4a_inplace},
                           Case{gpu::QdqKind::Q4b, c.head_dim, "qdq4b", model::qdq4b_inplace}}) {
      const std::string what = s.name + " " + cs.name + " k=" + std::to_string(cs.k);
      SCOPED_TRACE(what);
      Rng rng(static_cast<uint64_t>(cs.kind) * 5 + 1);
      const int64_t rows = 11, stride = cs.k + 32;
      std::vector<float> x(static_cast<size_t>(rows * stride));
      for (auto& v : x) v = bf16_round(rng.normal(1.5f));
      for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;
      for (int64_t i = 32; i < 48; ++i) x[static_cast<size_t>(i)] = bf16_round(x[i] * 1e-9f);
      for (int64_t i = 64; i < 96; ++i) x[static_cast<size_t>(i)] = bf16_round(rng.uniform(-6.0f, 6.0f) * 0.25f);
      std::vector<float> want = x;
      for (int64_t r = 0; r < rows; ++r) cs.ref(&want[r * stride], cs.k);
      Guarded dx = Guarded::from(x);
      gpu::QdqArgs a;
      a.x = dx.as<float>();
      a.rows = rows;
      a.k = cs.k;
      a.stride = stride;
      a.kind = cs.kind;
      gpu::qdq(a, nullptr);
      sync_ok();
      expect_equal(what, dx.host<float>(), want);
      expect_guards(what, dx);
    }
  }
}

TEST(GpuOps, HcMixCollapseExpand) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t hc = c.hc_mult, dim = c.hidden_size, k = hc * dim, n_mix = (2 + hc) * hc, n = 3;
    const std::string what = s.name + " hc";
    SCOPED_TRACE(what);
    Rng rng(77);
    std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n * k), 1.0f);
    std::vector<float> fn = rng.f32_vec(static_cast<size_t>(n_mix * k), 1.0f / std::sqrt(static_cast<float>(k)));
    std::vector<float> base = rng.f32_vec(static_cast<size_t>(n_mix), 0.5f), scale = rng.f32_vec(3, 0.5f);
    std::vector<float> pre_in = rng.f32_vec(static_cast<size_t>(n * hc), 0.5f), y = rng.bf16_vec(static_cast<size_t>(n * dim));
    // CPU: mix per token, collapse with the carried pre, expand with the mix.
    std::vector<float> want_mix(static_cast<size_t>(n * n_mix)), want_x(static_cast<size_t>(n * dim)), want_h = h;
    for (int64_t t = 0; t < n; ++t) {
      model::HcMix m;
      model::hc_mix(&h[t * k], hc, dim, fn.data(), base.data(), scale.data(), c.hc_sinkhorn_iters, c.hc_eps,
                    c.rms_norm_eps, m);
      std::copy_n(m.pre, hc, &want_mix[t * n_mix]);
      std::copy_n(m.post, hc, &want_mix[t * n_mix + hc]);
      std::copy_n(m.comb, hc * hc, &want_mix[t * n_mix + 2 * hc]);
      model::hc_collapse(&h[t * k], &pre_in[t * hc], hc, dim, &want_x[t * dim]);
      model::hc_expand(&y[t * dim], &want_h[t * k], m, hc, dim);
    }
    Guarded dh = Guarded::from(h), dfn = Guarded::from(fn), dbase = Guarded::from(base), dscale = Guarded::from(scale);
    Guarded dmix(want_mix.size() * 4), dpre = Guarded::from(pre_in), dx(want_x.size() * 4), dy = Guarded::from(y);
    gpu::HcMixArgs ma = gpu::hc_mix_args(c, dh.as<float>(), n,
                                         dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), dmix.as<float>());
    gpu::hc_mix(ma, nullptr);
    gpu::HcCollapseArgs ca;
    ca.h = dh.as<float>();
    ca.w = dpre.as<float>();
    ca.w_stride = hc;
    ca.n = n;
    ca.hc = hc;
    ca.dim = dim;
    ca.out = dx.as<float>();
    gpu::hc_collapse(ca, nullptr);
    sync_ok();
    expect_close(what + " mix", dmix.host<float>(), want_mix, kNmseF32);
    expect_close(what + " collapse", dx.host<float>(), want_x, kNmseBf16);
    // Expand from the CPU's mix so this check isolates the expand kernel.
    Guarded dmix_ref = Guarded::from(want_mix);
    gpu::HcExpandArgs ea;
    ea.y = dy.as<float>();
    ea.h = dh.as<float>();
    ea.mix = dmix_ref.as<float>();
    ea.n = n;
    ea.hc = hc;
    ea.dim = dim;
    gpu::hc_expand(ea, nullptr);
    sync_ok();
    expect_close(what + " expand", dh.host<float>(), want_h, kNmseBf16);
    for (const Guarded* g : {&dmix, &dx, &dh}) expect_guards(what, *g);
    if (s.name == "real") {
      report_time(what + " mix n=3", time_us([&] { gpu::hc_mix(ma, nullptr); }));
      report_time(what + " collapse n=3", time_us([&] { gpu::hc_collapse(ca, nullptr); }));
    }
  }
}

// The pre/post sigmoids follow the reference call's vector body / scalar tail split per token
// (src/model/ops/mhc.h HcMixArithmetic): a prefill chunk of the rows of a longer call, a decode
// row, and the default (all vectorised); with the mixes GEMM in parts of 256 and in P parts of
// 64-element units and in the blocked order (HcMixArithmetic::k_parts). Bit-exact against the CPU engine.
TEST(GpuOps, HcMixSigmoidPathsExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t hc = c.hc_mult, dim = c.hidden_size, k = hc * dim, n_mix = (2 + hc) * hc, n = 9;
    Rng rng(91);
    const std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n * k), 1.0f);
    const std::vector<float> fn = rng.f32_vec(static_cast<size_t>(n_mix * k), 2.0f / std::sqrt(static_cast<float>(k)));
    const std::vector<float> base = rng.f32_vec(static_cast<size_t>(n_mix), 1.0f), scale = rng.f32_vec(3, 1.0f);
    Guarded dh = Guarded::from(h), dfn = Guarded::from(fn), dbase = Guarded::from(base), dscale = Guarded::from(scale);
    const struct {
      int64_t t_ref0, rows_ref, k_parts;
    } calls[] = {{0, 9, 0}, {5, 13, 0}, {0, 1, 0}, {0, -1, 0}, {2, 40, 0}, {290, 300, 3}, {290, 300, -1}, {0, 9, 5}, {4, 9, 1}};
    for (const auto& call : calls) {
      const std::string what = s.name + " mix t_ref0=" + std::to_string(call.t_ref0) + " rows_ref=" +
                               std::to_string(call.rows_ref) + " k_parts=" + std::to_string(call.k_parts);
      std::vector<float> want(static_cast<size_t>(n * n_mix));
      for (int64_t t = 0; t < n; ++t) {
        model::HcMix m;
        const model::HcMixArithmetic ar = call.rows_ref < 0
                                              ? model::HcMixArithmetic{hc, call.k_parts}
                                              : model::hc_mix_arithmetic(hc, call.t_ref0 + t, call.rows_ref, call.k_parts);
        model::hc_mix(&h[t * k], hc, dim, fn.data(), base.data(), scale.data(), c.hc_sinkhorn_iters, c.hc_eps,
                      c.rms_norm_eps, ar, m);
        std::copy_n(m.pre, hc, &want[t * n_mix]);
        std::copy_n(m.post, hc, &want[t * n_mix + hc]);
        std::copy_n(m.comb, hc * hc, &want[t * n_mix + 2 * hc]);
      }
      Guarded dmix(want.size() * 4);
      gpu::HcMixArgs ma = gpu::hc_mix_args(c, dh.as<float>(), n,
                                           dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), dmix.as<float>());
      ma.t_ref0 = call.t_ref0;
      ma.rows_ref = call.rows_ref;
      ma.k_parts = call.k_parts;
      gpu::hc_mix(ma, nullptr);
      sync_ok();
      expect_equal(what, dmix.host<float>(), want);
      expect_guards(what, dmix);
    }
  }
}

}  // namespace
}  // namespace dsv41::test
