// Batched decode on the CUDA backend: the one-token decode steps of several sequences in one pass
// (DecodeBatch, cuda_impl.h), so a step of B sequences reads every weight once instead of B times.
//
// Exactness: every op of the pass is row-wise (embedding, Engram, mHC mix/collapse/expand, norms,
// RoPE with per-row positions, QDQ, the FP8/FP4/dense linears, router and experts, head), and
// each row's arithmetic there does not depend on the other rows, so a row comes out bit for bit as
// in its sequence's own decode pass. What belongs to one sequence runs against that sequence's
// state: its window-ring slot, its compressor step, its indexer over its own keys (one launch
// each, then one download and the host top-k in the CPU engine's tie order), its candidate masks,
// and its attention list; sparse attention takes per-query pools (each row's ring and compressed
// KV) and runs once over consecutive rows whose lists have the same length (the list length sets
// the kernel's chunking, so rows of other lengths run in their own launch). The mHC mixes use the
// arithmetic of a one-row decode call for every row (see block_forward).
//
// Host synchronisations per pass: one per indexer layer (the top-k runs on the host: the step's
// CUDA graph segments end there, cuda_graph.h), the final one; under tensor parallelism one per
// collective. The Engram rows of every Engram layer are staged before the pass (engram_stage).
#include "cuda_model/cuda_dspark.h"
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "dsv41/common/error.h"
#include "dsv41/common/parallel.h"
#include "model/ops/topk.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

namespace {

// The EXL3 GEMM and grouped MoE take their int8 path (MUL1 codebook) up to this many rows and the
// f16 path up to 8: within it a row's result does not depend on the row count.
constexpr int64_t kExl3SameBatchRows = 4;

bool is_decode_step(const ForwardItem& it) {
  const SeqState& st = *it.state;
  return it.tokens.size() == 1 && st.n_past > 0 && st.n_past >= st.prompt_len;
}

// Calls f(begin, end) for each maximal run of consecutive indices in [0, n) with equal key(i).
template <class Key, class F>
void for_each_run(int64_t n, Key&& key, F&& f) {
  for (int64_t i0 = 0; i0 < n;) {
    int64_t i1 = i0 + 1;
    while (i1 < n && key(i1) == key(i0)) ++i1;
    f(i0, i1);
    i0 = i1;
  }
}

}  // namespace

int64_t Impl::max_decode_batch() const {
  // every row's logits come out of one head launch into sc.logits
  return weight_bytes_exl3 > 0 ? std::min(sc.logit_rows, kExl3SameBatchRows) : sc.logit_rows;
}

void Impl::forward_items(std::span<ForwardItem> items) {
  // Bad input refuses the whole call before any state moves (an item of a state named twice is
  // checked at that state's current position; forward() checks it again when it runs).
  for (ForwardItem& it : items) {
    DSV_CHECK(it.state != nullptr, "forward: item without a sequence state");
    check_tokens(state_of(*it.state), it.tokens.data(), static_cast<int64_t>(it.tokens.size()));
  }
  // A state named twice must see its items in order: those items run alone, as before.
  std::unordered_map<const SeqState*, int> uses;
  for (const ForwardItem& it : items) ++uses[it.state];
  std::vector<ForwardItem*> steps;
  for (ForwardItem& it : items)
    if (is_decode_step(it) && uses[it.state] == 1) steps.push_back(&it);
  if (steps.size() < 2) steps.clear();
  for (ForwardItem& it : items) {
    if (std::find(steps.begin(), steps.end(), &it) != steps.end()) continue;
    forward(state_of(*it.state), it.tokens.data(), static_cast<int64_t>(it.tokens.size()), it.all_logits, it.logits,
            nullptr, it.greedy_id);
  }
  // The steps in passes of at most max_decode_batch() rows, split evenly.
  const int64_t total = static_cast<int64_t>(steps.size()), most = std::max<int64_t>(1, max_decode_batch());
  const int64_t passes = (total + most - 1) / most;
  for (int64_t k = 0, i0 = 0; k < passes; ++k) {
    const int64_t cnt = (total - i0) / (passes - k);
    if (cnt == 1) {
      ForwardItem& it = *steps[static_cast<size_t>(i0)];
      forward(state_of(*it.state), it.tokens.data(), 1, it.all_logits, it.logits, nullptr, it.greedy_id);
    } else {
      forward_decode_batch(std::span<ForwardItem* const>(steps).subspan(static_cast<size_t>(i0), static_cast<size_t>(cnt)));
    }
    i0 += cnt;
  }
}

void Impl::forward_decode_batch(std::span<ForwardItem* const> items) {
  const int64_t n = static_cast<int64_t>(items.size()), V = cfg.vocab_size;
  DSV_ASSERT(n >= 1 && n <= sc.logit_rows, "batched decode of {} rows in a scratch of {} logit rows", n, sc.logit_rows);
  DecodeBatch db;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>*> logits;
  std::vector<int32_t*> pick_out;
  // Every item is checked before anything runs.
  for (ForwardItem* it : items) {
    CudaSeqState& st = state_of(*it->state);
    DSV_ASSERT(is_decode_step(*it), "batched decode: an item that is not a one-token decode step");
    check_tokens(st, it->tokens.data(), 1);
    DSV_ASSERT(std::find(db.seqs.begin(), db.seqs.end(), &st) == db.seqs.end(), "batched decode: a state twice");
    db.seqs.push_back(&st);
    db.pos.push_back(st.n_past);
    tokens.push_back(it->tokens[0]);
    logits.push_back(it->logits);
    // a pick replaces the row's logits download (forward() has the same rule)
    pick_out.push_back(it->logits && !it->all_logits && !tp && device_picks ? it->greedy_id : nullptr);
  }
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] && !pick_out[i]) logits[i]->resize(static_cast<size_t>(V));  // all V written by the download
  run_decode_pass(db, tokens.data(), logits, pick_out);
}

void Impl::run_decode_pass(DecodeBatch& db, const int32_t* tokens, std::span<std::vector<float>* const> logits,
                           std::span<int32_t* const> pick_out) {
  const ModelConfig& c = cfg;
  const int64_t n = db.rows(), V = c.vocab_size, N = c.engram_max_ngram_size, layers = c.num_hidden_layers;
  db.shared.assign(static_cast<size_t>(n), {});
  db.topk_off.assign(static_cast<size_t>(n), 0);
  // Host phases of the step (DSV41_HOST_PHASES=1; cuda_host_phases.h).
  HostPhaseTimer* ph = host_phases.on() ? &host_phases : nullptr;
  auto t_ph = ph ? ph->now() : HostPhaseTimer::Clock::time_point{};
  auto phase = [&](HostPhase k) {
    if (ph) t_ph = ph->add(k, t_ph);
  };

  // ---- Engram: row t's n-gram window is its token, then its own sequence's history. Hashes and
  // rows before the graph capture in a graph step; in an eager step the hashes and the rows'
  // prefetch before the first kernel and the rows' copy and upload right before the first Engram
  // layer, so the I/O pool reads while the host issues the layers before it (run_pass does the
  // same) ----
  StepGraphs* graph = decode_graphs();
  EngramPass eng;
  bool engram_prepared = false, engram_staged = false;
  auto prepare_engram = [&] {
    if (engram_prepared) return;
    engram_prepared = true;
    eng = engram_prepare(n, [&](int64_t t, int64_t* hist) {
      const std::vector<int64_t>& h = db.seqs[static_cast<size_t>(t)]->engram_history;
      const int64_t hlen = static_cast<int64_t>(h.size());
      for (int64_t k = 0; k < N; ++k)
        hist[k] = k == 0 ? token_map[static_cast<size_t>(tokens[t])] : k <= hlen ? h[static_cast<size_t>(hlen - k)] : -1;
    });
    phase(HostPhase::EngramPrepare);
  };
  auto stage_engram = [&] {
    if (engram_staged) return;
    engram_staged = true;
    prepare_engram();
    engram_stage(eng, n);
    phase(HostPhase::EngramStage);
  };
  if (graph) stage_engram();
  else prepare_engram();

  // ---- the rows' positions and, per layer, their attention pools (one upload each) ----
  gpu::check_cuda(cudaMemcpyAsync(sc.positions, db.pos.data(), static_cast<size_t>(n) * 8, cudaMemcpyHostToDevice,
                                  stream),
                  "positions upload");
  std::vector<const uint16_t*> pools(static_cast<size_t>(layers * 2 * n), nullptr);
  for (int64_t L = 0; L < layers; ++L) {
    const int64_t src = blocks[static_cast<size_t>(L)].ratio > 0 ? c.kv_source_for(L) : -1;
    for (int64_t i = 0; i < n; ++i) {
      const CudaSeqState& st = *db.seqs[static_cast<size_t>(i)];
      pools[static_cast<size_t>((L * 2) * n + i)] = st.ring[static_cast<size_t>(L)].as<uint16_t>();
      if (src >= 0) pools[static_cast<size_t>((L * 2 + 1) * n + i)] = st.kv[static_cast<size_t>(src)].compressed.as<uint16_t>();
    }
  }
  gpu::check_cuda(cudaMemcpyAsync(sc.batch_pools, pools.data(), pools.size() * sizeof(void*), cudaMemcpyHostToDevice,
                                  stream),
                  "attention pools upload");

  // ---- the step's kernels, in CUDA graphs when on (bucket: the row count) ----
  StepGraphGuard graph_guard(graph);
  upload_embed_inputs(tokens, n);
  phase(HostPhase::Uploads);
  if (graph) graph->begin(n);
  embed_kernel(n);
  const double topk_ms0 = ph ? ph->total(HostPhase::TopkWait) + ph->total(HostPhase::TopkHost) : 0.0;
  const Pass p{0, n, 0, true};
  for (int64_t L = 0; L < layers; ++L) {
    const GpuBlock& b = blocks[static_cast<size_t>(L)];
    // Each layer its own graph segment: the GPU runs the previous layer while this one is captured.
    layer_boundary(graph, L);
    if (b.has_engram) {
      if (ph) phase(HostPhase::LayerIssue);
      stage_engram();
      engram(b, engram_layer_rows(b.engram_index, n), n);
    }
    if (dspark) dspark_capture_tap(*this, L, n);
    block_forward(b, p, [&](const QuantizedInput& xq) { attention_batch(b, db, xq); });
  }
  layer_boundary(graph, layers);

  if (ph) {  // the top-k host points inside the layers are their own phases
    phase(HostPhase::LayerIssue);
    ph->exclude(HostPhase::LayerIssue, ph->total(HostPhase::TopkWait) + ph->total(HostPhase::TopkHost) - topk_ms0);
  }

  // ---- head over every row when any item wants logits (one read of the head) ----
  const bool head = std::any_of(logits.begin(), logits.end(), [](const std::vector<float>* l) { return l != nullptr; });
  if (head) final_rows(0, n);
  auto pick_of = [&](int64_t i) {
    return i < static_cast<int64_t>(pick_out.size()) ? pick_out[static_cast<size_t>(i)] : nullptr;
  };
  bool any_pick = false;
  for (int64_t i = 0; i < n; ++i) any_pick = any_pick || (logits[static_cast<size_t>(i)] && pick_of(i));
  if (any_pick) pick_rows(n);
  if (dspark) dspark_feed_rings_batch(*this, db);
  if (graph) graph->end();
  if (tp && head) sync_stream("batched decode");  // before the pageable copies (cuda_forward.cpp)
  if (any_pick)  // n ids into pinned memory
    gpu::check_cuda(cudaMemcpyAsync(picks_host.data(), picks.get(), static_cast<size_t>(n) * 4,
                                    cudaMemcpyDeviceToHost, stream),
                    "pick download");
  if (head) {  // into the callers' (pageable) vectors, after the graph
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float>* l = logits[static_cast<size_t>(i)];
      if (!l || pick_of(i)) continue;
      gpu::check_cuda(cudaMemcpyAsync(l->data(), sc.logits + i * V, static_cast<size_t>(V) * 4, cudaMemcpyDeviceToHost,
                                      stream),
                      "logits download");
    }
  }
  phase(HostPhase::HeadIssue);
  step_done("batched decode");
  for (int64_t i = 0; i < n; ++i)
    if (logits[static_cast<size_t>(i)] && pick_of(i)) *pick_of(i) = picks_host.data()[i];
  phase(HostPhase::FinalSync);
  if (ph) ph->end_step(n);

  for (int64_t i = 0; i < n; ++i) {
    CudaSeqState& st = *db.seqs[static_cast<size_t>(i)];
    engram_push_history(st, tokens + i, 1);
    st.n_past = db.pos[static_cast<size_t>(i)] + 1;
  }
}

// CSA2 attention of one layer for the batch's rows (Impl::attention's decode path, row by row
// where the state is the sequence's).
void Impl::attention_batch(const GpuBlock& b, DecodeBatch& db, const QuantizedInput& xq) {
  const ModelConfig& c = cfg;
  const int64_t n = db.rows(), L = b.layer;
  const int64_t dim = c.hidden_size, hd = c.head_dim, rd = c.qk_rope_head_dim;
  const int64_t win = c.sliding_window;
  auto seq = [&](int64_t i) -> CudaSeqState& { return *db.seqs[static_cast<size_t>(i)]; };
  auto pos = [&](int64_t i) { return db.pos[static_cast<size_t>(i)]; };
  gpu::RopeArgs at;
  at.positions = sc.positions;
  auto rope = [&](float* v, int64_t vecs, int64_t vec_stride, int64_t row_stride, bool inverse) {
    rope_rows(b, at, v, n, vecs, vec_stride, row_stride, inverse);
  };

  // ---- q, window kv: row-wise; each row into its own ring slot ----
  const int64_t Hl = b.n_heads;
  // An eager step whose layer stops at the top-k host point issues wq_b, q's RoPE and the window
  // KV rows after the index scores' download, so the GPU computes them while the host waits and
  // selects (Impl::attention: nothing before the host point reads them; results unchanged).
  // (When every row's selection can run on the device, there is no host point.)
  bool any_cols = false, all_on_device = true;
  if (b.ratio > 0 && b.has_indexer)
    for (int64_t i = 0; i < n; ++i) {
      any_cols = any_cols || (pos(i) + 1) / b.ratio > 0;
      all_on_device = all_on_device && index_topk_on_device(b, pos(i) + 1, n, db.shared[static_cast<size_t>(i)]);
    }
  const bool device_topk = any_cols && all_on_device;
  const bool host_topk = any_cols && !device_topk;
  const bool defer_rest = host_topk && host_point_can_defer();
  const QuantizedInput qrq = project_q_latent(b, n, xq);
  auto project_rest = [&] {
    project_q_rest(b, n, at, qrq, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t* ring = seq(i).ring[static_cast<size_t>(L)].as<uint16_t>();
      gpu::StoreBf16Args s{sc.kv + i * hd, 1, hd, hd, ring + (pos(i) % win) * hd, hd};
      gpu::store_bf16(s, stream);
    }
  };
  if (!defer_rest) project_rest();

  // ---- compressed KV and top-k ----
  const int64_t ratio = b.ratio;
  std::vector<int64_t> topk_len(static_cast<size_t>(n), 0), n_entries(static_cast<size_t>(n), 0);
  if (ratio > 0) {
    if (b.has_compressor) {
      gpu::CompressorWeights w = compressor_weights(b);
      // The projections of every row in one read of the weights (row-wise arithmetic), then each
      // sequence's own compressor step on its row.
      if (b.c_wkv_lin.loaded()) {  // EXL3
        if (ratio == 1) {
          linear(b.c_wkv_lin, sc.x, dim, n, sc.c_latent, hd, true);
        } else {
          linear(b.c_wkv_lin, sc.x, dim, n, sc.c_a, hd, false);
          linear(b.c_wgate_lin, sc.x, dim, n, sc.c_g, hd, false);
        }
      } else {
        gpu::compressor_project(w, gpu::CompressorScratch{sc.c_a, sc.c_g, sc.c_latent, sc.c_work, n}, sc.x, n, stream);
      }
      w.projected = true;
      const int64_t work = std::max(hd, c.index_head_dim);
      for (int64_t i = 0; i < n; ++i) {
        CudaSeqState& st = seq(i);
        GpuKvSource& ks = st.kv[static_cast<size_t>(L)];
        gpu::CompressorState cs;
        cs.carry_kv = ks.carry_kv.as<float>();
        cs.carry_score = ks.carry_score.as<float>();
        cs.compressed = ks.compressed.as<uint16_t>();
        cs.index_keys = b.has_index_keys ? ks.index_keys.as<uint16_t>() : nullptr;
        cs.capacity = ks.capacity;
        cs.n_entries = ks.n_entries;
        // Row i's slice of the compressor scratch (its projections when EXL3 ran them above).
        gpu::CompressorScratch cw{sc.c_a + i * hd, sc.c_g + i * hd, sc.c_latent + i * hd, sc.c_work + i * work, 1};
        const int64_t groups = gpu::compressor_step(w, cs, cw, sc.x + i * dim, 1, pos(i), stream);
        ks.n_entries = cs.n_entries;
        if (groups > 0 && b.has_index_keys) st.last_key_publisher = L;
      }
    }

    if (b.has_indexer) {
      // Score columns of row i: its own positions' compressed entries; packed [row][T_i].
      std::vector<int64_t> T(static_cast<size_t>(n)), soff(static_cast<size_t>(n)), k_row(static_cast<size_t>(n), 0);
      int64_t total = 0, kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto u = static_cast<size_t>(i);
        T[u] = (pos(i) + 1) / ratio;
        DSV_ASSERT(T[u] <= sc.t_max, "indexer: {} score columns exceed the scratch's {}", T[u], sc.t_max);
        soff[u] = total;
        total += T[u];
        k_row[u] = T[u] > 0 ? std::min(c.index_topk, T[u]) : 0;
        db.topk_off[u] = kept;
        kept += k_row[u];
        db.shared[u].topk_len = 0;
      }
      if (total > 0) {
        const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
        index_queries(b, n, at, qrq, xq);
        // Row groups of at most one score buffer (rows in order; one group unless the rows' score
        // columns together exceed it): group g's rows [gfirst[g], gfirst[g+1]) at soff offsets
        // relative to its first row's.
        std::vector<int64_t> gfirst{0};
        for (int64_t i = 0, used = 0; i < n; ++i) {
          const int64_t t = T[static_cast<size_t>(i)];
          if (used + t > sc.score_slice_floats && i > gfirst.back()) {
            gfirst.push_back(i);
            used = 0;
          }
          used += t;
        }
        gfirst.push_back(n);
        const int64_t groups = static_cast<int64_t>(gfirst.size()) - 1;
        // Scores row i into `scores`; on the device path also its candidate blocks (the source)
        // or its candidate mask (the layers after it), each row's at i x Scratch::cand_blocks.
        const bool is_cand_src = L == c.candidate_source_layer_id;
        auto score_row = [&](int64_t i, float* scores) {
          const auto u = static_cast<size_t>(i);
          const CudaSeqState& st = seq(i);
          int64_t key_src = c.kv_source_for(L);
          if (!opts.corrected_index_keys && st.last_key_publisher >= 0) key_src = st.last_key_publisher;
          DSV_CHECK(key_src >= 0, "layer {}: index source without a KV source", L);
          const GpuKvSource& keys = st.kv[static_cast<size_t>(key_src)];
          const bool key_rows = blocks[static_cast<size_t>(key_src)].has_index_keys;
          gpu::IndexerArgs ia;
          ia.qi = sc.qi + i * IH * ID;
          ia.w = sc.iw + i * IH;
          ia.keys = key_rows ? keys.index_keys.as<uint16_t>() : nullptr;
          ia.n_keys = key_rows ? keys.n_entries : 0;
          ia.n = 1;
          ia.heads = IH;
          ia.head_dim = ID;
          ia.T = T[u];
          ia.start = pos(i);
          ia.ratio = ratio;
          ia.scores = scores;
          gpu::indexer_scores(ia, stream);
          if (!device_topk) return;
          const PassShared& shared = db.shared[u];
          uint32_t* keep = sc.cand_keep + i * gpu::keep_words(sc.cand_blocks);
          if (is_cand_src) {
            candidate_blocks_on_device(ia, keep);
          } else if (shared.device_candidates) {
            gpu::CandidateMaskArgs cm{scores, keep, 1, T[u], shared.candidate_cols, c.candidate_block_size};
            gpu::candidate_mask(cm, stream);
          }
        };
        auto issue = [&](int64_t g, float* dev, float* host) {
          const int64_t i0 = gfirst[static_cast<size_t>(g)], i1 = gfirst[static_cast<size_t>(g + 1)];
          const int64_t base = soff[static_cast<size_t>(i0)];
          for (int64_t i = i0; i < i1; ++i)
            if (T[static_cast<size_t>(i)] > 0) score_row(i, dev + (soff[static_cast<size_t>(i)] - base));
          const int64_t floats = (i1 < n ? soff[static_cast<size_t>(i1)] : total) - base;
          if (floats > 0)
            gpu::check_cuda(cudaMemcpyAsync(host, dev, static_cast<size_t>(floats) * 4, cudaMemcpyDeviceToHost, stream),
                            "index scores download");
        };

        // ---- candidate blocks and top-k on the host, every row's in one round trip per group ----
        const bool uses_cand = c.candidate_source_layer_id >= 0 && c.candidate_source_layer_id < L;
        int32_t* sel_out = topk_host.data();
        auto select = [&](int64_t g, const float* scores) {
          const int64_t i0 = gfirst[static_cast<size_t>(g)], i1 = gfirst[static_cast<size_t>(g + 1)];
          const int64_t base = soff[static_cast<size_t>(i0)];
          parallel_for(i1 - i0, [&](int64_t j0, int64_t j1) {
            for (int64_t i = i0 + j0; i < i0 + j1; ++i) {
              const auto u = static_cast<size_t>(i);
              if (T[u] == 0) continue;
              PassShared& shared = db.shared[u];
              if (is_cand_src) {
                shared.candidates.assign(1, {});
                shared.has_candidates = true;
              }
              select_index_row(scores + (soff[u] - base), T[u], (pos(i) + 1) / ratio, k_row[u], c, is_cand_src,
                               uses_cand && shared.has_candidates,
                               shared.has_candidates ? &shared.candidates[0] : nullptr, sel_out + db.topk_off[u]);
            }
          });
        };
        if (device_topk) {
          // No host point: rows at the stride of the widest, so that one launch selects a score
          // buffer's rows (each its own width from its position), outputs packed as topk_off.
          const int64_t t_max = *std::max_element(T.begin(), T.end());
          const int64_t per = std::clamp<int64_t>(sc.score_slice_floats / t_max, 1, n);
          for (int64_t i0 = 0; i0 < n; i0 += per) {
            const int64_t i1 = std::min(n, i0 + per);
            for (int64_t i = i0; i < i1; ++i)
              if (T[static_cast<size_t>(i)] > 0) score_row(i, sc.scores + (i - i0) * t_max);
            gpu::IndexerArgs rows;
            rows.n = i1 - i0;
            rows.T = t_max;
            rows.ratio = ratio;
            rows.scores = sc.scores;
            select_index_rows_on_device(rows, std::min(c.index_topk, t_max), sc.topk + db.topk_off[static_cast<size_t>(i0)],
                                        sc.positions + i0);
          }
          if (is_cand_src)
            for (int64_t i = 0; i < n; ++i) {
              PassShared& shared = db.shared[static_cast<size_t>(i)];
              if (T[static_cast<size_t>(i)] == 0) continue;
              shared.has_candidates = shared.device_candidates = true;
              shared.candidate_cols = T[static_cast<size_t>(i)];
            }
        } else {
          std::function<void()> deferred;
          if (defer_rest) deferred = project_rest;
          auto t_host = index_score_slices(groups, deferred, issue, select);
          const size_t sel_bytes = static_cast<size_t>(kept) * 4;
          gpu::check_cuda(cudaMemcpyAsync(sc.topk, sel_out, sel_bytes, cudaMemcpyHostToDevice, stream), "top-k upload");
          host_point_resume();  // the next graph segment starts after the eager upload
          host_phases.add(HostPhase::TopkHost, t_host);
        }
        for (int64_t i = 0; i < n; ++i) db.shared[static_cast<size_t>(i)].topk_len = k_row[static_cast<size_t>(i)];
      }
    }
    const int64_t src = c.kv_source_for(L);
    DSV_CHECK(src >= 0, "layer {}: compress ratio {} but no KV source at or below it", L, ratio);
    for (int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<size_t>(i);
      DSV_CHECK(db.shared[u].topk_len >= 0, "layer {}: no index source has run before it", L);
      topk_len[u] = db.shared[u].topk_len;
      n_entries[u] = seq(i).kv[static_cast<size_t>(src)].n_entries;
    }
  }

  // ---- index lists: row i's ring slots oldest first, then its selections; packed [row][win + k_i] ----
  std::vector<int64_t> loff(static_cast<size_t>(n));
  for (int64_t i = 0, off = 0; i < n; ++i) {
    loff[static_cast<size_t>(i)] = off;
    off += win + topk_len[static_cast<size_t>(i)];
  }
  auto k_of = [&](int64_t i) { return topk_len[static_cast<size_t>(i)]; };
  for_each_run(
      n, [&](int64_t i) { return std::make_pair(k_of(i), n_entries[static_cast<size_t>(i)]); },
      [&](int64_t i0, int64_t i1) {
        gpu::AttnListArgs la;
        la.list = sc.list + loff[static_cast<size_t>(i0)];
        la.n = i1 - i0;
        la.win = win;
        la.win_len = win;
        la.decode = true;
        la.positions = sc.positions + i0;
        la.start = pos(i0);
        la.split = win;
        la.topk = k_of(i0) > 0 ? sc.topk + db.topk_off[static_cast<size_t>(i0)] : nullptr;
        la.topk_len = k_of(i0);
        la.n_entries = n_entries[static_cast<size_t>(i0)];
        gpu::attn_lists(la, stream);
      });

  // ---- sparse attention over each run of equal list length, inverse RoPE, output ----
  const uint16_t* const* pool_a = sc.batch_pools + (L * 2) * n;
  const uint16_t* const* pool_b = sc.batch_pools + (L * 2 + 1) * n;
  for_each_run(n, k_of, [&](int64_t i0, int64_t i1) {
    gpu::SparseAttnArgs sa;
    sa.q = sc.q + i0 * Hl * hd;
    sa.list = sc.list + loff[static_cast<size_t>(i0)];
    sa.list_len = win + k_of(i0);
    sa.pool_a = pool_a + i0;
    sa.pool_b = pool_b + i0;
    sa.split = win;
    sa.sink = b.sink.as<float>();
    sa.scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
    sa.n_q = i1 - i0;
    sa.heads = Hl;
    sa.d = hd;
    sa.out = sc.o + i0 * Hl * hd;
    gpu::sparse_attention_decode(sa, stream);
  });
  rope(sc.o + hd - rd, Hl, hd, Hl * hd, true);
  attn_output(b, n);
}

}  // namespace dsv41::model::cuda
#endif
