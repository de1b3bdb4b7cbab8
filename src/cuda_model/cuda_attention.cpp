// CSA2 attention of one layer on the GPU (mirrors src/model/attention.cpp step by step): q and the
// window row, the compressor with index keys, the indexer with candidate blocks and top-k, the
// index lists (decode: ring slots oldest first; otherwise the one-shot prefill layout of
// layout_end over a staged window), sparse attention with sink, inverse RoPE, grouped low-rank
// output. The ring takes the chunk's rows after its queries read the old slots.
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"
#include "dsv41/common/parallel.h"
#include "model/ops/topk.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

void select_index_row(const float* scores, int64_t T, int64_t n_vis, int64_t k, const ModelConfig& c,
                      bool is_cand_src, bool uses_cand, std::vector<uint8_t>* candidates, int32_t* out) {
  std::vector<int32_t> sel;
  if (is_cand_src || (uses_cand && candidates && !candidates->empty())) {
    std::vector<float> row(scores, scores + T);
    if (is_cand_src) {
      *candidates = candidate_mask(row, n_vis, c.candidate_topk_blocks, c.candidate_block_size);
    } else {
      const std::vector<uint8_t>& m = *candidates;
      for (int64_t u = 0; u < T && u < static_cast<int64_t>(m.size()); ++u)
        if (!m[static_cast<size_t>(u)]) row[static_cast<size_t>(u)] = -INFINITY;
    }
    sel = topk_sorted(row, k);
  } else {
    sel = topk_sorted(scores, T, k);  // no mask: straight from the downloaded scores
  }
  for (int64_t j = 0; j < k; ++j) out[j] = sel[static_cast<size_t>(j)] >= n_vis ? -1 : sel[static_cast<size_t>(j)];
}

bool Impl::index_topk_on_device(const GpuBlock& b, int64_t span, int64_t rows, const PassShared& shared) const {
  const ModelConfig& c = cfg;
  if (!device_index_topk || !b.has_indexer || b.ratio <= 0) return false;
  // Rows of one selection launch: the rows of a score slice (Impl::attention; the candidate
  // source's block selection at most cand_rows of them).
  auto launch_rows = [&](int64_t T) { return std::min(rows, std::max<int64_t>(1, sc.score_slice_floats / T)); };
  auto fits = [&](int64_t T) {
    const int64_t k = std::min(c.index_topk, T);
    return T == 0 || (gpu::topk_replay_fits(T, k) && (k * 64 > T || launch_rows(T) >= kDeviceHeapRows));
  };
  const int64_t T = span / b.ratio, src = c.candidate_source_layer_id;
  if (!fits(T)) return false;
  if (b.layer == src) {
    const int64_t nb = (T + c.candidate_block_size - 1) / c.candidate_block_size;
    const int64_t kb = std::min(c.candidate_topk_blocks, nb);
    if (nb > sc.cand_blocks) return false;
    if (T > 0 && !gpu::topk_replay_fits(nb, kb)) return false;
    if (T > 0 && kb * 64 <= nb && std::min(launch_rows(T), sc.cand_rows) < kDeviceHeapRows) return false;
    for (const GpuBlock& later : blocks)
      if (later.layer > b.layer && later.has_indexer && later.ratio > 0 && !fits(span / later.ratio)) return false;
    return true;
  }
  if (src >= 0 && src < b.layer && shared.has_candidates) return shared.device_candidates;
  return true;
}

void Impl::candidate_blocks_on_device(const gpu::IndexerArgs& scored, uint32_t* keep) {
  const ModelConfig& c = cfg;
  DSV_ASSERT(scored.n <= sc.cand_rows, "candidate blocks: {} rows exceed the block scratch's {}", scored.n, sc.cand_rows);
  gpu::CandidateArgs a;
  a.scores = scored.scores;
  a.n = scored.n;
  a.T = scored.T;
  a.start = scored.start;
  a.ratio = scored.ratio;
  a.topk_blocks = c.candidate_topk_blocks;
  a.block_size = c.candidate_block_size;
  a.block_scores = sc.block_scores;
  a.block_idx = sc.block_idx;
  a.block_sel = sc.block_sel;
  a.keep = keep;
  gpu::candidate_blocks(a, stream);
}

void Impl::select_index_rows_on_device(const gpu::IndexerArgs& scored, int64_t k, int32_t* out,
                                       const int64_t* positions) {
  // The column indices travel beside the scores: the same offset in sc.score_idx (first buffer only).
  const int64_t at = scored.scores - sc.scores;
  DSV_ASSERT(at >= 0 && at + scored.n * scored.T <= sc.score_slice_floats,
             "index top-k: {} x {} scores at {} outside the first score buffer", scored.n, scored.T, at);
  gpu::TopkReplayArgs a;
  a.values = scored.scores;
  a.idx = sc.score_idx + at;
  a.rows = scored.n;
  a.n = scored.T;
  a.stride = scored.T;
  a.k = k;
  a.pos0 = scored.start;
  a.ratio = scored.ratio;
  a.positions = positions;
  a.out = out;
  gpu::topk_replay(a, stream);
}

HostPhaseTimer::Clock::time_point Impl::index_score_slices(int64_t slices, const std::function<void()>& deferred,
                                                           const std::function<void(int64_t, float*, float*)>& issue,
                                                           const std::function<void(int64_t, const float*)>& select) {
  DSV_ASSERT(slices >= 1 && (slices == 1 || sc.score_buffers == 2), "index scores: {} slices with {} buffers", slices,
             sc.score_buffers);
  auto dev = [&](int64_t s) { return sc.scores + (s % 2) * sc.score_slice_floats; };
  auto host = [&](int64_t s) { return scores_host.data() + (s % 2) * sc.score_slice_floats; };
  // Whether slice s's download has an event of its own (issued outside a graph capture).
  std::array<bool, 2> recorded{false, false};
  issue(0, dev(0), host(0));
  auto t_host = host_phases.now();
  if (deferred) {
    host_point_mark();
    deferred();
    t_host = host_phases.now();  // the launches stay in the layers' issue time
  }
  for (int64_t s = 0; s < slices; ++s) {
    if (s + 1 < slices) {
      // Buffer (s+1)%2 last held slice s-1: its download and selection are done (stream order, and
      // the host finished selecting it before this iteration).
      issue(s + 1, dev(s + 1), host(s + 1));
      const bool eager = host_point_can_defer();
      if (eager) {
        cudaEvent_t& e = score_slice_ready[static_cast<size_t>((s + 1) % 2)];
        if (!e) gpu::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
        gpu::check_cuda(cudaEventRecord(e, stream), "index score slice event");
      }
      recorded[static_cast<size_t>((s + 1) % 2)] = eager;
    }
    if (s == 0) {
      if (deferred) host_point_wait("index scores");  // the GPU goes on with the deferred work meanwhile
      else host_point_sync("index scores");            // a decode step's graph segment ends here (cuda_step.cpp)
      t_host = host_phases.add(HostPhase::TopkWait, t_host);  // (a no-op unless DSV41_HOST_PHASES=1)
    } else if (recorded[static_cast<size_t>(s % 2)]) {
      sync_event(score_slice_ready[static_cast<size_t>(s % 2)], "index score slice");
    } else {
      host_point_sync("index score slice");  // issued inside a capture that the first wait ended
    }
    select(s, host(s));
  }
  return t_host;
}

gpu::CompressorWeights Impl::compressor_weights(const GpuBlock& b) const {
  const ModelConfig& c = cfg;
  gpu::CompressorWeights w;
  w.wkv = b.c_wkv.get();
  w.wkv_type = b.c_wkv_type;
  w.wgate = b.c_wgate.as<float>();
  w.norm = b.c_norm.as<float>();
  w.i_wk = b.has_index_keys ? b.i_wk.get() : nullptr;
  w.i_wk_type = b.i_wk_type;
  w.i_k_norm = b.has_index_keys ? b.i_k_norm.as<float>() : nullptr;
  w.dim = c.hidden_size;
  w.hd = c.head_dim;
  w.ihd = c.index_head_dim;
  w.ratio = b.ratio;
  w.rope_dim = c.qk_rope_head_dim;
  w.freqs = b.freqs.as<float>();
  w.eps = static_cast<float>(c.rms_norm_eps);
  return w;
}

void Impl::rope_rows(const GpuBlock& b, const gpu::RopeArgs& at, float* v, int64_t n, int64_t vecs,
                     int64_t vec_stride, int64_t row_stride, bool inverse) {
  gpu::RopeArgs r = at;
  r.v = v;
  r.rows = n;
  r.vecs = vecs;
  r.vec_stride = vec_stride;
  r.row_stride = row_stride;
  r.freqs = b.freqs.as<float>();
  r.rope_dim = cfg.qk_rope_head_dim;
  r.inverse = inverse;
  gpu::rope(r, stream);
}

// RoPE of the last rd of k columns inside the kernel that writes the rows (gpu::RopeTail): the
// rows' 32-blocks must hold whole pairs.
static bool rope_tail_fits(int64_t k, int64_t rd) { return k % 32 == 0 && rd > 0 && rd <= k && (k - rd) % 2 == 0 && rd % 2 == 0; }

// The RopeTail of rows whose token is row / row_div, at the positions `at` gives (rope_rows').
gpu::RopeTail Impl::rope_tail(const GpuBlock& b, const gpu::RopeArgs& at, int64_t row_div) const {
  gpu::RopeTail t;
  t.freqs = b.freqs.as<float>();
  t.rope_dim = cfg.qk_rope_head_dim;
  t.positions = at.positions;
  t.pos0 = at.pos0;
  t.pos_step = at.pos_step;
  t.row_div = row_div;
  return t;
}

// The indexer's queries and head weights of n rows (MODEL.md indexer): qi = QDQ4a(RoPE(wq_b(qr)))
// per head into sc.qi, w = bf16(weights_proj(x) · ID^-0.5 · IH^-0.5) into sc.iw. Shared by the
// sequence and batched-decode paths.
void Impl::index_queries(const GpuBlock& b, int64_t n, const gpu::RopeArgs& at, const QuantizedInput& qrq,
                         const QuantizedInput& xq) {
  const ModelConfig& c = cfg;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim, rd = c.qk_rope_head_dim;
  linear(b.i_wq_b, sc.qr, c.q_lora_rank, n, sc.qi, IH * ID, true, qrq);
  gpu::QdqArgs q4{sc.qi, n * IH, ID, ID, gpu::QdqKind::Q4a};
  if (rope_tail_fits(ID, rd)) {
    q4.rope = rope_tail(b, at, IH);  // RoPE inside the QDQ's launch
  } else {
    rope_rows(b, at, sc.qi + ID - rd, n, IH, ID, IH * ID, false);
  }
  gpu::qdq(q4, stream);
  linear(b.i_weights_proj, sc.x, c.hidden_size, n, sc.iw, IH, true, xq);
  const float wscale =
      static_cast<float>(std::pow(static_cast<double>(ID), -0.5) * std::pow(static_cast<double>(IH), -0.5));
  gpu::ScaleRoundArgs sr{sc.iw, n, IH, IH, wscale};
  gpu::scale_round(sr, stream);
}

QuantizedInput Impl::project_q_kv(const GpuBlock& b, int64_t n, const gpu::RopeArgs& at, const QuantizedInput& xq,
                                  uint16_t* kv_bits) {
  const QuantizedInput qrq = project_q_latent(b, n, xq);
  project_q_rest(b, n, at, qrq, kv_bits);
  return qrq;
}

QuantizedInput Impl::project_q_latent(const GpuBlock& b, int64_t n, const QuantizedInput& xq) {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, hd = c.head_dim, qlr = c.q_lora_rank;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // wq_a and wkv read the same rows: one grouped launch when both are FP8 (see linear_pair)
  linear_pair(b.wq_a, sc.qr, qlr, b.wkv, sc.kv, hd, sc.x, dim, n, true, xq);
  // q_norm writes the codes of the q latent for wq_b and the indexer's wq_b (kept in sc.qr_codes).
  gpu::RmsNormArgs qn{sc.qr, qlr, b.q_norm.as<float>(), sc.qr, qlr, n, qlr, eps};
  const bool qr_codes = takes_codes(b.wq_b) || (b.has_indexer && takes_codes(b.i_wq_b));
  return rms_norm_rows(qn, qr_codes, sc.qr_codes, sc.qr_scales);
}

void Impl::project_q_rest(const GpuBlock& b, int64_t n, const gpu::RopeArgs& at, const QuantizedInput& qrq,
                          uint16_t* kv_bits) {
  const ModelConfig& c = cfg;
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim, qlr = c.q_lora_rank, Hl = b.n_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  linear(b.wq_b, sc.qr, qlr, n, sc.q, Hl * hd, true, qrq);
  rope_rows(b, at, sc.q + hd - rd, n, Hl, hd, Hl * hd, false);
  gpu::RmsNormArgs kn{sc.kv, hd, b.kv_norm.as<float>(), sc.kv, hd, n, hd, eps};
  if (rope_tail_fits(hd, rd)) {  // kv_norm, RoPE, QDQ8 and the bf16 copy in one launch
    kn.rope = rope_tail(b, at, 1);
    kn.qdq8 = true;
    kn.bf16_out = kv_bits;
    kn.bf16_stride = hd;
    gpu::rms_norm(kn, stream);
    return;
  }
  gpu::rms_norm(kn, stream);
  rope_rows(b, at, sc.kv + hd - rd, n, 1, hd, hd, false);
  gpu::QdqArgs q8{sc.kv, n, hd, hd, gpu::QdqKind::Q8};
  gpu::qdq(q8, stream);
  if (kv_bits) {
    gpu::StoreBf16Args s{sc.kv, n, hd, hd, kv_bits, hd};
    gpu::store_bf16(s, stream);
  }
}

void Impl::attention(const GpuBlock& b, CudaSeqState& st, PassShared& shared, const Pass& p, const QuantizedInput& xq) {
  const ModelConfig& c = cfg;
  const int64_t n = p.n, start = p.start, end = start + n, L = b.layer;
  const int64_t dim = c.hidden_size, hd = c.head_dim, rd = c.qk_rope_head_dim;
  const int64_t win = c.sliding_window;
  gpu::RopeArgs at;
  at.pos0 = start;
  auto rope = [&](float* v, int64_t vecs, int64_t vec_stride, int64_t row_stride, bool inverse) {
    rope_rows(b, at, v, n, vecs, vec_stride, row_stride, inverse);
  };

  // ---- q, window kv (under tensor parallelism q, o hold this rank's heads only) ----
  const int64_t Hl = b.n_heads;
  // The kv rows' bf16 bits: decode, the current row into its ring slot (attention.cpp reads kv[0]
  // for it); otherwise the chunk's rows into sc.kv_bf16 for the staged window (no decode use).
  uint16_t* ring = st.ring[static_cast<size_t>(L)].as<uint16_t>();
  uint16_t* kv_bits = p.decode ? ring + (start % win) * hd : sc.kv_bf16;
  DSV_ASSERT(!p.decode || n == 1, "attention: a decode pass of {} rows", n);
  // An eager decode step whose layer stops at the top-k host point issues wq_b, q's RoPE and the
  // window KV row after the index scores' download: nothing up to the host point reads them (the
  // compressor reads sc.x, the indexer sc.qr's codes and the keys), the list and attention kernels
  // after it do, so the GPU computes them while the host waits for the scores and selects the
  // top-k. The same kernels on the same inputs, in another order: the results are unchanged.
  const int64_t index_cols = b.ratio > 0 && b.has_indexer ? (p.decode ? end : p.layout_end) / b.ratio : 0;
  const bool device_topk = index_cols > 0 && index_topk_on_device(b, p.decode ? end : p.layout_end, n, shared);
  const bool host_topk = index_cols > 0 && !device_topk;
  const bool defer_rest = p.decode && host_topk && host_point_can_defer();
  const QuantizedInput qrq = project_q_latent(b, n, xq);
  if (!defer_rest) project_q_rest(b, n, at, qrq, kv_bits);
  auto store = [&](const float* x, int64_t rows, uint16_t* dst) {
    gpu::StoreBf16Args s{x, rows, hd, hd, dst, hd};
    gpu::store_bf16(s, stream);
  };

  // ---- compressed KV and top-k ----
  const int64_t ratio = b.ratio;
  const GpuKvSource* ckv = nullptr;
  int64_t topk_len = 0;
  if (ratio > 0) {
    if (b.has_compressor) {
      GpuKvSource& ks = st.kv[static_cast<size_t>(L)];
      gpu::CompressorWeights w = compressor_weights(b);
      gpu::CompressorState cs;
      cs.carry_kv = ks.carry_kv.as<float>();
      cs.carry_score = ks.carry_score.as<float>();
      cs.compressed = ks.compressed.as<uint16_t>();
      cs.index_keys = b.has_index_keys ? ks.index_keys.as<uint16_t>() : nullptr;
      cs.capacity = ks.capacity;
      cs.n_entries = ks.n_entries;
      gpu::CompressorScratch cw{sc.c_a, sc.c_g, sc.c_latent, sc.c_work, sc.m};
      if (b.c_wkv_lin.loaded()) {  // EXL3 projections run first (attention.cpp: ratio 1 rounds, r > 1 not)
        if (ratio == 1) {
          linear(b.c_wkv_lin, sc.x, dim, n, sc.c_latent, hd, true);
        } else {
          linear(b.c_wkv_lin, sc.x, dim, n, sc.c_a, hd, false);
          linear(b.c_wgate_lin, sc.x, dim, n, sc.c_g, hd, false);
        }
        w.projected = true;
      }
      const int64_t groups = gpu::compressor_step(w, cs, cw, sc.x, n, start, stream);
      ks.n_entries = cs.n_entries;
      if (groups > 0 && b.has_index_keys) st.last_key_publisher = L;
    }

    // Score columns span the layout's compressed positions (entries not yet emitted score -inf).
    const int64_t T = (p.decode ? end : p.layout_end) / ratio;
    if (b.has_indexer) {
      shared.topk_len = 0;
      if (T > 0) {
        DSV_ASSERT(T <= sc.t_max, "indexer: {} score columns exceed the scratch's {}", T, sc.t_max);
        const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
        index_queries(b, n, at, qrq, xq);

        int64_t key_src = c.kv_source_for(L);
        if (p.decode && !opts.corrected_index_keys && st.last_key_publisher >= 0) key_src = st.last_key_publisher;
        DSV_CHECK(key_src >= 0, "layer {}: index source without a KV source", L);
        const GpuKvSource& keys = st.kv[static_cast<size_t>(key_src)];
        const bool key_rows = blocks[static_cast<size_t>(key_src)].has_index_keys;
        gpu::IndexerArgs ia;
        ia.keys = key_rows ? keys.index_keys.as<uint16_t>() : nullptr;
        ia.n_keys = key_rows ? keys.n_entries : 0;
        ia.heads = IH;
        ia.head_dim = ID;
        ia.T = T;
        ia.ratio = ratio;

        // Rows in slices of the score buffer (one slice unless the pass's rows x T exceed it): each
        // row's scores and selection depend on that row alone, so slicing changes no result.
        const int64_t k = std::min(c.index_topk, T);
        const int64_t rows_per_slice = std::clamp<int64_t>(sc.score_slice_floats / T, 1, n);
        const int64_t slices = (n + rows_per_slice - 1) / rows_per_slice;
        if (device_topk) {
          // Scores, candidate blocks and selection stay on the GPU, one slice buffer after another:
          // the candidate source keeps its rows' blocks (row t at t x its blocks), the layers
          // after it send the other columns to -inf first, as select_index_row does.
          const bool is_cand_src = L == c.candidate_source_layer_id;
          const bool masked = !is_cand_src && shared.device_candidates;
          const int64_t bsz = c.candidate_block_size;
          const int64_t step = is_cand_src ? std::min(rows_per_slice, sc.cand_rows) : rows_per_slice;
          for (int64_t r0 = 0; r0 < n; r0 += step) {
            gpu::IndexerArgs sa = ia;
            sa.qi = sc.qi + r0 * IH * ID;
            sa.w = sc.iw + r0 * IH;
            sa.n = std::min(step, n - r0);
            sa.start = start + r0;
            sa.scores = sc.scores;
            gpu::indexer_scores(sa, stream);
            if (is_cand_src) candidate_blocks_on_device(sa, sc.cand_keep + r0 * gpu::keep_words((T + bsz - 1) / bsz));
            if (masked) {
              const int64_t width = shared.candidate_cols;
              const uint32_t* keep = sc.cand_keep + r0 * gpu::keep_words((width + bsz - 1) / bsz);
              gpu::CandidateMaskArgs cm{sa.scores, keep, sa.n, T, width, bsz};
              gpu::candidate_mask(cm, stream);
            }
            select_index_rows_on_device(sa, k, sc.topk + r0 * k);
          }
          if (is_cand_src) {
            shared.has_candidates = shared.device_candidates = true;
            shared.candidate_cols = T;
          }
          shared.topk_len = k;
        } else {
          // ---- candidate blocks and top-k on the host (PassShared: the CPU engine's tie order) ----
          const bool is_cand_src = L == c.candidate_source_layer_id;
          const bool uses_cand = c.candidate_source_layer_id >= 0 && c.candidate_source_layer_id < L;
          if (is_cand_src) {
            shared.candidates.assign(static_cast<size_t>(n), {});
            shared.has_candidates = true;
          }
          int32_t* sel_out = topk_host.data();
          auto issue = [&](int64_t s, float* dev, float* host) {
            const int64_t r0 = s * rows_per_slice, rows = std::min(rows_per_slice, n - r0);
            gpu::IndexerArgs sa = ia;
            sa.qi = sc.qi + r0 * IH * ID;
            sa.w = sc.iw + r0 * IH;
            sa.n = rows;
            sa.start = start + r0;
            sa.scores = dev;
            gpu::indexer_scores(sa, stream);
            const size_t bytes = static_cast<size_t>(rows * T) * 4;
            gpu::check_cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream), "index scores download");
          };
          auto select = [&](int64_t s, const float* scores) {
            const int64_t r0 = s * rows_per_slice, rows = std::min(rows_per_slice, n - r0);
            parallel_for(rows, [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                const int64_t t = r0 + i;
                const auto u = static_cast<size_t>(t);
                select_index_row(scores + i * T, T, (start + t + 1) / ratio, k, c, is_cand_src,
                                 uses_cand && shared.has_candidates,
                                 shared.has_candidates ? &shared.candidates[u] : nullptr, sel_out + t * k);
              }
            });
          };
          std::function<void()> deferred;
          if (defer_rest) deferred = [&] { project_q_rest(b, n, at, qrq, kv_bits); };
          auto t_host = index_score_slices(slices, deferred, issue, select);
          const size_t sel_bytes = static_cast<size_t>(n * k) * 4;
          gpu::check_cuda(cudaMemcpyAsync(sc.topk, sel_out, sel_bytes, cudaMemcpyHostToDevice, stream), "top-k upload");
          host_point_resume();  // the next graph segment starts after the eager upload
          host_phases.add(HostPhase::TopkHost, t_host);
          shared.topk_len = k;
        }
      }
    }
    DSV_CHECK(shared.topk_len >= 0, "layer {}: no index source has run before it", L);
    topk_len = shared.topk_len;
    const int64_t src = c.kv_source_for(L);
    DSV_CHECK(src >= 0, "layer {}: compress ratio {} but no KV source at or below it", L, ratio);
    ckv = &st.kv[static_cast<size_t>(src)];
  }

  // ---- index lists and pools ----
  gpu::AttnListArgs la;
  la.list = sc.list;
  la.n = n;
  la.win = win;
  la.decode = p.decode;
  la.start = start;
  la.topk = topk_len > 0 ? sc.topk : nullptr;
  la.topk_len = topk_len;
  la.n_entries = ckv ? ckv->n_entries : 0;
  const uint16_t* pool_a = ring;
  if (p.decode) {
    la.win_len = win;
    la.split = win;
  } else {
    const int64_t pos_base = std::max<int64_t>(0, start - win + 1);
    la.win_len = std::min(p.layout_end, win);
    la.pos_base = pos_base;
    la.split = start - pos_base + n;
    gpu::StageWindowArgs sw{ring, sc.kv_bf16, start, n, win, hd, sc.staged};
    gpu::stage_window(sw, stream);
    pool_a = sc.staged;
  }
  // the pools' per-query pointers in the lists' launch
  la.pool_a = sc.pool_a;
  la.pool_a_value = pool_a;
  la.pool_b = sc.pool_b;
  la.pool_b_value = ckv ? ckv->compressed.as<uint16_t>() : nullptr;
  gpu::attn_lists(la, stream);

  // ---- sparse attention, inverse RoPE ----
  gpu::SparseAttnArgs sa;
  sa.q = sc.q;
  sa.list = sc.list;
  sa.list_len = la.win_len + topk_len;
  sa.pool_a = sc.pool_a;
  sa.pool_b = sc.pool_b;
  sa.split = la.split;
  sa.sink = b.sink.as<float>();
  sa.scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  sa.n_q = n;
  sa.heads = Hl;
  sa.d = hd;
  sa.out = sc.o;
  if (n == 1) gpu::sparse_attention_decode(sa, stream);
  else gpu::sparse_attention_prefill(sa, stream);
  rope(sc.o + hd - rd, Hl, hd, Hl * hd, true);
  attn_output(b, n);

  // ---- ring update: the chunk's last min(n, win) rows ----
  if (!p.decode) {
    const int64_t t0 = std::max<int64_t>(0, n - win), s0 = (start + t0) % win;
    const int64_t first = std::min(n - t0, win - s0);
    store(sc.kv + t0 * hd, first, ring + s0 * hd);
    if (n - t0 > first) store(sc.kv + (t0 + first) * hd, n - t0 - first, ring);
  }
}

// Grouped low-rank output and wo_b (attention.cpp attn_output): sc.o [n][Hl*hd] -> sc.y [n][dim]
// (also the DSpark block's, cuda_dspark.cpp). A split block (cuda_tp.cpp) writes its groups' z
// columns and its wo_b outputs into zeroed buffers that the ranks all-reduce.
void Impl::attn_output(const GpuBlock& b, int64_t n) {
  const ModelConfig& c = cfg;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, G = c.o_groups, R = c.o_lora_rank, dim = c.hidden_size;
  const int64_t Hl = b.n_heads, Gl = b.n_groups, g0 = b.group_begin, in_g = H * hd / G;
  if (b.split) tp_zero(sc.z, n * G * R);
  if (!b.wo_a_slices.empty()) {  // EXL3 layout: group g's heads through slice g, outputs side by side
    if (!wo_a_batched(b, sc.o, Hl * hd, in_g, n, sc.z + g0 * R, G * R, R))
      for (int64_t g = 0; g < Gl; ++g)
        linear(b.wo_a_slices[static_cast<size_t>(g)], sc.o + g * in_g, Hl * hd, n, sc.z + (g0 + g) * R, G * R, true);
  } else {
    gpu::DenseArgs wa;
    wa.w = b.wo_a.get();
    wa.wt = b.wo_a_type;
    wa.in = in_g;
    wa.out = R;
    wa.groups = Gl;
    wa.x = sc.o;
    wa.x_stride = Hl * hd;
    wa.m = n;
    wa.y = sc.z + g0 * R;
    wa.y_stride = G * R;
    wa.round_bf16 = true;
    // Prefill passes sum the bf16 wo_a on the tensor cores (docs/ARCHITECTURE.md, Numerics).
    wa.tensor_core = !row_invariant_pass && !opts.exact_block_sums;
    gpu::lin_dense(wa, stream);
  }
  if (b.split) {
    tp_sum(sc.z, n * G * R);
    tp_zero(sc.y, n * dim);
  }
  linear(b.wo_b, sc.z, G * R, n, sc.y + b.wo_b_begin, dim, true);
  if (b.split) tp_sum(sc.y, n * dim);
}

}  // namespace dsv41::model::cuda
#endif
