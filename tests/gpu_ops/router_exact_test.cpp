// The router bit for bit: the scores row it leaves in its scratch (unbiased and biased, from the
// gate logits' fma chains, gemm_dot_f32's order) and the selection (ids in selection order and the
// weights), against a host restatement of the kernels' arithmetic: the CPU engine's gate dot
// (gemm_dot_f32) and score formula with exp/log1p rounded once through double as the kernels do
// (ops_common.cuh exp_ref/log1p_ref), and the selection rule of CpuModel::Impl::moe as the kernel
// states it (larger biased score first, NaN above everything, the lower id on ties). Widths with a
// partial last 256-block and with a tail that is not a multiple of 4, rows off the 16-byte grid,
// batches of 2 to 4 tokens (one block per expert for all of them) and on both sides of the 8-token
// gate-row sharing; exact ties inside one lane's candidates and across lanes, and NaN scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "harness.h"
#include "model/ops/dot.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// The score of gate logit z as the kernel forms it (store_score).
float host_score(const gpu::RouterArgs& a, float z) {
  z = z / a.temp;
  if (a.scoring == gpu::Scoring::Sigmoid) return 1.0f / (1.0f + static_cast<float>(std::exp(static_cast<double>(-z))));
  const float sp = z > 20.0f ? z : static_cast<float>(std::log1p(static_cast<double>(static_cast<float>(std::exp(static_cast<double>(z))))));
  return std::sqrt(sp);
}

// Whether biased score u ranks above v in the selection (ties: neither).
bool ranks_above(float u, float v) {
  if (std::isnan(u) || std::isnan(v)) return std::isnan(u) && !std::isnan(v);
  return u > v;
}

struct HostRoute {
  std::vector<float> scratch;  // [n][2E]
  std::vector<int32_t> ids;    // [n][top_k], selection order
  std::vector<float> weights;  // [n][top_k]
};

HostRoute host_route(const gpu::RouterArgs& a, const std::vector<float>& x, const std::vector<float>& gw,
                     const std::vector<float>& bias) {
  const int64_t E = a.n_experts, K = a.top_k, dim = a.dim;
  HostRoute r;
  r.scratch.resize(static_cast<size_t>(a.n * 2 * E));
  for (int64_t t = 0; t < a.n; ++t) {
    float* sc = &r.scratch[t * 2 * E];
    for (int64_t e = 0; e < E; ++e) {
      sc[e] = host_score(a, model::gemm_dot_f32(&gw[e * dim], &x[t * dim], dim));
      sc[E + e] = sc[e] + bias[e];
    }
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t p, int32_t q) { return ranks_above(sc[E + p], sc[E + q]); });
    float sum = 0.0f;
    for (int64_t i = 0; i < K; ++i) sum += sc[order[i]];
    for (int64_t i = 0; i < K; ++i) {
      float w = sc[order[i]];
      if (a.norm_topk && K > 1) w = w / (sum + 1e-20f);
      r.ids.push_back(order[i]);
      r.weights.push_back(w * a.route_scale);
    }
  }
  return r;
}

struct RouterRun {
  std::vector<float> scratch, weights;
  std::vector<int32_t> ids;
};

// The router over x (offset `off` floats into its buffer), with guards around every output.
RouterRun run_router(gpu::RouterArgs a, const std::vector<float>& x, int64_t off, const std::vector<float>& gw,
                     const std::vector<float>& bias, const std::string& what) {
  std::vector<float> xp(x.size() + static_cast<size_t>(off), 0.0f);
  std::copy(x.begin(), x.end(), xp.begin() + off);
  DeviceBuffer dx = DeviceBuffer::from(xp), dgw = DeviceBuffer::from(gw), dbias = DeviceBuffer::from(bias);
  Guarded dids(static_cast<size_t>(a.n * a.top_k) * 4), dw(static_cast<size_t>(a.n * a.top_k) * 4),
      dscratch(static_cast<size_t>(a.n * 2 * a.n_experts) * 4);
  a.x = dx.as<float>() + off;
  a.gate_w = dgw.as<float>();
  a.gate_bias = dbias.as<float>();
  a.ids = dids.as<int32_t>();
  a.weights = dw.as<float>();
  a.scratch = dscratch.as<float>();
  gpu::router(a, nullptr);
  sync_ok();
  for (const Guarded* g : {&dids, &dw, &dscratch}) expect_guards(what, *g);
  return {dscratch.host<float>(), dw.host<float>(), dids.host<int32_t>()};
}

TEST(GpuOpsRouter, ScoresAndSelectionBitExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    for (int64_t dim : {c.hidden_size, c.hidden_size + 44, c.hidden_size + 3}) {
      for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{9}}) {
        for (int64_t off : {int64_t{0}, int64_t{1}}) {
          if (off == 1 && n != 2) continue;
          const std::string what = s.name + " router dim=" + std::to_string(dim) + " n=" + std::to_string(n) +
                                   (off ? " unaligned" : "");
          SCOPED_TRACE(what);
          Rng rng(static_cast<uint64_t>(dim * 31 + n * 7 + off));
          gpu::RouterArgs a = gpu::router_args(c, nullptr, n, nullptr, nullptr, nullptr, nullptr, nullptr);
          a.dim = dim;
          const int64_t E = a.n_experts;
          const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(n * dim));
          const std::vector<float> gw = rng.f32_vec(static_cast<size_t>(E * dim), 1.0f / std::sqrt(static_cast<float>(dim)));
          const std::vector<float> bias = rng.f32_vec(static_cast<size_t>(E), 0.1f);
          const HostRoute want = host_route(a, x, gw, bias);
          const RouterRun got = run_router(a, x, off, gw, bias, what);
          expect_equal(what + " scores", got.scratch, want.scratch);
          expect_equal(what + " ids", got.ids, want.ids);
          expect_equal(what + " weights", got.weights, want.weights);
        }
      }
    }
  }
}

// Exact ties among the biased scores (identical gate rows and biases), spread over one lane's
// candidates (experts l, l + 32, ...) and over several lanes, and NaN scores (a NaN in the gate
// row): NaN first, then the tied group in increasing id.
TEST(GpuOpsRouter, SelectionTiesAndNaN) {
  const ModelConfig& c = shape_sets()[0].cfg;
  const int64_t n = 2, dim = c.hidden_size;
  gpu::RouterArgs a = gpu::router_args(c, nullptr, n, nullptr, nullptr, nullptr, nullptr, nullptr);
  const int64_t E = a.n_experts, K = a.top_k;
  ASSERT_EQ(K, 6) << "the expected lists below are for the released top 6";
  ASSERT_GT(E, 383);
  Rng rng(77);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(n * dim));
  std::vector<float> gw = rng.f32_vec(static_cast<size_t>(E * dim), 1.0f / std::sqrt(static_cast<float>(dim)));
  std::vector<float> bias = rng.f32_vec(static_cast<size_t>(E), 0.1f);
  const std::vector<int32_t> tied = {383, 130, 100, 67, 35, 3, 2};  // lanes 31, 2, 4, 3, 3, 3, 2
  for (int32_t e : tied) {
    std::copy_n(gw.begin(), dim, gw.begin() + e * dim);  // expert 0's row
    bias[e] = 10.0f;
  }
  {
    const std::string what = "router ties";
    const HostRoute want = host_route(a, x, gw, bias);
    const RouterRun got = run_router(a, x, 0, gw, bias, what);
    for (int64_t t = 0; t < n; ++t)
      expect_equal(what + " ids t=" + std::to_string(t), std::vector<int32_t>(got.ids.begin() + t * K, got.ids.begin() + (t + 1) * K),
                   std::vector<int32_t>{2, 3, 35, 67, 100, 130});
    expect_equal(what + " ids", got.ids, want.ids);
    expect_equal(what + " scores", got.scratch, want.scratch);
    expect_equal(what + " weights", got.weights, want.weights);
  }
  {
    const std::string what = "router NaN";
    for (int32_t e : {40, 9}) gw[e * dim + 17] = std::numeric_limits<float>::quiet_NaN();
    const RouterRun got = run_router(a, x, 0, gw, bias, what);
    for (int64_t t = 0; t < n; ++t)
      expect_equal(what + " ids t=" + std::to_string(t), std::vector<int32_t>(got.ids.begin() + t * K, got.ids.begin() + (t + 1) * K),
                   std::vector<int32_t>{9, 40, 2, 3, 35, 67});
    // NaN scores make the normalising sum, hence every weight, NaN
    for (float w : got.weights) EXPECT_TRUE(std::isnan(w)) << what;
  }
}

}  // namespace
}  // namespace dsv41::test
