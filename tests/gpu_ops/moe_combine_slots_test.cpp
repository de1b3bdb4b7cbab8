// The MoE combine at slot counts on both sides of dev::kCombineRegSlots (8: the ids and routed
// values in registers; above it the one-by-one loop), with empty slots (id -1) among them, alone
// (moe_combine) and inside the MoE site's expand (HcExpandArgs::routed): bit-exact with the CPU
// engine's combine (routed rows in increasing expert id, then the shared expert, one bf16 rounding)
// and hc_expand.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "harness.h"
#include "model/ops/mhc.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

TEST(GpuOpsCombine, SlotCountsAndEmptySlotsExact) {
  const ModelConfig& c = shape_sets()[0].cfg;
  const int64_t hc = c.hc_mult, dim = c.hidden_size, k = hc * dim, n_mix = (2 + hc) * hc, n = 3;
  for (int64_t K : {int64_t{1}, int64_t{6}, int64_t{8}, int64_t{9}, int64_t{12}}) {
    const std::string what = "combine top_k=" + std::to_string(K);
    SCOPED_TRACE(what);
    Rng rng(static_cast<uint64_t>(K) + 900);
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> perm(static_cast<size_t>(c.n_routed_experts));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng.g);
      for (int64_t i = 0; i < K; ++i) ids[t * K + i] = perm[i];
    }
    // token 1: its first and last slots empty; token 2: every slot empty when K = 1
    if (K > 1) ids[1 * K] = ids[1 * K + K - 1] = -1;
    if (K == 1) ids[2] = -1;
    const std::vector<float> routed = rng.bf16_vec(static_cast<size_t>(n * K * dim));
    const std::vector<float> shared = rng.bf16_vec(static_cast<size_t>(n * dim));
    const std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n * k));
    const std::vector<float> mix = rng.f32_vec(static_cast<size_t>(n * n_mix), 0.5f);
    std::vector<float> want_y(static_cast<size_t>(n * dim)), want_h = h;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> y(static_cast<size_t>(dim), 0.0f);
      for (int64_t e = 0; e < c.n_routed_experts; ++e)
        for (int64_t i = 0; i < K; ++i)
          if (ids[t * K + i] == e)
            for (int64_t d = 0; d < dim; ++d) y[d] += routed[(t * K + i) * dim + d];
      for (int64_t d = 0; d < dim; ++d) want_y[t * dim + d] = bf16_round(y[d] + shared[t * dim + d]);
      model::HcMix m;
      std::copy_n(&mix[t * n_mix], hc, m.pre);
      std::copy_n(&mix[t * n_mix + hc], hc, m.post);
      std::copy_n(&mix[t * n_mix + 2 * hc], hc * hc, m.comb);
      model::hc_expand(&want_y[t * dim], &want_h[t * k], m, hc, dim);
    }
    DeviceBuffer dr = DeviceBuffer::from(routed), dshared = DeviceBuffer::from(shared), dids = DeviceBuffer::from(ids);
    DeviceBuffer dmix = DeviceBuffer::from(mix);
    Guarded dy(want_y.size() * 4), dh = Guarded::from(h), dy2(want_y.size() * 4);
    gpu::MoeCombineArgs ca{dr.as<float>(), dids.as<int32_t>(), n, K, dim, dshared.as<float>(), dy.as<float>()};
    gpu::moe_combine(ca, nullptr);
    gpu::HcExpandArgs ea;
    ea.h = dh.as<float>();
    ea.mix = dmix.as<float>();
    ea.n = n;
    ea.hc = hc;
    ea.dim = dim;
    ea.routed = dr.as<float>();
    ea.ids = dids.as<int32_t>();
    ea.top_k = K;
    ea.shared = dshared.as<float>();
    ea.y_out = dy2.as<float>();
    gpu::hc_expand(ea, nullptr);
    sync_ok();
    expect_equal(what + " moe_combine", dy.host<float>(), want_y);
    expect_equal(what + " expand y", dy2.host<float>(), want_y);
    expect_equal(what + " expand h", dh.host<float>(), want_h);
    for (const Guarded* g : {&dy, &dh, &dy2}) expect_guards(what, *g);
  }
}

}  // namespace
}  // namespace dsv41::test
