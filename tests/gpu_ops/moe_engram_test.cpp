// GPU parity of the MoE router, clamped SwiGLU, routed+shared combine, and the Engram row dequant
// and gate. The router/SwiGLU/combine/gate arithmetic lives inline in CpuModel::Impl (block.cpp);
// the references below restate those loops statement by statement with the same primitives
// (gemm_dot_f32, torch_topk_indices, torch_sum_f32), and the row dequant is engram::dequant_row.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "dsv41/engram/row_source.h"
#include "harness.h"
#include "model/cpu_impl.h"
#include "model/ops/dot.h"
#include "model/ops/topk.h"
#include "model/ops/torch_sum.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

TEST(GpuOps, Router) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, dim = c.hidden_size, n = 4;
    const std::string what = s.name + " router E=" + std::to_string(E) + " k=" + std::to_string(K);
    SCOPED_TRACE(what);
    Rng rng(5);
    std::vector<float> x = rng.bf16_vec(static_cast<size_t>(n * dim));
    std::vector<float> gw = rng.f32_vec(static_cast<size_t>(E * dim), 1.0f / std::sqrt(static_cast<float>(dim)));
    std::vector<float> bias = rng.f32_vec(static_cast<size_t>(E), 0.1f);
    for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(3 * dim + i)] *= 16.0f;  // softplus's x > 20 branch
    // reference (CpuModel::Impl::moe selection)
    std::vector<int32_t> want_ids;
    std::vector<float> want_w;
    const float temp = static_cast<float>(c.gate_temp);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> sc(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        float z = model::gemm_dot_f32(&gw[e * dim], &x[t * dim], dim);
        z = z / temp;
        const float sp = z > 20.0f ? z : std::log1p(std::exp(z));
        sc[e] = std::sqrt(sp);
        biased[e] = sc[e] + bias[e];
      }
      const std::vector<int32_t> top = model::torch_topk_indices(biased, K);
      std::vector<float> wt(static_cast<size_t>(K));
      float sum = 0.0f;
      for (int64_t i = 0; i < K; ++i) sum += (wt[i] = sc[top[i]]);
      for (int64_t i = 0; i < K; ++i) {
        if (c.norm_topk_prob && K > 1) wt[i] /= (sum + 1e-20f);
        wt[i] *= static_cast<float>(c.routed_scaling_factor);
      }
      // compare as (id, weight) sorted by id: the combine sums in id order
      std::vector<int64_t> ord(static_cast<size_t>(K));
      std::iota(ord.begin(), ord.end(), 0);
      std::sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b) { return top[a] < top[b]; });
      for (int64_t i : ord) want_ids.push_back(top[i]), want_w.push_back(wt[i]);
    }
    DeviceBuffer dx = DeviceBuffer::from(x), dgw = DeviceBuffer::from(gw), dbias = DeviceBuffer::from(bias);
    Guarded dids(static_cast<size_t>(n * K) * 4), dw(static_cast<size_t>(n * K) * 4);
    DeviceBuffer dscratch(static_cast<size_t>(n * 2 * E) * 4);
    gpu::RouterArgs a = gpu::router_args(c, dx.as<float>(), n, dgw.as<float>(), dbias.as<float>(), dids.as<int32_t>(),
                                         dw.as<float>(), dscratch.as<float>());
    gpu::router(a, nullptr);
    sync_ok();
    std::vector<int32_t> gids = dids.host<int32_t>(), got_ids;
    std::vector<float> gw_out = dw.host<float>(), got_w;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int64_t> ord(static_cast<size_t>(K));
      std::iota(ord.begin(), ord.end(), 0);
      std::sort(ord.begin(), ord.end(), [&](int64_t p, int64_t q) { return gids[t * K + p] < gids[t * K + q]; });
      for (int64_t i : ord) got_ids.push_back(gids[t * K + i]), got_w.push_back(gw_out[t * K + i]);
    }
    expect_equal(what + " ids", got_ids, want_ids);
    expect_close(what + " weights", got_w, want_w, kNmseF32);
    expect_guards(what, dids);
    expect_guards(what, dw);
    if (s.name == "real") report_time(what + " n=4", time_us([&] { gpu::router(a, nullptr); }));
  }
}

TEST(GpuOps, SwigluAndCombine) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t inter = c.moe_intermediate_size, K = c.num_experts_per_tok, dim = c.hidden_size, n = 3, rows = n * K;
    const std::string what = s.name + " swiglu/combine";
    SCOPED_TRACE(what);
    Rng rng(9);
    std::vector<float> g = rng.bf16_vec(static_cast<size_t>(rows * inter), 6.0f), u = rng.bf16_vec(g.size(), 6.0f);
    std::vector<float> wts = rng.f32_vec(static_cast<size_t>(rows), 0.5f);
    const float lim = static_cast<float>(c.swiglu_limit);
    std::vector<float> want(g.size()), want_shared(g.size());
    model::swiglu_rows(g.data(), u.data(), wts.data(), rows, inter, lim, want.data());
    model::swiglu_rows(g.data(), u.data(), nullptr, rows, inter, lim, want_shared.data());
    DeviceBuffer dg = DeviceBuffer::from(g), du = DeviceBuffer::from(u), dwts = DeviceBuffer::from(wts);
    Guarded dout(g.size() * 4), dsh(g.size() * 4);
    gpu::SwigluArgs a;
    a.g = dg.as<float>();
    a.u = du.as<float>();
    a.rows = rows;
    a.inter = inter;
    a.row_weight = dwts.as<float>();
    a.limit = lim;
    a.out = dout.as<float>();
    gpu::swiglu(a, nullptr);
    a.row_weight = nullptr;
    a.out = dsh.as<float>();
    gpu::swiglu(a, nullptr);
    sync_ok();
    expect_close(what + " routed", dout.host<float>(), want, kNmseBf16);
    expect_close(what + " shared", dsh.host<float>(), want_shared, kNmseBf16);
    expect_guards(what, dout);
    expect_guards(what, dsh);

    // combine: routed outputs added in increasing expert id, then the shared expert
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> perm(static_cast<size_t>(c.n_routed_experts));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng.g);
      for (int64_t i = 0; i < K; ++i) ids[t * K + i] = perm[i];
    }
    std::vector<float> routed = rng.bf16_vec(static_cast<size_t>(rows * dim)), shared = rng.bf16_vec(static_cast<size_t>(n * dim));
    std::vector<float> want_y(static_cast<size_t>(n * dim));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> y(static_cast<size_t>(dim), 0.0f);
      for (int64_t e = 0; e < c.n_routed_experts; ++e)
        for (int64_t i = 0; i < K; ++i)
          if (ids[t * K + i] == e)
            for (int64_t d = 0; d < dim; ++d) y[d] += routed[(t * K + i) * dim + d];
      for (int64_t d = 0; d < dim; ++d) want_y[t * dim + d] = bf16_round(y[d] + shared[t * dim + d]);
    }
    DeviceBuffer dr = DeviceBuffer::from(routed), dshared = DeviceBuffer::from(shared), dids = DeviceBuffer::from(ids);
    Guarded dy(want_y.size() * 4);
    gpu::MoeCombineArgs ca;
    ca.routed = dr.as<float>();
    ca.ids = dids.as<int32_t>();
    ca.n = n;
    ca.top_k = K;
    ca.dim = dim;
    ca.shared = dshared.as<float>();
    ca.out = dy.as<float>();
    gpu::moe_combine(ca, nullptr);
    sync_ok();
    expect_close(what + " combine", dy.host<float>(), want_y, kNmseBf16);
    expect_guards(what, dy);
  }
}

TEST(GpuOps, EngramDequantAndGate) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t cols = c.n_engram_columns(), hdim = c.engram_head_dim, hc = c.hc_mult, dim = c.hidden_size, n = 3;
    const int64_t row_bytes = hdim + (hdim + 31) / 32, slots = 40;
    const std::string what = s.name + " engram";
    SCOPED_TRACE(what);
    Rng rng(21);
    // staged table rows: e4m3 bytes + E8M0 scales (byte 0 = 2^-127 included)
    std::vector<uint8_t> staged(static_cast<size_t>(slots * row_bytes));
    for (int64_t r = 0; r < slots; ++r) {
      std::vector<uint8_t> b = rng.e4m3_bytes(static_cast<size_t>(hdim));
      std::copy(b.begin(), b.end(), staged.begin() + r * row_bytes);
      for (int64_t j = 0; j < row_bytes - hdim; ++j) staged[r * row_bytes + hdim + j] = static_cast<uint8_t>(110 + rng.below(20));
    }
    staged[static_cast<size_t>(hdim)] = 0;
    std::vector<int32_t> slot_of(static_cast<size_t>(n * cols));
    for (auto& v : slot_of) v = static_cast<int32_t>(rng.below(slots));
    slot_of[0] = 0;
    std::vector<float> want_rows(static_cast<size_t>(n * cols * hdim));
    for (size_t i = 0; i < slot_of.size(); ++i) engram::dequant_row(&staged[slot_of[i] * row_bytes], hdim, &want_rows[i * hdim]);
    DeviceBuffer dstaged = DeviceBuffer::from(staged), dslots = DeviceBuffer::from(slot_of);
    Guarded drows(want_rows.size() * 4);
    gpu::EngramDequantArgs da;
    da.rows = dstaged.as<uint8_t>();
    da.row_bytes = row_bytes;
    da.slots = dslots.as<int32_t>();
    da.n_out = n * cols;
    da.head_dim = hdim;
    da.out = drows.as<float>();
    gpu::engram_dequant(da, nullptr);
    sync_ok();
    expect_equal(what + " dequant", drows.host<float>(), want_rows);
    expect_guards(what, drows);

    // gate (CpuModel::Impl::engram after the wkv linear)
    std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n * hc * dim)), kv = rng.bf16_vec(static_cast<size_t>(n * (hc + 1) * dim));
    std::vector<float> gate_w = rng.f32_vec(static_cast<size_t>(hc * dim), 0.5f);
    for (int64_t d = 0; d < dim; ++d) kv[static_cast<size_t>(d)] = 0.0f;  // zero key: the |d| floor
    const float eps = static_cast<float>(c.rms_norm_eps);
    const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
    std::vector<float> want_h = h;
    for (int64_t t = 0; t < n; ++t) {
      const float* kvt = &kv[t * (hc + 1) * dim];
      const float* value = kvt + hc * dim;
      for (int64_t j = 0; j < hc; ++j) {
        float* hj = &want_h[(t * hc + j) * dim];
        const float* kj = kvt + j * dim;
        const float* gw = &gate_w[j * dim];
        std::vector<float> hwk(static_cast<size_t>(dim));
        for (int64_t d = 0; d < dim; ++d) hwk[d] = (hj[d] * gw[d]) * kj[d];
        const float dot = model::torch_sum_f32(hwk.data(), dim);
        const float rstd = (1.0f / std::sqrt(model::torch_mean_sq_f32(hj, dim) + eps)) *
                           (1.0f / std::sqrt(model::torch_mean_sq_f32(kj, dim) + eps));
        const float dd = dot * rstd * inv_sqrt_dim;
        const float mag = std::sqrt(std::max(std::fabs(dd), 1e-6f));
        const float gate = 1.0f / (1.0f + std::exp(-std::copysign(mag, dd)));
        for (int64_t d = 0; d < dim; ++d) hj[d] = bf16_round(hj[d] + gate * value[d]);
      }
    }
    Guarded dh = Guarded::from(h);
    DeviceBuffer dkv = DeviceBuffer::from(kv), dgw = DeviceBuffer::from(gate_w);
    gpu::EngramGateArgs ga;
    ga.h = dh.as<float>();
    ga.kv = dkv.as<float>();
    ga.gate_w = dgw.as<float>();
    ga.n = n;
    ga.hc = hc;
    ga.dim = dim;
    ga.eps = eps;
    ga.inv_sqrt_dim = inv_sqrt_dim;
    gpu::engram_gate(ga, nullptr);
    sync_ok();
    expect_close(what + " gate", dh.host<float>(), want_h, kNmseBf16);
    expect_guards(what, dh);
    if (s.name == "real") report_time(what + " dequant n=3", time_us([&] { gpu::engram_dequant(da, nullptr); }));
  }
}

}  // namespace
}  // namespace dsv41::test
