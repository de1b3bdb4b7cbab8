// Micro-benchmark of the latency-bound small kernels of a decode step at the real shapes
// (configs/deepseek-v4.1-flash.json): RMSNorm, the mHC mix / collapse / expand, the router, SwiGLU,
// the MoE combine (alone and inside the MoE site's expand), the Engram gate, ActQuant8 and RoPE, at
// m = 1, 2, 4 token rows and at the prefill pass size 256. Prints µs per call (mean of back-to-back
// launches), the bytes each call must move, GB/s and the share of the 4.3 TB/s copy ceiling, and
// the µs/call of the decode profile before the staged kernels (bench/RESULTS.md, batch 1, CUPTI
// kernel time) where it has one. µs per call are given launched back to back on a stream and
// replayed from a CUDA graph.
//
// Programmatic dependent launch (kernels/ops/pdl.cuh) is on unless DSV41_NO_PDL is set: run the
// benchmark both ways to see its gain (the header line says which). "layer chain" runs a decode
// layer's sequence of small ops (18 kernels, as the forward orders them, without the linears and
// attention) per call: its stream and graph columns show the boundaries between different kernels.
//
// Every op's output is checked once (at m = 2) against the CPU reference engine's function; the
// exit status is 1 when a check fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "harness.h"
#include "model/cpu_impl.h"
#include "model/ops/dot.h"
#include "model/ops/mhc.h"
#include "model/ops/quant.h"
#include "model/ops/rope.h"
#include "model/ops/topk.h"
#include "model/ops/torch_sum.h"
#if __has_include("dsv41/ops/gpu_collapse_norm.h")
#include "dsv41/ops/gpu_collapse_norm.h"
#define DSV41_BENCH_HAS_COLLAPSE_NORM 1
#else
#define DSV41_BENCH_HAS_COLLAPSE_NORM 0
#endif

using namespace dsv41;
using namespace dsv41::test;
namespace gpu = dsv41::ops::gpu;

namespace {

constexpr double kCopyCeiling = 4.3e12;
constexpr int64_t kCheckRows = 2;
int g_failed = 0;

// µs per call of fn two ways: launched back to back on a stream (what an eager forward pays: on
// the device machine one launch costs ~4 µs of host time, which bounds single-kernel ops from
// below), and replayed from a CUDA graph of kGraphCalls calls (the kernels' own time plus the
// boundaries between them: what a captured decode step pays).
constexpr int kStreamCalls = 200, kGraphCalls = 100, kGraphLaunches = 5;
struct Timing {
  double stream_us = 0.0, graph_us = 0.0;
};
Timing time_calls(const std::function<void(cudaStream_t)>& fn) {
  Timing t;
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess || cudaEventCreate(&a) != cudaSuccess ||
      cudaEventCreate(&b) != cudaSuccess) {
    std::printf("CUDA stream/event creation failed\n");
    std::exit(1);
  }
  fn(s);  // the first call also raises shared-memory limits (outside any capture)
  cudaStreamSynchronize(s);
  float ms = 0.0f;
  cudaEventRecord(a, s);
  for (int i = 0; i < kStreamCalls; ++i) fn(s);
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  cudaEventElapsedTime(&ms, a, b);
  t.stream_us = 1000.0 * ms / kStreamCalls;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    for (int i = 0; i < kGraphCalls; ++i) fn(s);
    ok = cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
  }
  if (ok) {
    cudaGraphLaunch(ge, s);  // warm-up
    cudaEventRecord(a, s);
    for (int i = 0; i < kGraphLaunches; ++i) cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    ok = cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess;
    t.graph_us = ok ? 1000.0 * ms / (kGraphCalls * kGraphLaunches) : -1.0;
  } else {
    std::printf("  (graph capture failed: %s)\n", cudaGetErrorString(cudaGetLastError()));
    t.graph_us = -1.0;
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return t;
}

// One table row; GB/s from the graph time (the stream time when no graph could be made).
void report(const char* op, int64_t m, const std::function<void(cudaStream_t)>& fn, double bytes, double before_us) {
  const Timing t = time_calls(fn);
  const double us = t.graph_us > 0 ? t.graph_us : t.stream_us;
  const double gbs = bytes / (us * 1e-6) / 1e9;
  char before[32] = "-";
  if (before_us > 0) std::snprintf(before, sizeof before, "%.1f", before_us);
  std::printf("%-14s %5lld %10.2f %10.2f %12.0f %9.1f %7.2f %% %10s\n", op, static_cast<long long>(m), t.stream_us, t.graph_us,
              bytes, gbs, 100.0 * gbs * 1e9 / kCopyCeiling, before);
}

void check(const std::string& what, bool ok, const std::string& detail) {
  std::printf("  [check] %-40s %s %s\n", what.c_str(), ok ? "ok" : "FAILED", detail.c_str());
  if (!ok) ++g_failed;
}
void check_equal(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0) ++bad;
  check(what, bad == 0 && got.size() == want.size(), std::to_string(want.size() - bad) + "/" + std::to_string(want.size()) + " identical");
}
void check_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double max_nmse) {
  const Compare c = compare(got, want);
  check(what, c.mismatched_nonfinite == 0 && c.nmse <= max_nmse,
        "nmse=" + std::to_string(c.nmse) + " exact " + std::to_string(c.exact) + "/" + std::to_string(c.total));
}


// The collapse and RMSNorm pair of a decode site: one launch where the fused op exists.
void collapse_norm(const gpu::HcCollapseArgs& ca, const gpu::RmsNormArgs& na, cudaStream_t st) {
#if DSV41_BENCH_HAS_COLLAPSE_NORM
  gpu::hc_collapse_rms_norm(ca, na, st);
#else
  gpu::hc_collapse(ca, st);
  gpu::rms_norm(na, st);
#endif
}

}  // namespace

int main() {
  const ModelConfig c = load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  const int64_t dim = c.hidden_size, hc = c.hc_mult, k = hc * dim, n_mix = (2 + hc) * hc;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, inter = c.moe_intermediate_size;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, rd = c.qk_rope_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<int64_t> ms = {1, 2, 4, 256};
  const int64_t m_max = 256;
  Rng rng(2026);

  // Inputs sized for the largest m; every op runs on the first m rows.
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m_max * dim), 2.0f), nw = rng.bf16_vec(static_cast<size_t>(dim));
  const std::vector<float> h = rng.bf16_vec(static_cast<size_t>(m_max * k));
  const std::vector<float> fn = rng.f32_vec(static_cast<size_t>(n_mix * k), 2.0f / std::sqrt(static_cast<float>(k)));
  const std::vector<float> base = rng.f32_vec(static_cast<size_t>(n_mix)), scale = rng.f32_vec(3);
  const std::vector<float> gw = rng.f32_vec(static_cast<size_t>(E * dim), 1.0f / std::sqrt(static_cast<float>(dim)));
  const std::vector<float> gb = rng.f32_vec(static_cast<size_t>(E), 0.1f);
  const std::vector<float> g = rng.bf16_vec(static_cast<size_t>(m_max * K * inter), 4.0f), u = rng.bf16_vec(g.size(), 4.0f);
  const std::vector<float> rw = rng.f32_vec(static_cast<size_t>(m_max * K), 0.5f);
  const std::vector<float> routed = rng.bf16_vec(static_cast<size_t>(m_max * K * dim)), shared = rng.bf16_vec(static_cast<size_t>(m_max * dim));
  std::vector<int32_t> ids(static_cast<size_t>(m_max * K));
  for (int64_t t = 0; t < m_max; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.g);
    std::copy_n(perm.begin(), K, ids.begin() + t * K);
  }
  // The CPU engine's combine of token t's rows: routed rows in increasing expert id, then the shared
  // expert, one bf16 rounding.
  auto combine_row = [&](int64_t t, float* out) {
    std::vector<int64_t> ord(static_cast<size_t>(K));
    std::iota(ord.begin(), ord.end(), 0);
    std::sort(ord.begin(), ord.end(), [&](int64_t p, int64_t r) { return ids[t * K + p] < ids[t * K + r]; });
    for (int64_t d = 0; d < dim; ++d) {
      float y = 0.0f;
      for (int64_t i : ord) y += routed[(t * K + i) * dim + d];
      out[d] = bf16_round(y + shared[t * dim + d]);
    }
  };
  const std::vector<float> kv = rng.bf16_vec(static_cast<size_t>(m_max * (hc + 1) * dim)), egw = rng.f32_vec(static_cast<size_t>(hc * dim), 0.5f);
  std::vector<float> mixv = rng.f32_vec(static_cast<size_t>(m_max * n_mix), 0.5f);
  const std::vector<float> q = rng.bf16_vec(static_cast<size_t>(m_max * H * hd));
  std::vector<int64_t> pos(static_cast<size_t>(m_max));
  for (auto& p : pos) p = rng.below(65536);
  const model::RopeTable rope_table = model::RopeTable::for_ratio(c, 0);

  DeviceBuffer dx = DeviceBuffer::from(x), dnw = DeviceBuffer::from(nw), dout(static_cast<size_t>(m_max * dim) * 4);
  DeviceBuffer dh = DeviceBuffer::from(h), dh2 = DeviceBuffer::from(h), dfn = DeviceBuffer::from(fn), dbase = DeviceBuffer::from(base),
               dscale = DeviceBuffer::from(scale), dmix(static_cast<size_t>(m_max * n_mix) * 4), dmixv = DeviceBuffer::from(mixv);
  DeviceBuffer dgw = DeviceBuffer::from(gw), dgb = DeviceBuffer::from(gb), dids(static_cast<size_t>(m_max * K) * 4),
               dwts(static_cast<size_t>(m_max * K) * 4), dscr(static_cast<size_t>(m_max * 2 * E) * 4);
  DeviceBuffer dg = DeviceBuffer::from(g), du = DeviceBuffer::from(u), drw = DeviceBuffer::from(rw), dact(g.size() * 4);
  DeviceBuffer drouted = DeviceBuffer::from(routed), dshared = DeviceBuffer::from(shared), dcids = DeviceBuffer::from(ids);
  DeviceBuffer dkv = DeviceBuffer::from(kv), degw = DeviceBuffer::from(egw), deh = DeviceBuffer::from(h);
  DeviceBuffer dcodes(static_cast<size_t>(m_max * dim)), dqs(static_cast<size_t>(m_max * dim / 32) * 4);
  DeviceBuffer dq = DeviceBuffer::from(q), dpos = DeviceBuffer::from(pos), dfreq = DeviceBuffer::from(rope_table.freqs());

  DeviceBuffer dffn(static_cast<size_t>(m_max * dim) * 4);  // the layer chain's FFN output
  DeviceBuffer dctr(static_cast<size_t>(m_max) * 4);         // the fused mix's counters (left zeroed)
  if (cudaMemset(dctr.get(), 0, static_cast<size_t>(m_max) * 4) != cudaSuccess) return 1;
  std::printf("programmatic dependent launch: %s\n", std::getenv("DSV41_NO_PDL") ? "off (DSV41_NO_PDL)" : "on");
  std::printf("%-14s %5s %10s %10s %12s %9s %9s %10s\n", "op", "m", "stream us", "graph us", "bytes", "GB/s", "% copy",
              "before us");
  for (const int64_t m : ms) {
    const bool chk = m == kCheckRows;
    const double f4 = 4.0;
    // ---- rms_norm ----
    {
      gpu::RmsNormArgs a{dx.as<float>(), dim, dnw.as<float>(), dout.as<float>(), dim, m, dim, eps};
      report("rms_norm", m, [&](cudaStream_t st) { gpu::rms_norm(a, st); }, f4 * (2 * m * dim + dim), 37.0);
      if (chk) {
        std::vector<float> want(static_cast<size_t>(m * dim));
        for (int64_t r = 0; r < m; ++r) model::rms_norm(&x[r * dim], nw.data(), dim, c.rms_norm_eps, &want[r * dim]);
        check_equal("rms_norm", dout.to_host<float>(want.size()), want);
      }
    }
    // the CPU engine's mix rows of the m tokens (pre, post, comb per token)
    auto cpu_mix_rows = [&] {
      std::vector<float> want(static_cast<size_t>(m * n_mix));
      for (int64_t t = 0; t < m; ++t) {
        model::HcMix mx;
        model::hc_mix(&h[t * k], hc, dim, fn.data(), base.data(), scale.data(), c.hc_sinkhorn_iters, c.hc_eps,
                      c.rms_norm_eps, model::hc_mix_arithmetic(hc, t, m, 0), mx);
        std::copy_n(mx.pre, hc, &want[t * n_mix]);
        std::copy_n(mx.post, hc, &want[t * n_mix + hc]);
        std::copy_n(mx.comb, hc * hc, &want[t * n_mix + 2 * hc]);
      }
      return want;
    };
    // ---- hc_mix (decode arithmetic for m <= 4: parts of 256; the prefill pass as one call) ----
    {
      gpu::HcMixArgs a = gpu::hc_mix_args(c, dh.as<float>(), m,
                                          dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), dmix.as<float>());
      a.rows_ref = m;
      report("hc_mix", m, [&](cudaStream_t st) { gpu::hc_mix(a, st); }, f4 * (m * k + n_mix * k + m * n_mix), 61.0);
      if (chk) {
        const std::vector<float> want = cpu_mix_rows();
        check_equal("hc_mix", dmix.to_host<float>(want.size()), want);
      }
    }
    // ---- the model's decode forms: mix with its split in the dots' launch (counters), and the
    // collapse + RMSNorm (+ ActQuant8 codes) pair in front of the attention and the MoE ----
    {
      gpu::HcMixArgs a = gpu::hc_mix_args(c, dh.as<float>(), m,
                                          dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), dmix.as<float>());
      a.rows_ref = m;
      a.counters = dctr.as<unsigned>();
      report("hc_mix ctr", m, [&](cudaStream_t st) { gpu::hc_mix(a, st); }, f4 * (m * k + n_mix * k + m * n_mix), 0.0);
      if (chk) {
        const std::vector<float> want = cpu_mix_rows();
        check_equal("hc_mix ctr", dmix.to_host<float>(want.size()), want);
      }
      gpu::RmsNormArgs nq{dx.as<float>(), dim, dnw.as<float>(), dout.as<float>(), dim, m, dim, eps};
      nq.codes = dcodes.as<uint8_t>();
      nq.scales = dqs.as<float>();
      report("rms_norm+codes", m, [&](cudaStream_t st) { gpu::rms_norm(nq, st); }, f4 * (2 * m * dim + dim) + m * dim, 0.0);
      const gpu::HcCollapseArgs ca{dh.as<float>(), dmixv.as<float>(), n_mix, m, hc, dim, dout.as<float>()};
      gpu::RmsNormArgs cn{dout.as<float>(), dim, dnw.as<float>(), dout.as<float>(), dim, m, dim, eps};
      cn.codes = dcodes.as<uint8_t>();
      cn.scales = dqs.as<float>();
      report("collapse+norm", m, [&](cudaStream_t st) { collapse_norm(ca, cn, st); }, f4 * (m * k + m * dim + dim) + m * dim, 0.0);
      if (chk) {
        collapse_norm(ca, cn, nullptr);
        std::vector<float> want(static_cast<size_t>(m * dim)), xs(static_cast<size_t>(dim));
        std::vector<float> wq(static_cast<size_t>(m * dim)), ws(static_cast<size_t>(m * dim / 32));
        for (int64_t t = 0; t < m; ++t) {
          model::hc_collapse(&h[t * k], &mixv[t * n_mix], hc, dim, xs.data());
          model::rms_norm(xs.data(), nw.data(), dim, c.rms_norm_eps, &want[t * dim]);
          model::act_quant8(&want[t * dim], dim, &wq[t * dim], &ws[t * dim / 32]);
        }
        check_equal("collapse+norm", dout.to_host<float>(want.size()), want);
        const std::vector<uint8_t> b = dcodes.to_host<uint8_t>(wq.size());
        std::vector<float> got(b.size());
        for (size_t i = 0; i < b.size(); ++i) got[i] = e4m3_to_f32(b[i]);
        check_equal("collapse+norm codes", got, wq);
        check_equal("collapse+norm scales", dqs.to_host<float>(ws.size()), ws);
      }
    }
    // ---- hc_collapse / hc_expand ----
    {
      gpu::HcCollapseArgs a{dh.as<float>(), dmixv.as<float>(), n_mix, m, hc, dim, dout.as<float>()};
      report("hc_collapse", m, [&](cudaStream_t st) { gpu::hc_collapse(a, st); }, f4 * (m * k + m * dim), 0.0);
      if (chk) {
        std::vector<float> want(static_cast<size_t>(m * dim));
        for (int64_t t = 0; t < m; ++t) model::hc_collapse(&h[t * k], &mixv[t * n_mix], hc, dim, &want[t * dim]);
        check_equal("hc_collapse", dout.to_host<float>(want.size()), want);
      }
      gpu::HcExpandArgs e{dx.as<float>(), dh2.as<float>(), dmixv.as<float>(), m, hc, dim};
      if (chk) {
        dh2.upload(h.data(), h.size() * 4);  // earlier timing runs updated the streams in place
        gpu::hc_expand(e, nullptr);
        std::vector<float> want(h.begin(), h.begin() + m * k);
        for (int64_t t = 0; t < m; ++t) {
          model::HcMix mx;
          std::copy_n(&mixv[t * n_mix], hc, mx.pre);
          std::copy_n(&mixv[t * n_mix + hc], hc, mx.post);
          std::copy_n(&mixv[t * n_mix + 2 * hc], hc * hc, mx.comb);
          model::hc_expand(&x[t * dim], &want[t * k], mx, hc, dim);
        }
        check_equal("hc_expand", dh2.to_host<float>(want.size()), want);
      }
      report("hc_expand", m, [&](cudaStream_t st) { gpu::hc_expand(e, st); }, f4 * (2 * m * k + m * dim), 0.0);
      // the MoE site's form: the combine of the routed and shared rows made in the expand's launch
      gpu::HcExpandArgs em = e;
      em.y = nullptr;
      em.routed = drouted.as<float>();
      em.ids = dcids.as<int32_t>();
      em.top_k = K;
      em.shared = dshared.as<float>();
      em.y_out = dout.as<float>();
      if (chk) {
        dh2.upload(h.data(), h.size() * 4);
        gpu::hc_expand(em, nullptr);
        std::vector<float> want(h.begin(), h.begin() + m * k), want_y(static_cast<size_t>(m * dim));
        for (int64_t t = 0; t < m; ++t) {
          combine_row(t, &want_y[t * dim]);
          model::HcMix mx;
          std::copy_n(&mixv[t * n_mix], hc, mx.pre);
          std::copy_n(&mixv[t * n_mix + hc], hc, mx.post);
          std::copy_n(&mixv[t * n_mix + 2 * hc], hc * hc, mx.comb);
          model::hc_expand(&want_y[t * dim], &want[t * k], mx, hc, dim);
        }
        check_equal("expand+moe y", dout.to_host<float>(want_y.size()), want_y);
        check_equal("expand+moe", dh2.to_host<float>(want.size()), want);
      }
      report("expand+moe", m, [&](cudaStream_t st) { gpu::hc_expand(em, st); },
             f4 * (2 * m * k + m * K * dim + 2 * m * dim) + 4.0 * m * K, 0.0);
    }
    // ---- router ----
    {
      gpu::RouterArgs a = gpu::router_args(c, dx.as<float>(), m, dgw.as<float>(), dgb.as<float>(), dids.as<int32_t>(),
                                           dwts.as<float>(), dscr.as<float>());
      report("router", m, [&](cudaStream_t st) { gpu::router(a, st); }, f4 * (E * dim + m * dim), 28.0);
      if (chk) {
        std::vector<float> want_w, got_w;
        std::vector<float> want_ids, got_ids;
        const std::vector<int32_t> gi = dids.to_host<int32_t>(static_cast<size_t>(m * K));
        const std::vector<float> gwt = dwts.to_host<float>(static_cast<size_t>(m * K));
        for (int64_t t = 0; t < m; ++t) {
          std::vector<float> sc(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
          for (int64_t e = 0; e < E; ++e) {
            const float z = model::gemm_dot_f32(&gw[e * dim], &x[t * dim], dim) / static_cast<float>(c.gate_temp);
            sc[e] = std::sqrt(z > 20.0f ? z : std::log1p(std::exp(z)));
            biased[e] = sc[e] + gb[e];
          }
          const std::vector<int32_t> top = model::torch_topk_indices(biased, K);
          float sum = 0.0f;
          for (int64_t i = 0; i < K; ++i) sum += sc[top[i]];
          std::vector<int64_t> ow(static_cast<size_t>(K)), og(static_cast<size_t>(K));
          std::iota(ow.begin(), ow.end(), 0);
          std::iota(og.begin(), og.end(), 0);
          std::sort(ow.begin(), ow.end(), [&](int64_t p, int64_t r) { return top[p] < top[r]; });
          std::sort(og.begin(), og.end(), [&](int64_t p, int64_t r) { return gi[t * K + p] < gi[t * K + r]; });
          for (int64_t i = 0; i < K; ++i) {
            float w = sc[top[ow[i]]];
            if (c.norm_topk_prob && K > 1) w /= (sum + 1e-20f);
            want_w.push_back(w * static_cast<float>(c.routed_scaling_factor));
            want_ids.push_back(static_cast<float>(top[ow[i]]));
            got_w.push_back(gwt[t * K + og[i]]);
            got_ids.push_back(static_cast<float>(gi[t * K + og[i]]));
          }
        }
        check_equal("router ids", got_ids, want_ids);
        check_close("router weights", got_w, want_w, kNmseF32);
      }
    }
    // ---- swiglu (the routed pairs of m tokens) ----
    {
      const int64_t rows = m * K;
      gpu::SwigluArgs a{dg.as<float>(), du.as<float>(), rows, inter, drw.as<float>(), static_cast<float>(c.swiglu_limit), dact.as<float>()};
      report("swiglu", m, [&](cudaStream_t st) { gpu::swiglu(a, st); }, f4 * (3 * rows * inter + rows), 0.0);
      if (chk) {
        const float lim = static_cast<float>(c.swiglu_limit);
        std::vector<float> want(static_cast<size_t>(rows * inter));
        for (int64_t i = 0; i < rows * inter; ++i) {
          float gv = g[i], uv = u[i];
          if (lim > 0) uv = std::clamp(uv, -lim, lim), gv = std::min(gv, lim);
          want[i] = bf16_round(rw[i / inter] * (gv / (1.0f + std::exp(-gv)) * uv));
        }
        check_close("swiglu", dact.to_host<float>(want.size()), want, kNmseBf16);
      }
    }
    // ---- moe_combine ----
    {
      gpu::MoeCombineArgs a{drouted.as<float>(), dcids.as<int32_t>(), m, K, dim, dshared.as<float>(), dout.as<float>()};
      report("moe_combine", m, [&](cudaStream_t st) { gpu::moe_combine(a, st); }, f4 * (m * K * dim + 2 * m * dim) + 4.0 * m * K, 0.0);
      if (chk) {
        std::vector<float> want(static_cast<size_t>(m * dim));
        for (int64_t t = 0; t < m; ++t) combine_row(t, &want[t * dim]);
        check_equal("moe_combine", dout.to_host<float>(want.size()), want);
      }
    }
    // ---- engram_gate ----
    {
      const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
      gpu::EngramGateArgs a{deh.as<float>(), dkv.as<float>(), degw.as<float>(), m, hc, dim, eps, inv_sqrt_dim};
      if (chk) {
        deh.upload(h.data(), h.size() * 4);
        gpu::engram_gate(a, nullptr);
        std::vector<float> want(h.begin(), h.begin() + m * k);
        for (int64_t t = 0; t < m; ++t) {
          const float* kvt = &kv[t * (hc + 1) * dim];
          for (int64_t j = 0; j < hc; ++j) {
            float* hj = &want[(t * hc + j) * dim];
            const float* kj = kvt + j * dim;
            std::vector<float> hwk(static_cast<size_t>(dim));
            for (int64_t d = 0; d < dim; ++d) hwk[d] = (hj[d] * egw[j * dim + d]) * kj[d];
            const float dot = model::torch_sum_f32(hwk.data(), dim);
            const float rstd = (1.0f / std::sqrt(model::torch_mean_sq_f32(hj, dim) + eps)) *
                               (1.0f / std::sqrt(model::torch_mean_sq_f32(kj, dim) + eps));
            const float dd = dot * rstd * inv_sqrt_dim;
            const float mag = std::sqrt(std::max(std::fabs(dd), 1e-6f));
            const float gate = 1.0f / (1.0f + std::exp(-std::copysign(mag, dd)));
            for (int64_t d = 0; d < dim; ++d) hj[d] = bf16_round(hj[d] + gate * kvt[hc * dim + d]);
          }
        }
        check_close("engram_gate", deh.to_host<float>(want.size()), want, kNmseBf16);
      }
      report("engram_gate", m, [&](cudaStream_t st) { gpu::engram_gate(a, st); },
             f4 * (2 * m * k + m * (hc + 1) * dim + hc * dim), 87.0);
    }
    // ---- act_quant8 ----
    {
      gpu::ActQuantArgs a{dx.as<float>(), m, dim, dim, dcodes.as<uint8_t>(), dqs.as<float>()};
      report("act_quant8", m, [&](cudaStream_t st) { gpu::act_quant8(a, st); }, f4 * m * dim + m * dim + f4 * m * dim / 32, 1.4);
      if (chk) {
        std::vector<float> want(static_cast<size_t>(m * dim)), wsc(static_cast<size_t>(m * dim / 32));
        for (int64_t r = 0; r < m; ++r) model::act_quant8(&x[r * dim], dim, &want[r * dim], &wsc[r * dim / 32]);
        const std::vector<uint8_t> b = dcodes.to_host<uint8_t>(want.size());
        std::vector<float> got(b.size());
        for (size_t i = 0; i < b.size(); ++i) got[i] = e4m3_to_f32(b[i]);
        check_equal("act_quant8 codes", got, want);
        check_equal("act_quant8 scales", dqs.to_host<float>(wsc.size()), wsc);
      }
    }
    // ---- rope (the query's rope dims of every head) ----
    {
      gpu::RopeArgs a;
      a.v = dq.as<float>() + hd - rd;
      a.rows = m;
      a.vecs = H;
      a.vec_stride = hd;
      a.row_stride = H * hd;
      a.freqs = dfreq.as<float>();
      a.rope_dim = rd;
      a.positions = dpos.as<int64_t>();
      if (chk) {
        dq.upload(q.data(), q.size() * 4);
        gpu::rope(a, nullptr);
        std::vector<float> want(q.begin(), q.begin() + m * H * hd);
        for (int64_t t = 0; t < m; ++t)
          for (int64_t hh = 0; hh < H; ++hh) rope_table.apply(&want[(t * H + hh) * hd + hd - rd], pos[t], false);
        check_close("rope", dq.to_host<float>(want.size()), want, kNmseBf16);
      }
      report("rope", m, [&](cudaStream_t st) { gpu::rope(a, st); }, f4 * 2 * m * H * rd, 0.0);
    }
    // ---- the small ops of one decode layer, back to back ----
    {
      gpu::HcMixArgs mix = gpu::hc_mix_args(c, dh.as<float>(), m,
                                            dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), dmix.as<float>());
      mix.rows_ref = m;
      gpu::RouterArgs ra = gpu::router_args(c, dout.as<float>(), m, dgw.as<float>(), dgb.as<float>(),
                                            dids.as<int32_t>(), dwts.as<float>(), dscr.as<float>());
      const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
      gpu::RopeArgs rp;
      rp.v = dq.as<float>() + hd - rd;
      rp.rows = m;
      rp.vecs = H;
      rp.vec_stride = hd;
      rp.row_stride = H * hd;
      rp.freqs = dfreq.as<float>();
      rp.rope_dim = rd;
      rp.positions = dpos.as<int64_t>();
      auto layer = [&](cudaStream_t st) {
        // attention half: mix, collapse, norm, quantise, rotary, expand; FFN half: Engram gate, mix,
        // collapse, norm, router, SwiGLU, combine, expand
        gpu::hc_mix(mix, st);
        gpu::hc_collapse(gpu::HcCollapseArgs{dh.as<float>(), dmix.as<float>(), n_mix, m, hc, dim, dout.as<float>()}, st);
        gpu::rms_norm(gpu::RmsNormArgs{dout.as<float>(), dim, dnw.as<float>(), dout.as<float>(), dim, m, dim, eps}, st);
        gpu::act_quant8(gpu::ActQuantArgs{dout.as<float>(), m, dim, dim, dcodes.as<uint8_t>(), dqs.as<float>()}, st);
        gpu::rope(rp, st);
        gpu::hc_expand(gpu::HcExpandArgs{dx.as<float>(), dh2.as<float>(), dmixv.as<float>(), m, hc, dim}, st);
        gpu::engram_gate(gpu::EngramGateArgs{deh.as<float>(), dkv.as<float>(), degw.as<float>(), m, hc, dim, eps, inv_sqrt_dim}, st);
        gpu::hc_mix(mix, st);
        gpu::hc_collapse(gpu::HcCollapseArgs{dh.as<float>(), dmix.as<float>(), n_mix, m, hc, dim, dout.as<float>()}, st);
        gpu::rms_norm(gpu::RmsNormArgs{dout.as<float>(), dim, dnw.as<float>(), dout.as<float>(), dim, m, dim, eps}, st);
        gpu::router(ra, st);
        gpu::swiglu(gpu::SwigluArgs{dg.as<float>(), du.as<float>(), m * K, inter, drw.as<float>(), static_cast<float>(c.swiglu_limit),
                                    dact.as<float>()},
                    st);
        gpu::moe_combine(gpu::MoeCombineArgs{drouted.as<float>(), dcids.as<int32_t>(), m, K, dim, dshared.as<float>(), dffn.as<float>()}, st);
        gpu::hc_expand(gpu::HcExpandArgs{dffn.as<float>(), dh2.as<float>(), dmixv.as<float>(), m, hc, dim}, st);
      };
      report("layer chain", m, layer, 0.0, 0.0);
    }
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("CUDA error\n");
    return 1;
  }
  std::printf("checks failed: %d\n", g_failed);
  return g_failed == 0 ? 0 : 1;
}
