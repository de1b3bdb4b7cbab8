// Tensor-parallel pieces of the CPU engine (docs/TENSOR_PARALLEL.md). Every rank runs the whole
// forward on replicated activations; the split layers compute a rank's share and the ranks
// all-gather the shares, so that each value is computed exactly as at TP 1:
//  - attention: a rank owns whole output groups and their heads (wq_b rows, sinks, wo_a groups);
//    z is gathered and wo_b is column-parallel;
//  - MoE: routed experts split into contiguous id ranges; each selected expert's output is
//    gathered and every rank adds them in expert-id order (the TP 1 order); the shared expert's
//    w1/w3/w2 are column-parallel;
//  - Engram: a rank reads the table rows of its hash columns (engram_share), rows are gathered;
//    wkv is column-parallel;
//  - head: vocabulary rows split, logits gathered.
// Replicated (small, or feeding discrete choices): wq_a, wkv, compressors, indexers, norms, mHC,
// gates, DSpark main_proj and Markov/confidence heads.
#include <cstring>

#include "dist/tp_linear.h"
#include "dsv41/common/error.h"
#include "dsv41/common/parallel.h"
#include "dsv41/dist/collective.h"
#include "dsv41/engram/geometry.h"
#include "model/cpu_impl.h"
#include "model/linears.h"
#include "model/ops/dot.h"

namespace dsv41::model {
namespace {

constexpr int64_t kAlign = 32;  // FP8 scale blocks: output splits start at multiples of 32

std::unique_ptr<Linear> column_parallel(const Checkpoint& ck, const std::string& prefix, int64_t in, int64_t out,
                                        dist::Collective* tp) {
  const dist::Range r = dist::split_range(out, tp->rank(), tp->world_size(), kAlign);
  return std::make_unique<dist::ColumnParallelLinear>(load_linear_rows(ck, prefix, in, out, r.begin, r.end), out,
                                                      kAlign, tp, /*bf16_wire=*/true);
}

}  // namespace

void CpuModel::Impl::tp_split_block(BlockWeights& b, const std::string& prefix, bool is_dspark) {
  const ModelConfig& c = cfg;
  const Checkpoint& ck = *ckpt;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, G = c.o_groups, R = c.o_lora_rank;
  const int64_t dim = c.hidden_size, inter = c.moe_intermediate_size;
  DSV_CHECK(G > 0 && H % G == 0,
            "tensor parallel: num_attention_heads ({}) must be a multiple of o_groups ({}) to split whole groups", H,
            G);

  // ---- attention: whole output groups and their heads ----
  AttnWeights& a = b.attn;
  const std::string ap = prefix + ".attn";
  const dist::Range gr = dist::split_range(G, tp_rank, tp_world);
  const int64_t per_group = H / G;
  a.group_begin = gr.begin;
  a.head_begin = gr.begin * per_group;
  a.n_heads = gr.size() * per_group;
  a.wq_b = load_linear_rows(ck, ap + ".wq_b", c.q_lora_rank, H * hd, a.head_begin * hd,
                            (a.head_begin + a.n_heads) * hd);
  a.sink = std::vector<float>(a.sink.begin() + a.head_begin, a.sink.begin() + a.head_begin + a.n_heads);
  std::vector<std::unique_ptr<Linear>> groups;
  for (int64_t g = gr.begin; g < gr.end; ++g) groups.push_back(std::move(a.wo_a[static_cast<size_t>(g)]));
  a.wo_a = std::move(groups);
  a.wo_b = column_parallel(ck, ap + ".wo_b", G * R, dim, tp);

  // ---- shared expert: column-parallel w1/w3 and w2 ----
  const std::string sp = prefix + ".ffn.shared_experts";
  b.ffn.shared.w1 = column_parallel(ck, sp + ".w1", dim, inter, tp);
  b.ffn.shared.w3 = column_parallel(ck, sp + ".w3", dim, inter, tp);
  b.ffn.shared.w2 = column_parallel(ck, sp + ".w2", inter, dim, tp);

  // ---- Engram: this rank's hash columns; wkv column-parallel ----
  if (b.engram && !is_dspark) {
    EngramWeights& e = *b.engram;
    const engram::EngramGeometry geo = engram::EngramGeometry::from_config(c);
    const engram::EngramShare share = engram::engram_share(geo, e.hash_index, tp_rank, tp_world);
    e.col_begin = share.col_begin;
    e.col_end = share.col_end;
    e.wkv = column_parallel(ck, prefix + ".engram.wkv", c.n_engram_columns() * c.engram_head_dim,
                            dim * (c.hc_mult + 1), tp);
  }
}

void CpuModel::Impl::tp_gather_groups(const float* z_local, int64_t n, float* z) const {
  std::vector<int64_t> widths(static_cast<size_t>(tp_world));
  for (int r = 0; r < tp_world; ++r)
    widths[static_cast<size_t>(r)] = dist::split_range(cfg.o_groups, r, tp_world).size() * cfg.o_lora_rank;
  dist::gather_columns(*tp, z_local, n, widths, z, /*bf16_wire=*/true);  // z is bf16 (linear_bf16)
}

void CpuModel::Impl::tp_engram_rows(const EngramWeights& w, const int64_t* local_ids, const engram::EngramFetch& fetch,
                                    int64_t n, float* rows) const {
  const int64_t hdim = cfg.engram_head_dim, nc = w.col_end - w.col_begin;
  std::vector<float> local(static_cast<size_t>(n * nc * hdim));
  if (nc > 0) fetch.dequant_rows(std::span<const int64_t>(local_ids, static_cast<size_t>(n * nc)), local.data());
  const engram::EngramGeometry geo = engram::EngramGeometry::from_config(cfg);
  std::vector<int64_t> widths(static_cast<size_t>(tp_world));
  for (int r = 0; r < tp_world; ++r) {
    const engram::EngramShare s = engram::engram_share(geo, w.hash_index, r, tp_world);
    widths[static_cast<size_t>(r)] = (s.col_end - s.col_begin) * hdim;
  }
  // Dequantised rows are bf16 values (MODEL.md §5.3): the bf16 wire is exact.
  dist::gather_columns(*tp, local.data(), n, widths, rows, /*bf16_wire=*/true);
}

void CpuModel::Impl::tp_moe_routed(const MoeWeights& w, const float* x, int64_t n,
                                   const std::vector<std::vector<int64_t>>& sel,
                                   const std::vector<std::vector<float>>& wts, float* y) const {
  const int64_t dim = cfg.hidden_size, E = w.n_experts, K = w.top_k;
  // Per expert: its tokens in increasing order with their weights (as the TP 1 loop visits them).
  std::vector<std::vector<int64_t>> toks(static_cast<size_t>(E));
  std::vector<std::vector<float>> tw(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < K; ++i) {
      const int64_t e = sel[t][i];
      toks[e].push_back(t);
      tw[e].push_back(wts[t][i]);
    }
  // Rank r's part: the outputs of its experts, expert by expert, as bf16 (run_expert rounds them).
  std::vector<size_t> counts(static_cast<size_t>(tp_world), 0);
  for (int r = 0; r < tp_world; ++r) {
    const dist::Range er = dist::split_range(E, r, tp_world);
    for (int64_t e = er.begin; e < er.end; ++e) counts[r] += toks[e].size() * static_cast<size_t>(dim) * 2;
  }
  size_t total = 0, my_off = 0;
  for (int r = 0; r < tp_world; ++r) {
    if (r < tp_rank) my_off += counts[r];
    total += counts[r];
  }
  std::vector<uint8_t> buf(total);
  auto* mine = reinterpret_cast<uint16_t*>(buf.data() + my_off);
  for (int64_t e = w.expert_begin; e < w.expert_end; ++e) {
    const int64_t m = static_cast<int64_t>(toks[e].size());
    if (m == 0) continue;
    std::vector<float> xs(static_cast<size_t>(m * dim)), ys(static_cast<size_t>(m * dim));
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + toks[e][i] * dim, dim, &xs[i * dim]);
    run_expert(w.experts[static_cast<size_t>(e)], xs.data(), m, tw[e].data(), cfg.swiglu_limit, ys.data());
    for (int64_t i = 0; i < m * dim; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &ys[i], 4);
      *mine++ = static_cast<uint16_t>(bits >> 16);
    }
  }
  tp->all_gather(buf.data() + my_off, counts, buf.data());
  // The parts are in rank order = expert order: add them exactly as the TP 1 loop does.
  const auto* p = reinterpret_cast<const uint16_t*>(buf.data());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t : toks[e])
      for (int64_t d = 0; d < dim; ++d) {
        const uint32_t bits = static_cast<uint32_t>(*p++) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        y[t * dim + d] += v;
      }
}

void CpuModel::Impl::tp_head_logits(const float* x, int64_t n, float* logits) const {
  const int64_t dim = cfg.hidden_size, Vl = vocab_end - vocab_begin;
  std::vector<float> local(static_cast<size_t>(n * Vl));
  parallel_for(Vl, [&](int64_t v0, int64_t v1) {
    std::vector<float> w(static_cast<size_t>(dim));
    for (int64_t v = v0; v < v1; ++v) {
      tensor_row_f32(*head, vocab_begin + v, w.data());
      for (int64_t t = 0; t < n; ++t) local[t * Vl + v] = gemm_dot_f32(w.data(), &x[t * dim], dim);
    }
  }, 64);
  std::vector<int64_t> widths(static_cast<size_t>(tp_world));
  for (int r = 0; r < tp_world; ++r)
    widths[static_cast<size_t>(r)] = dist::split_range(cfg.vocab_size, r, tp_world).size();
  dist::gather_columns(*tp, local.data(), n, widths, logits, /*bf16_wire=*/false);  // fp32 logits
}

}  // namespace dsv41::model
