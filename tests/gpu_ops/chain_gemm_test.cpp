// GPU parity of the prefill-sized (register-tiled chain GEMM) forms of the mHC mix dots and the
// router's gate scores, against the CPU reference engine's functions, bit for bit: 64, 100, 512 and
// 700 tokens (ragged token tiles), the mixes GEMM in parts of 256, in the blocked order (the real
// K's 54 parts of 384 with the halved rest) and in P parts; guard bytes around every output.
#include <gtest/gtest.h>

#include <cmath>

#include "dsv41/common/parallel.h"
#include "dsv41/model/mix_gemm_parts.h"
#include "harness.h"
#include "model/ops/dot.h"
#include "model/ops/mhc.h"
#include "model/ops/torch_sum.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

constexpr int64_t kTokenCounts[] = {64, 100, 512, 700};

// The raw scaled mixes (before the Sinkhorn split): the dots in the K order k_parts, times the
// token's rsqrt statistic, as model::hc_mix forms them. The split is left out because its
// softmax exp differs from the C library's expf in the last bit for rare arguments
// (HcMixFewTokensExact); the dots have no such call.
TEST(GpuOpsChainGemm, HcMixDotsPrefillExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t hc = c.hc_mult, dim = c.hidden_size, k = hc * dim, n_mix = (2 + hc) * hc, n_max = 700;
    Rng rng(77);
    std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n_max * k), 1.0f);
    // signed zeros and exact cancellations: a token of zeros, one with negated halves
    for (int64_t j = 0; j < k; ++j) h[static_cast<size_t>(5 * k + j)] = j % 2 ? -0.0f : 0.0f;
    const std::vector<float> fn = rng.f32_vec(static_cast<size_t>(n_mix * k), 2.0f / std::sqrt(static_cast<float>(k)));
    const std::vector<float> base = rng.f32_vec(static_cast<size_t>(n_mix), 1.0f), scale = rng.f32_vec(3, 1.0f);
    Guarded dh = Guarded::from(h), dfn = Guarded::from(fn), dbase = Guarded::from(base), dscale = Guarded::from(scale);
    for (int64_t k_parts : {model::kMixGemmChunks, model::kMixGemmBlocked, int64_t{3}, int64_t{1}}) {
      for (int64_t n : kTokenCounts) {
        const std::string what = s.name + " mix dots n=" + std::to_string(n) + " k_parts=" + std::to_string(k_parts);
        std::vector<float> want(static_cast<size_t>(n * n_mix));
        parallel_for(n, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const float* x = &h[static_cast<size_t>(t * k)];
            const float r = 1.0f / std::sqrt(model::torch_mean_sq_f32(x, k) + static_cast<float>(c.rms_norm_eps));
            for (int64_t i = 0; i < n_mix; ++i)
              want[static_cast<size_t>(t * n_mix + i)] = model::hc_gemm_dot(&fn[static_cast<size_t>(i * k)], x, k, k_parts) * r;
          }
        });
        Guarded dmix(want.size() * 4);
        gpu::HcMixArgs ma = gpu::hc_mix_args(c, dh.as<float>(), n, dfn.as<float>(), dbase.as<float>(), dscale.as<float>(),
                                             dmix.as<float>());
        ma.k_parts = k_parts;
        ma.raw_dots = true;
        gpu::hc_mix(ma, nullptr);
        sync_ok();
        expect_equal(what, dmix.host<float>(), want);
        expect_guards(what, dmix);
      }
    }
  }
}

// The router's scores (scratch: unbiased and biased, from gemm_dot_f32 of the gate row and the
// token, / temp, sqrtsoftplus) bit for bit, with exp and log1p in double rounded once as the
// kernels take them; the selected ids exactly.
TEST(GpuOpsChainGemm, RouterScoresPrefillExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, dim = c.hidden_size;
    Rng rng(411);
    const int64_t n_max = 700;
    const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(n_max * dim));
    const std::vector<float> gw = rng.f32_vec(static_cast<size_t>(E * dim), 1.0f / std::sqrt(static_cast<float>(dim)));
    const std::vector<float> bias = rng.f32_vec(static_cast<size_t>(E), 0.1f);
    const float temp = static_cast<float>(c.gate_temp);
    DeviceBuffer dx = DeviceBuffer::from(x), dgw = DeviceBuffer::from(gw), dbias = DeviceBuffer::from(bias);
    for (int64_t n : kTokenCounts) {
      const std::string what = s.name + " router scores n=" + std::to_string(n);
      std::vector<float> want(static_cast<size_t>(n * 2 * E));
      parallel_for(n, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t e = 0; e < E; ++e) {
            const float z = model::gemm_dot_f32(&gw[static_cast<size_t>(e * dim)], &x[static_cast<size_t>(t * dim)], dim) / temp;
            const float sp = z > 20.0f ? z : static_cast<float>(std::log1p(static_cast<double>(static_cast<float>(std::exp(static_cast<double>(z))))));
            const float sc = std::sqrt(sp);
            want[static_cast<size_t>(t * 2 * E + e)] = sc;
            want[static_cast<size_t>(t * 2 * E + E + e)] = sc + bias[static_cast<size_t>(e)];
          }
      });
      Guarded dids(static_cast<size_t>(n * K) * 4), dw(static_cast<size_t>(n * K) * 4), dscratch(want.size() * 4);
      gpu::RouterArgs a = gpu::router_args(c, dx.as<float>(), n, dgw.as<float>(), dbias.as<float>(), dids.as<int32_t>(),
                                           dw.as<float>(), dscratch.as<float>());
      gpu::router(a, nullptr);
      sync_ok();
      expect_equal(what, dscratch.host<float>(), want);
      // the selection from those scores: the K largest biased scores (ties to the lower id)
      const std::vector<int32_t> ids = dids.host<int32_t>();
      size_t bad = 0;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<int32_t> order(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
        const float* b = &want[static_cast<size_t>(t * 2 * E + E)];
        std::stable_sort(order.begin(), order.end(), [&](int32_t p, int32_t q) { return b[p] > b[q]; });
        std::vector<int32_t> got(ids.begin() + t * K, ids.begin() + (t + 1) * K), top(order.begin(), order.begin() + K);
        std::sort(got.begin(), got.end());
        std::sort(top.begin(), top.end());
        bad += got != top ? 1 : 0;
      }
      EXPECT_EQ(bad, 0u) << what << ": tokens with other selected ids";
      for (const Guarded* g : {&dids, &dw, &dscratch}) expect_guards(what, *g);
    }
  }
}

}  // namespace
}  // namespace dsv41::test
