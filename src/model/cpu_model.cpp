// Top level of the CPU reference engine (MODEL.md §5.1, §5.6, §6): embedding, Engram hash ids,
// the block stack, head, DSpark ring feeding and the draft block with its Markov and confidence
// heads; sequence state management.
#include "dsv41/model/cpu_model.h"

#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"
#include "model/ops/dot.h"
#include "model/cpu_impl.h"
#include "model/linears.h"
#include "model/ops/mhc.h"
#include "model/ops/quant.h"

namespace dsv41::model {

// ---------------------------------------------------------------- state
std::unique_ptr<CpuSeqState> CpuModel::Impl::make_state(std::pmr::memory_resource* memory,
                                                        int64_t capacity_tokens) const {
  const ModelConfig& c = cfg;
  auto st = std::make_unique<CpuSeqState>(memory);
  // Buffers are built in place with `memory` (assigning a pmr vector would keep the default one).
  const size_t ring = static_cast<size_t>(c.sliding_window * c.head_dim);
  st->ring.reserve(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) st->ring.emplace_back(ring, 0.0f, memory);
  st->kv.reserve(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    st->kv.push_back(KvSourceState{0, StateBuffer(memory), StateBuffer(memory), StateBuffer(memory), StateBuffer(memory)});
    if (!c.is_kv_source(l) || c.ratio(l) <= 1) continue;
    KvSourceState& k = st->kv.back();
    k.carry_kv.assign(static_cast<size_t>(c.ratio(l) * c.head_dim), 0.0f);
    k.carry_score.assign(static_cast<size_t>(c.ratio(l) * c.head_dim), -INFINITY);
  }
  st->dspark_ring.reserve(dspark.size());
  for (size_t s = 0; s < dspark.size(); ++s) st->dspark_ring.emplace_back(ring, 0.0f, memory);
  if (capacity_tokens >= 0) reserve_state(*st, capacity_tokens);
  return st;
}

const CpuSeqState& CpuModel::Impl::state_of(const SeqState& s) const {
  const auto* p = dynamic_cast<const CpuSeqState*>(&s);
  DSV_CHECK(p != nullptr, "sequence state does not belong to the CPU model");
  DSV_CHECK(p->ring.size() == static_cast<size_t>(cfg.num_hidden_layers) && p->dspark_ring.size() == dspark.size(),
            "sequence state was made by a different model");
  return *p;
}
CpuSeqState& CpuModel::Impl::state_of(SeqState& s) const {
  return const_cast<CpuSeqState&>(state_of(static_cast<const SeqState&>(s)));
}

// ---------------------------------------------------------------- head
void CpuModel::Impl::head_logits(const float* x, int64_t n, float* logits) const {
  const int64_t V = cfg.vocab_size, dim = cfg.hidden_size;
  if (head_linear) {  // EXL3 head: fp32 logits straight from the linear
    head_linear->forward(x, n, logits);
    return;
  }
  if (tp_world > 1) {  // vocab-split dense head, rows gathered
    tp_head_logits(x, n, logits);
    return;
  }
  parallel_for(V, [&](int64_t v0, int64_t v1) {
    std::vector<float> w(static_cast<size_t>(dim));
    for (int64_t v = v0; v < v1; ++v) {
      tensor_row_f32(*head, v, w.data());
      for (int64_t t = 0; t < n; ++t) {
        logits[t * V + v] = gemm_dot_f32(w.data(), &x[t * dim], dim);
      }
    }
  }, 64);
}

// ---------------------------------------------------------------- DSpark rings
void CpuModel::Impl::update_dspark_rings(CpuSeqState& st, const float* taps, int64_t n, int64_t start) const {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, hd = c.head_dim, win = c.sliding_window, rd = c.qk_rope_head_dim;
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  // Only the last `win` positions survive in the rings.
  const int64_t t0 = std::max<int64_t>(0, n - win), m = n - t0;
  std::vector<float> mx(static_cast<size_t>(m * dim)), kv(static_cast<size_t>(m * hd));
  linear_bf16(*dspark_head.main_proj, taps + t0 * nt * dim, m, mx.data());
  for (int64_t i = 0; i < m; ++i) rms_norm(&mx[i * dim], dspark_head.main_norm.data(), dim, c.rms_norm_eps, &mx[i * dim]);
  for (size_t s = 0; s < dspark.size(); ++s) {
    const BlockWeights& b = dspark[s];
    linear_bf16(*b.attn.wkv, mx.data(), m, kv.data());
    for (int64_t i = 0; i < m; ++i) {
      const int64_t p = start + t0 + i;
      float* k = &kv[i * hd];
      rms_norm(k, b.attn.kv_norm.data(), hd, c.rms_norm_eps, k);
      b.rope.apply(k + hd - rd, p);
      qdq8_inplace(k, hd);
      std::copy_n(k, hd, &st.dspark_ring[s][(p % win) * hd]);
    }
  }
}

// ---------------------------------------------------------------- forward
void CpuModel::Impl::forward(CpuSeqState& st, const int32_t* tokens, int64_t n, bool all_logits,
                             std::vector<float>* logits, BlockDump* dump) const {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, hc = c.hc_mult, V = c.vocab_size, start = st.n_past;
  DSV_CHECK(n > 0, "forward: no tokens");
  for (int64_t t = 0; t < n; ++t)
    DSV_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id {} at position {} is outside the vocabulary [0, {})",
              tokens[t], start + t, V);
  if (c.vision.enabled())
    for (int64_t t = 0; t < n; ++t)
      DSV_CHECK(tokens[t] != c.image_token_id, "image token {} at position {}: this engine is text-only", tokens[t], start + t);
  DSV_CHECK(start + n <= c.max_position_embeddings,
            "sequence of {} tokens exceeds the configured context (max_position_embeddings = {})", start + n,
            c.max_position_embeddings);

  // ---- Engram hash ids [n][n_engram][cols] ----
  const int64_t n_eng = static_cast<int64_t>(engram_hash.size()), cols = c.n_engram_columns();
  const int64_t N = c.engram_max_ngram_size;
  std::vector<int64_t> hash_ids(static_cast<size_t>(n * n_eng * cols));
  if (n_eng > 0) {
    std::vector<int64_t> hist(static_cast<size_t>(N));
    const int64_t hlen = static_cast<int64_t>(st.engram_history.size());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t k = 0; k < N; ++k) {
        if (k <= t) hist[k] = token_map[static_cast<size_t>(tokens[t - k])];
        else {
          const int64_t back = k - t;  // tokens before this chunk
          hist[k] = back <= hlen ? st.engram_history[static_cast<size_t>(hlen - back)] : -1;
        }
      }
      for (int64_t e = 0; e < n_eng; ++e)
        engram_hash_ids(engram_hash[static_cast<size_t>(e)], c, hist.data(), engram_pad,
                        &hash_ids[(t * n_eng + e) * cols]);
    }
  }

  // ---- Engram rows: start every Engram layer's reads now, they overlap the layers before it ----
  std::vector<std::vector<int64_t>> engram_rows(static_cast<size_t>(n_eng));
  std::vector<std::shared_ptr<engram::EngramFetch>> engram_fetch(static_cast<size_t>(n_eng));
  for (int64_t e = 0; e < n_eng; ++e) {
    auto& r = engram_rows[static_cast<size_t>(e)];
    // Under TP a rank reads only its columns' rows (EngramWeights::col_begin/col_end).
    const EngramWeights* ew = blocks[static_cast<size_t>(c.engram_layer_ids[static_cast<size_t>(e)])].engram.get();
    const int64_t cb = tp_world > 1 ? ew->col_begin : 0, nc = tp_world > 1 ? ew->col_end - cb : cols;
    r.resize(static_cast<size_t>(n * nc));
    for (int64_t t = 0; t < n; ++t) std::copy_n(&hash_ids[(t * n_eng + e) * cols + cb], nc, &r[t * nc]);
    engram_fetch[static_cast<size_t>(e)] = engram_store->prefetch(e, r);
  }

  // ---- embedding into hc streams ----
  std::vector<float> h(static_cast<size_t>(n * hc * dim)), pre(static_cast<size_t>(n * hc), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    tensor_row_f32(*embed, tokens[t], &h[t * hc * dim]);
    for (int64_t j = 1; j < hc; ++j) std::copy_n(&h[t * hc * dim], dim, &h[(t * hc + j) * dim]);
    pre[t * hc] = 1.0f;
  }
  const bool want_taps = !dspark.empty();
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  std::vector<float> taps(want_taps ? static_cast<size_t>(n * nt * dim) : 0);
  if (dump) {
    dump->h.assign(static_cast<size_t>(c.num_hidden_layers), {});
    dump->pre.assign(static_cast<size_t>(c.num_hidden_layers), {});
    dump->engram_hash_ids = hash_ids;
  }

  ChunkShared shared;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const BlockWeights& b = blocks[static_cast<size_t>(L)];
    if (b.engram) {
      const auto e = static_cast<size_t>(b.engram->hash_index);
      engram(*b.engram, engram_rows[e].data(), *engram_fetch[e], h.data(), n);
    }
    if (want_taps) {
      for (int64_t ti = 0; ti < nt; ++ti) {
        if (c.dspark_target_layer_ids[static_cast<size_t>(ti)] != L) continue;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t d = 0; d < dim; ++d) {
            float s = 0.0f;
            for (int64_t j = 0; j < hc; ++j) s += h[(t * hc + j) * dim + d];
            taps[(t * nt + ti) * dim + d] = bf16_round(s / static_cast<float>(hc));
          }
      }
    }
    block_forward(b, st, shared, h.data(), pre.data(), n, start, nullptr);
    if (dump) {
      dump->h[static_cast<size_t>(L)] = h;
      dump->pre[static_cast<size_t>(L)] = pre;
    }
  }

  if (logits) {
    const int64_t r0 = all_logits ? 0 : n - 1, rows = n - r0;
    std::vector<float> x(static_cast<size_t>(rows * dim));
    for (int64_t t = r0; t < n; ++t) {
      float* xt = &x[(t - r0) * dim];
      hc_collapse(&h[t * hc * dim], &pre[t * hc], hc, dim, xt);
      rms_norm(xt, final_norm.data(), dim, c.rms_norm_eps, xt);
    }
    logits->assign(static_cast<size_t>(rows * V), 0.0f);
    head_logits(x.data(), rows, logits->data());
  }

  // ---- carried state: Engram history, DSpark rings and taps ----
  if (n_eng > 0) {
    // Keeps the last `keep` ids without ever holding more (a pooled state sized its buffer once).
    const size_t keep = static_cast<size_t>(std::max<int64_t>(0, N - 1));
    for (int64_t t = 0; t < n && keep > 0; ++t) {
      if (st.engram_history.size() == keep) st.engram_history.erase(st.engram_history.begin());
      st.engram_history.push_back(token_map[static_cast<size_t>(tokens[t])]);
    }
  }
  if (want_taps) {
    update_dspark_rings(st, taps.data(), n, start);
    st.last_taps.assign(taps.end() - nt * dim, taps.end());
  }
  st.n_past = start + n;
}

// ---------------------------------------------------------------- public API
CpuModel::CpuModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuModel::~CpuModel() = default;

std::unique_ptr<CpuModel> CpuModel::load(const std::string& dir, const CpuModelOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->load(dir);
  return std::unique_ptr<CpuModel>(new CpuModel(std::move(impl)));
}

const ModelConfig& CpuModel::config() const { return impl_->cfg; }
std::unique_ptr<SeqState> CpuModel::new_sequence() const { return impl_->make_state(); }
std::unique_ptr<SeqState> CpuModel::new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const {
  DSV_CHECK(capacity_tokens >= 0, "sequence capacity must not be negative, got {}", capacity_tokens);
  return impl_->make_state(&memory, capacity_tokens);
}
void CpuModel::reserve_sequence(SeqState& state, int64_t capacity_tokens) const {
  impl_->reserve_state(impl_->state_of(state), capacity_tokens);
}
int64_t CpuModel::state_bytes(int64_t capacity_tokens) const { return impl_->state_bytes(capacity_tokens); }
bool CpuModel::has_dspark() const { return !impl_->dspark.empty(); }

void CpuModel::forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                                std::vector<float>* logits, BlockDump* dump) const {
  impl_->forward(impl_->state_of(state), tokens.data(), static_cast<int64_t>(tokens.size()), all_logits, logits, dump);
}

void CpuModel::forward(std::span<ForwardItem> batch) {
  for (ForwardItem& it : batch) {
    DSV_CHECK(it.state != nullptr, "forward: item without a sequence state");
    const CpuSeqState& st = impl_->state_of(*it.state);
    DSV_CHECK(st.capacity_tokens < 0 || st.n_past + static_cast<int64_t>(it.tokens.size()) <= st.capacity_tokens,
              "forward: {} tokens at position {} exceed the sequence's reserved capacity of {} tokens", it.tokens.size(),
              st.n_past, st.capacity_tokens);
    forward_sequence(*it.state, it.tokens, it.all_logits, it.logits);
  }
}

std::unique_ptr<SeqState> CpuModel::clone_state(const SeqState& s) const {
  // The copy draws from the same memory as the original (a snapshot of a pooled state is pooled).
  const CpuSeqState& src = impl_->state_of(s);
  auto copy = impl_->make_state(src.memory, src.capacity_tokens);
  restore_state(*copy, src);
  return copy;
}

void CpuModel::restore_state(SeqState& dst, const SeqState& src) const {
  CpuSeqState& d = impl_->state_of(dst);
  const CpuSeqState& from = impl_->state_of(src);
  // Copy-assignment keeps each buffer's own memory resource; the destination keeps its room.
  std::pmr::memory_resource* memory = d.memory;
  const int64_t capacity = d.capacity_tokens;
  d = from;
  d.memory = memory;
  d.capacity_tokens = capacity < 0 || from.capacity_tokens < 0 ? capacity : std::max(capacity, from.capacity_tokens);
  if (d.capacity_tokens >= 0) impl_->reserve_state(d, d.capacity_tokens);
}

DsparkDraft CpuModel::dspark_draft(const SeqState& state, int32_t anchor) const {
  const Impl& m = *impl_;
  const ModelConfig& c = m.cfg;
  const CpuSeqState& st = m.state_of(state);
  DSV_CHECK(!m.dspark.empty(), "this model was loaded without DSpark stages");
  DSV_CHECK(st.n_past > 0 && !st.last_taps.empty(), "DSpark needs at least one processed position");
  DSV_CHECK(anchor >= 0 && anchor < c.vocab_size, "DSpark anchor token {} outside the vocabulary", anchor);
  const int64_t B = c.dspark_block_size, dim = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const int64_t rank = c.dspark_markov_rank, P = st.n_past - 1;
  DSV_CHECK(c.dspark_noise_token_id >= 0 && c.dspark_noise_token_id < V, "config: dspark_noise_token_id out of range");

  std::vector<float> h(static_cast<size_t>(B * hc * dim)), pre(static_cast<size_t>(B * hc), 0.0f);
  for (int64_t j = 0; j < B; ++j) {
    const int64_t id = j == 0 ? anchor : c.dspark_noise_token_id;
    tensor_row_f32(*m.embed, id, &h[j * hc * dim]);
    for (int64_t k = 1; k < hc; ++k) std::copy_n(&h[j * hc * dim], dim, &h[(j * hc + k) * dim]);
    pre[j * hc] = 1.0f;
  }
  ChunkShared unused;
  CpuSeqState& st_mut = const_cast<CpuSeqState&>(st);  // the DSpark path only reads the state
  for (size_t s = 0; s < m.dspark.size(); ++s) {
    DsparkContext ctx{static_cast<int64_t>(s), P, &st};
    m.block_forward(m.dspark[s], st_mut, unused, h.data(), pre.data(), B, P + 1, &ctx);
  }
  std::vector<float> hpre(static_cast<size_t>(B * dim)), xn(static_cast<size_t>(B * dim));
  for (int64_t j = 0; j < B; ++j) {
    hc_collapse(&h[j * hc * dim], &pre[j * hc], hc, dim, &hpre[j * dim]);
    rms_norm(&hpre[j * dim], m.dspark_head.norm.data(), dim, c.rms_norm_eps, &xn[j * dim]);
  }
  DsparkDraft out;
  out.logits.assign(static_cast<size_t>(B * V), 0.0f);
  m.head_logits(xn.data(), B, out.logits.data());
  out.ids.assign(static_cast<size_t>(B + 1), 0);
  out.ids[0] = anchor;
  out.confidence.assign(static_cast<size_t>(B), 0.0f);
  std::vector<float> e(static_cast<size_t>(rank)), wrow(static_cast<size_t>(rank)), bias(static_cast<size_t>(V));
  std::vector<float> cin(static_cast<size_t>(dim + rank));
  for (int64_t i = 0; i < B; ++i) {
    tensor_row_f32(*m.dspark_head.markov_embed, out.ids[i], e.data());
    float* li = &out.logits[i * V];
    if (m.dspark_head.markov_head_linear) {
      m.dspark_head.markov_head_linear->forward(e.data(), 1, bias.data());
      for (int64_t v = 0; v < V; ++v) li[v] += bias[v];
    } else {
      for (int64_t v = 0; v < V; ++v) {
        tensor_row_f32(*m.dspark_head.markov_head, v, wrow.data());
        float acc = 0.0f;
        for (int64_t k = 0; k < rank; ++k) acc += wrow[k] * e[k];
        li[v] += acc;
      }
    }
    out.ids[i + 1] = static_cast<int32_t>(std::max_element(li, li + V) - li);
    if (m.dspark_head.confidence_linear) {
      std::copy_n(&hpre[i * dim], dim, cin.data());
      std::copy_n(e.data(), rank, cin.data() + dim);
      m.dspark_head.confidence_linear->forward(cin.data(), 1, &out.confidence[i]);
    } else {
      float conf = 0.0f;
      for (int64_t k = 0; k < dim; ++k) conf += m.dspark_head.confidence[k] * hpre[i * dim + k];
      for (int64_t k = 0; k < rank; ++k) conf += m.dspark_head.confidence[dim + k] * e[k];
      out.confidence[i] = conf;
    }
  }
  return out;
}

}  // namespace dsv41::model
