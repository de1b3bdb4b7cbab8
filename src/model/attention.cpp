// CSA2 attention for one layer over a chunk of tokens (MODEL.md §5.4): window ring, compressor
// (ratio 1 and r > 1 with carried state), index keys, indexer with candidate blocks, top-k,
// sparse attention with sink, inverse RoPE, grouped low-rank output.
//
// Index-list layout. A one-token step at n_past > 0 (decode) lists the ring slots oldest first,
// exactly as the reference's decode does. Every other chunk (the whole-prompt prefill at n_past 0,
// and any multi-token chunk later) lists, for the query at position t, the absolute positions
// max(0, t-W+1) + j for j < min(end, W) (entries > t become -1), W = window, end = chunk end,
// followed by the top-k compressed indices. At n_past 0 this is the reference's prefill layout;
// later chunks differ from one-shot prefill only in 64-entry block boundaries while end < W.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"
#include "model/ops/dot.h"
#include "model/cpu_impl.h"
#include "model/linears.h"
#include "model/ops/quant.h"
#include "model/ops/sparse_attn.h"
#include "model/ops/topk.h"

namespace dsv41::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();


}  // namespace

void CpuModel::Impl::attention(const BlockWeights& b, CpuSeqState& st, ChunkShared& shared, const float* x, int64_t n,
                               int64_t start, float* out) const {
  const ModelConfig& c = cfg;
  const AttnWeights& a = b.attn;
  // H: this rank's heads (all of them at TP 1)
  const int64_t dim = c.hidden_size, H = a.n_heads, hd = c.head_dim, rd = c.qk_rope_head_dim;
  const int64_t win = c.sliding_window, qlr = c.q_lora_rank, L = b.layer, end = start + n;
  // Decode layout for a one-token step past the prompt; otherwise the one-shot prefill layout of a
  // prompt ending at layout_end (the whole prompt when its length is known).
  const bool decode = n == 1 && start > 0 && start >= st.prompt_len;
  const int64_t layout_end = std::max(end, st.prompt_len);
  const double eps = c.rms_norm_eps;

  // ---- q, window kv ----
  std::vector<float> qr(static_cast<size_t>(n * qlr)), q(static_cast<size_t>(n * H * hd)),
      kv(static_cast<size_t>(n * hd));
  linear_bf16(*a.wq_a, x, n, qr.data());
  for (int64_t t = 0; t < n; ++t) rms_norm(&qr[t * qlr], a.q_norm.data(), qlr, eps, &qr[t * qlr]);
  linear_bf16(*a.wq_b, qr.data(), n, q.data());
  linear_bf16(*a.wkv, x, n, kv.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h) b.rope.apply(&q[(t * H + h) * hd + hd - rd], start + t);
    float* k = &kv[t * hd];
    rms_norm(k, a.kv_norm.data(), hd, eps, k);
    b.rope.apply(k + hd - rd, start + t);
    qdq8_inplace(k, hd);
  }
  auto& ring = st.ring[static_cast<size_t>(L)];
  auto window_row = [&](int64_t pos) -> const float* {
    if (pos >= start) return &kv[(pos - start) * hd];
    return &ring[(pos % win) * hd];
  };

  // ---- compressed KV and top-k ----
  const int64_t ratio = b.ratio;
  const std::vector<std::vector<int32_t>>* topk = nullptr;
  const KvSourceState* ckv = nullptr;
  if (ratio > 0) {
    if (a.c_wkv) {
      KvSourceState& ks = st.kv[static_cast<size_t>(L)];
      std::vector<float> latents;  // emitted groups, in order
      int64_t first_group = -1, n_groups = 0;
      if (ratio == 1) {
        latents.resize(static_cast<size_t>(n * hd));
        linear_bf16(*a.c_wkv, x, n, latents.data());
        for (int64_t t = 0; t < n; ++t) rms_norm(&latents[t * hd], a.c_norm.data(), hd, eps, &latents[t * hd]);
        first_group = start;
        n_groups = n;
      } else {
        std::vector<float> av(static_cast<size_t>(n * hd)), gv(static_cast<size_t>(n * hd));
        a.c_wkv->forward(x, n, av.data());
        a.c_wgate->forward(x, n, gv.data());
        std::vector<float> pooled(static_cast<size_t>(hd));
        for (int64_t t = 0; t < n; ++t) {
          const int64_t p = start + t, slot = p % ratio;
          std::copy_n(&av[t * hd], hd, &ks.carry_kv[slot * hd]);
          std::copy_n(&gv[t * hd], hd, &ks.carry_score[slot * hd]);
          if ((p + 1) % ratio != 0) continue;
          for (int64_t d = 0; d < hd; ++d) {
            float mx = kNegInf;
            for (int64_t s = 0; s < ratio; ++s) mx = std::max(mx, ks.carry_score[s * hd + d]);
            float sum = 0.0f;
            std::vector<float> e(static_cast<size_t>(ratio));
            for (int64_t s = 0; s < ratio; ++s) sum += (e[s] = std::exp(ks.carry_score[s * hd + d] - mx));
            float acc = 0.0f;
            for (int64_t s = 0; s < ratio; ++s) acc += ks.carry_kv[s * hd + d] * (e[s] / sum);
            pooled[d] = bf16_round(acc);
          }
          if (first_group < 0) first_group = p / ratio;
          latents.resize(latents.size() + static_cast<size_t>(hd));
          rms_norm(pooled.data(), a.c_norm.data(), hd, eps, &latents[n_groups * hd]);
          ++n_groups;
        }
      }
      const int64_t ihd = c.index_head_dim;
      for (int64_t g = 0; g < n_groups; ++g) {
        const int64_t j = first_group + g, rope_pos = j * ratio;
        DSV_ASSERT(j == ks.n_entries, "compressed group {} emitted with {} entries stored", j, ks.n_entries);
        const float* lat = &latents[g * hd];
        if (a.i_wk) {
          std::vector<float> k(static_cast<size_t>(ihd));
          linear_bf16(*a.i_wk, lat, 1, k.data());
          rms_norm(k.data(), a.i_k_norm.data(), ihd, eps, k.data());
          b.rope.apply(k.data() + ihd - rd, rope_pos);
          qdq4a_inplace(k.data(), ihd);
          ks.index_keys.insert(ks.index_keys.end(), k.begin(), k.end());
        }
        std::vector<float> cmp(lat, lat + hd);
        b.rope.apply(cmp.data() + hd - rd, rope_pos);
        qdq4b_inplace(cmp.data(), hd);
        ks.compressed.insert(ks.compressed.end(), cmp.begin(), cmp.end());
        ++ks.n_entries;
      }
      if (n_groups > 0 && a.i_wk) st.last_key_publisher = L;
    }

    // Score rows span the layout's compressed positions: entries not yet emitted are beyond every
    // query's visible count and score -inf, as in a one-shot prefill of the whole prompt.
    const int64_t T = (decode ? end : layout_end) / ratio;
    if (a.i_wq_b) {
      // ---- indexer ----
      shared.topk.assign(static_cast<size_t>(n), {});
      if (T > 0) {
        const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
        std::vector<float> qi(static_cast<size_t>(n * IH * ID)), w(static_cast<size_t>(n * IH));
        linear_bf16(*a.i_wq_b, qr.data(), n, qi.data());
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = 0; h < IH; ++h) {
            float* v = &qi[(t * IH + h) * ID];
            b.rope.apply(v + ID - rd, start + t);
            qdq4a_inplace(v, ID);
          }
        linear_bf16(*a.i_weights_proj, x, n, w.data());
        const float wscale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5) *
                                                std::pow(static_cast<double>(IH), -0.5));
        for (float& v : w) v = bf16_round(v * wscale);

        int64_t key_src = c.kv_source_for(L);
        if (decode && !opts.corrected_index_keys && st.last_key_publisher >= 0) key_src = st.last_key_publisher;
        DSV_CHECK(key_src >= 0, "layer {}: index source without a KV source", L);
        const KvSourceState& keys = st.kv[static_cast<size_t>(key_src)];
        const bool is_cand_src = L == c.candidate_source_layer_id;
        const bool uses_cand = c.candidate_source_layer_id >= 0 && c.candidate_source_layer_id < L;
        if (is_cand_src) {
          shared.candidates.assign(static_cast<size_t>(n), {});
          shared.has_candidates = true;
        }
        parallel_for(n, [&](int64_t t0, int64_t t1) {
          std::vector<float> s(static_cast<size_t>(T));
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t p = start + t, n_vis = (p + 1) / ratio;
            for (int64_t u = 0; u < T; ++u) {
              if (u >= n_vis) {
                s[u] = kNegInf;
                continue;
              }
              float acc = 0.0f;
              for (int64_t h = 0; h < IH; ++h) {
                float dot = 0.0f;
                if (u < keys.n_entries && !keys.index_keys.empty()) {
                  const float* qv = &qi[(t * IH + h) * ID];
                  const float* kvp = &keys.index_keys[u * ID];
                  dot = gemm_dot_f32(qv, kvp, ID);
                }
                const float r = std::max(bf16_round(dot), 0.0f);
                acc += bf16_round(r * w[t * IH + h]);
              }
              s[u] = bf16_round(acc);
            }
            if (is_cand_src) {
              shared.candidates[t] = candidate_mask(s, n_vis, c.candidate_topk_blocks, c.candidate_block_size);
            } else if (uses_cand && shared.has_candidates && !shared.candidates[t].empty()) {
              const auto& m = shared.candidates[t];
              for (int64_t u = 0; u < T && u < static_cast<int64_t>(m.size()); ++u)
                if (!m[u]) s[u] = kNegInf;
            }
            std::vector<int32_t> sel = topk_sorted(s, std::min(c.index_topk, T));
            for (int32_t& v : sel)
              if (v >= n_vis) v = -1;
            shared.topk[t] = std::move(sel);
          }
        });
      }
    }
    topk = &shared.topk;
    DSV_CHECK(static_cast<int64_t>(topk->size()) == n, "layer {}: no index source has run before it", L);
    const int64_t src = c.kv_source_for(L);
    DSV_CHECK(src >= 0, "layer {}: compress ratio {} but no KV source at or below it", L, ratio);
    ckv = &st.kv[static_cast<size_t>(src)];
  }

  // ---- sparse attention ----
  std::vector<float> o(static_cast<size_t>(n * H * hd));
  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  parallel_for(n, [&](int64_t t0, int64_t t1) {
    std::vector<const float*> rows;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = start + t;
      rows.clear();
      if (decode) {
        const int64_t cur = p % win;
        for (int64_t i = 0; i < win; ++i) {
          const int64_t slot = (cur + 1 + i) % win;
          if (slot > p) rows.push_back(nullptr);
          else rows.push_back(slot == cur ? &kv[0] : &ring[slot * hd]);
        }
      } else {
        const int64_t len = std::min(layout_end, win), first = std::max<int64_t>(0, p - win + 1);
        for (int64_t j = 0; j < len; ++j) {
          const int64_t pos = first + j;
          rows.push_back(pos > p ? nullptr : window_row(pos));
        }
      }
      if (topk) {
        for (int32_t e : (*topk)[t]) {
          if (e < 0 || e >= ckv->n_entries) rows.push_back(nullptr);
          else rows.push_back(&ckv->compressed[static_cast<size_t>(e) * hd]);
        }
      }
      float* ot = &o[t * H * hd];
      sparse_attention(&q[t * H * hd], rows, a.sink.data(), scale, H, hd, ot);
      for (int64_t h = 0; h < H; ++h) b.rope.apply(ot + h * hd + hd - rd, p, true);
    }
  });

  attn_output(a, o.data(), n, out);

  // ---- ring update (after the chunk's queries read the old slots) ----
  for (int64_t t = std::max<int64_t>(0, n - win); t < n; ++t)
    std::copy_n(&kv[t * hd], hd, &ring[((start + t) % win) * hd]);
  (void)dim;
}

// Grouped low-rank output: group g's heads through wo_a[g] (BF16), the groups side by side, then
// wo_b. Under TP a rank runs its own groups and the ranks gather z; wo_b is column-parallel.
void CpuModel::Impl::attn_output(const AttnWeights& a, const float* o, int64_t n, float* out) const {
  const ModelConfig& c = cfg;
  const int64_t G = c.o_groups, R = c.o_lora_rank, hd = c.head_dim, H = a.n_heads;
  const int64_t in_g = c.num_attention_heads * hd / G, Gl = static_cast<int64_t>(a.wo_a.size());
  std::vector<float> z(static_cast<size_t>(n * G * R)), zl(static_cast<size_t>(n * Gl * R)),
      og(static_cast<size_t>(n * in_g)), zg(static_cast<size_t>(n * R));
  float* zdst = tp_world > 1 ? zl.data() : z.data();
  for (int64_t g = 0; g < Gl; ++g) {
    for (int64_t t = 0; t < n; ++t) std::copy_n(&o[t * H * hd + g * in_g], in_g, &og[t * in_g]);
    linear_bf16(*a.wo_a[static_cast<size_t>(g)], og.data(), n, zg.data());
    for (int64_t t = 0; t < n; ++t) std::copy_n(&zg[t * R], R, &zdst[t * Gl * R + g * R]);
  }
  if (tp_world > 1) tp_gather_groups(zl.data(), n, z.data());
  linear_bf16(*a.wo_b, z.data(), n, out);
}

}  // namespace dsv41::model
