// One V4.1 block (MODEL.md §5.2): single-pass mHC around attention and MoE; plus the MoE (§5.5)
// and the Engram module (§5.3), and the DSpark block attention (§6.3).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"
#include "model/ops/torch_sum.h"
#include "model/ops/dot.h"
#include "dsv41/model/mix_gemm_parts.h"
#include "model/cpu_impl.h"
#include "model/linears.h"
#include "model/ops/mhc.h"
#include "model/ops/quant.h"
#include "model/ops/sparse_attn.h"
#include "model/ops/topk.h"

namespace dsv41::model {
namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

// Expert(x, wt): SwiGLU with the reference's clamps; routed experts scale the activation by wt.
void run_expert(const Expert& e, const float* x, int64_t n, const float* wt, double limit, float* y) {
  const int64_t inter = e.w1->out_features();
  std::vector<float> g(static_cast<size_t>(n * inter)), u(static_cast<size_t>(n * inter));
  linear_bf16(*e.w1, x, n, g.data());
  linear_bf16(*e.w3, x, n, u.data());
  swiglu_rows(g.data(), u.data(), wt, n, inter, limit, g.data());
  linear_bf16(*e.w2, g.data(), n, y);
}

void CpuModel::Impl::moe(const MoeWeights& w, const float* x, int64_t n, float* out) const {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, E = w.n_experts, K = w.top_k;
  std::vector<std::vector<int64_t>> sel(static_cast<size_t>(n));
  std::vector<std::vector<float>> wts(static_cast<size_t>(n));
  const float temp = static_cast<float>(c.gate_temp);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> s(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      float z = gemm_dot_f32(&w.gate_w[e * dim], &x[t * dim], dim);
      z = z / temp;
      if (c.scoring_func == "sigmoid") s[e] = 1.0f / (1.0f + std::exp(-z));
      else s[e] = std::sqrt(softplus(z));
      biased[e] = s[e] + w.gate_bias[e];
    }
    if (c.scoring_func == "softmax") {
      // softmax scores over the raw logits (kept for completeness; V4.1 uses sqrtsoftplus)
      float mx = -INFINITY, sum = 0.0f;
      std::vector<float> z(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        float v = 0.0f;
        for (int64_t k = 0; k < dim; ++k) v += w.gate_w[e * dim + k] * x[t * dim + k];
        z[e] = v / temp;
        mx = std::max(mx, z[e]);
      }
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(z[e] - mx));
      for (int64_t e = 0; e < E; ++e) biased[e] = (s[e] /= sum) + w.gate_bias[e];
    }
    // Selection order (by biased score) is kept: the weights are summed in that order.
    const std::vector<int32_t> top = torch_topk_indices(biased, K);
    std::vector<int64_t> idx(top.begin(), top.end());
    std::vector<float> wt(static_cast<size_t>(K));
    float sum = 0.0f;
    for (int64_t i = 0; i < K; ++i) sum += (wt[i] = s[idx[i]]);
    for (int64_t i = 0; i < K; ++i) {
      if (c.norm_topk_prob && K > 1) wt[i] /= (sum + 1e-20f);
      wt[i] *= static_cast<float>(c.routed_scaling_factor);
    }
    sel[t] = std::move(idx);
    wts[t] = std::move(wt);
  }
  std::vector<float> y(static_cast<size_t>(n * dim), 0.0f);
  // Experts in increasing id; each token adds its routed outputs in that order (fp32).
  if (tp_world > 1) tp_moe_routed(w, x, n, sel, wts, y.data());
  for (int64_t e = 0; e < E && tp_world == 1; ++e) {
    std::vector<int64_t> toks;
    std::vector<float> tw;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < K; ++i)
        if (sel[t][i] == e) {
          toks.push_back(t);
          tw.push_back(wts[t][i]);
        }
    if (toks.empty()) continue;
    const int64_t m = static_cast<int64_t>(toks.size());
    std::vector<float> xs(static_cast<size_t>(m * dim)), ys(static_cast<size_t>(m * dim));
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + toks[i] * dim, dim, &xs[i * dim]);
    run_expert(w.experts[static_cast<size_t>(e)], xs.data(), m, tw.data(), c.swiglu_limit, ys.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t d = 0; d < dim; ++d) y[toks[i] * dim + d] += ys[i * dim + d];
  }
  std::vector<float> sh(static_cast<size_t>(n * dim));
  run_expert(w.shared, x, n, nullptr, c.swiglu_limit, sh.data());
  for (int64_t i = 0; i < n * dim; ++i) out[i] = bf16_round(y[i] + sh[i]);
}

void CpuModel::Impl::engram(const EngramWeights& w, const int64_t* hash_rows, const engram::EngramFetch& rows_fetch,
                            float* h, int64_t n) const {
  const ModelConfig& c = cfg;
  const int64_t cols = c.n_engram_columns(), hdim = c.engram_head_dim, dim = c.hidden_size, hc = c.hc_mult;
  const int64_t in = cols * hdim;
  std::vector<float> rows(static_cast<size_t>(n * in)), kv(static_cast<size_t>(n * (hc + 1) * dim));
  // [n][cols] ids -> [n][cols][hdim] = [n][in]: bf16(e4m3 · 2^(scale−127)) (MODEL.md §5.3). Waits for
  // the prefetch; an I/O error surfaces here as dsv41::Error for this forward only. Under TP,
  // hash_rows holds this rank's columns [col_begin, col_end) and the ranks gather the rows.
  if (tp_world > 1) tp_engram_rows(w, hash_rows, rows_fetch, n, rows.data());
  else rows_fetch.dequant_rows(std::span<const int64_t>(hash_rows, static_cast<size_t>(n * cols)), rows.data());
  linear_bf16(*w.wkv, rows.data(), n, kv.data());
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  for (int64_t t = 0; t < n; ++t) {
    const float* kvt = &kv[t * (hc + 1) * dim];
    const float* value = kvt + hc * dim;
    for (int64_t j = 0; j < hc; ++j) {
      float* hj = &h[(t * hc + j) * dim];
      const float* kj = kvt + j * dim;
      const float* gw = &w.gate_w[j * dim];
      std::vector<float> hwk(static_cast<size_t>(dim));
      for (int64_t d = 0; d < dim; ++d) hwk[d] = (hj[d] * gw[d]) * kj[d];
      const float dot = torch_sum_f32(hwk.data(), dim);
      const float rstd = (1.0f / std::sqrt(torch_mean_sq_f32(hj, dim) + eps)) *
                         (1.0f / std::sqrt(torch_mean_sq_f32(kj, dim) + eps));
      const float dd = dot * rstd * inv_sqrt_dim;
      const float mag = std::sqrt(std::max(std::fabs(dd), 1e-6f));
      const float gate = 1.0f / (1.0f + std::exp(-std::copysign(mag, dd)));
      for (int64_t d = 0; d < dim; ++d) hj[d] = bf16_round(hj[d] + gate * value[d]);
    }
  }
}

void CpuModel::Impl::dspark_attention(const BlockWeights& b, int64_t stage, const CpuSeqState& st, const float* x,
                                      int64_t n, int64_t P, float* out) const {
  const ModelConfig& c = cfg;
  const AttnWeights& a = b.attn;
  // H: this rank's heads (all of them at TP 1)
  const int64_t H = a.n_heads, hd = c.head_dim, rd = c.qk_rope_head_dim, win = c.sliding_window;
  const int64_t qlr = c.q_lora_rank;
  const double eps = c.rms_norm_eps;
  std::vector<float> qr(static_cast<size_t>(n * qlr)), q(static_cast<size_t>(n * H * hd)),
      kv(static_cast<size_t>(n * hd));
  linear_bf16(*a.wq_a, x, n, qr.data());
  for (int64_t t = 0; t < n; ++t) rms_norm(&qr[t * qlr], a.q_norm.data(), qlr, eps, &qr[t * qlr]);
  linear_bf16(*a.wq_b, qr.data(), n, q.data());
  linear_bf16(*a.wkv, x, n, kv.data());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = P + 1 + t;
    for (int64_t h = 0; h < H; ++h) b.rope.apply(&q[(t * H + h) * hd + hd - rd], pos);
    float* k = &kv[t * hd];
    rms_norm(k, a.kv_norm.data(), hd, eps, k);
    b.rope.apply(k + hd - rd, pos);
    qdq8_inplace(k, hd);
  }
  // Ring slots in slot order (not oldest first), then every block row (non-causal).
  const auto& ring = st.dspark_ring[static_cast<size_t>(stage)];
  std::vector<const float*> rows;
  for (int64_t s = 0; s < std::min(win, P + 1); ++s) rows.push_back(&ring[s * hd]);
  for (int64_t t = 0; t < n; ++t) rows.push_back(&kv[t * hd]);
  std::vector<float> o(static_cast<size_t>(n * H * hd));
  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  for (int64_t t = 0; t < n; ++t) {
    float* ot = &o[t * H * hd];
    sparse_attention(&q[t * H * hd], rows, a.sink.data(), scale, H, hd, ot);
    for (int64_t h = 0; h < H; ++h) b.rope.apply(ot + h * hd + hd - rd, P + 1 + t, true);
  }
  attn_output(a, o.data(), n, out);
}

void CpuModel::Impl::block_forward(const BlockWeights& b, CpuSeqState& st, ChunkShared& shared, float* h, float* pre,
                                   int64_t n, int64_t start, const DsparkContext* dctx) const {
  const ModelConfig& c = cfg;
  const int64_t hc = c.hc_mult, dim = c.hidden_size;
  std::vector<HcMix> amix(static_cast<size_t>(n)), fmix(static_cast<size_t>(n));
  std::vector<float> x(static_cast<size_t>(n * dim)), y(static_cast<size_t>(n * dim));
  // The reference call this token belongs to (its row count decides the last-ulp arithmetic of
  // the mixes, ops/mhc.h): the DSpark block's rows, a decode step's single row, or the one-shot
  // prefill of the whole prompt.
  const bool decode = !dctx && n == 1 && start > 0 && start >= st.prompt_len;
  const int64_t rows_ref = dctx ? n : decode ? 1 : std::max(start + n, st.prompt_len);
  const int64_t k_parts = dctx || decode ? kMixGemmChunks : resolve_mix_gemm_parts(opts.mix_gemm_k_parts, rows_ref);
  auto arith = [&](int64_t t) { return hc_mix_arithmetic(hc, dctx || decode ? t : start + t, rows_ref, k_parts); };
  parallel_for(n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* ht = &h[t * hc * dim];
      hc_mix(ht, hc, dim, b.hc_attn.fn.data(), b.hc_attn.base.data(), b.hc_attn.scale.data(), c.hc_sinkhorn_iters,
             c.hc_eps, c.rms_norm_eps, arith(t), amix[t]);
      hc_collapse(ht, &pre[t * hc], hc, dim, &x[t * dim]);
      rms_norm(&x[t * dim], b.attn_norm.data(), dim, c.rms_norm_eps, &x[t * dim]);
    }
  });
  if (dctx) dspark_attention(b, dctx->stage, *dctx->state, x.data(), n, dctx->anchor_pos, y.data());
  else attention(b, st, shared, x.data(), n, start, y.data());
  parallel_for(n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* ht = &h[t * hc * dim];
      hc_expand(&y[t * dim], ht, amix[t], hc, dim);
      hc_mix(ht, hc, dim, b.hc_ffn.fn.data(), b.hc_ffn.base.data(), b.hc_ffn.scale.data(), c.hc_sinkhorn_iters,
             c.hc_eps, c.rms_norm_eps, arith(t), fmix[t]);
      hc_collapse(ht, amix[t].pre, hc, dim, &x[t * dim]);
      rms_norm(&x[t * dim], b.ffn_norm.data(), dim, c.rms_norm_eps, &x[t * dim]);
    }
  });
  moe(b.ffn, x.data(), n, y.data());
  for (int64_t t = 0; t < n; ++t) {
    hc_expand(&y[t * dim], &h[t * hc * dim], fmix[t], hc, dim);
    std::copy_n(fmix[t].pre, hc, &pre[t * hc]);
  }
}

}  // namespace dsv41::model
