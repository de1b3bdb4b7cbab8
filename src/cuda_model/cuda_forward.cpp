// The CUDA backend's forward (mirrors src/model/cpu_model.cpp and block.cpp): Engram hash ids and
// row prefetch on the host, embedding, the block stack (mHC around attention and MoE), Engram
// gates, final norm and head. A chunk longer than the scratch arena runs as several passes that
// share the chunk's index-list layout (layout_end) and decode flag, exactly as one CPU forward.
#include "cuda_model/cuda_impl.h"
#include "cuda_model/cuda_dspark.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"
#include "dsv41/model/mix_gemm_parts.h"
#include "dsv41/ops/gpu_collapse_norm.h"

namespace dsv41::model::cuda {

// Every Lin8 call gets the arena's f16 rows (Lin8Args::rows16): the tensor-core GEMM's scaled path,
// whole-K sums by default. H200, bench_gpu_linear --gemm 2048, its conversion and second launch
// included: 12-29 % faster on each of the eight real shapes than the previous choice (the codes
// path below 2,048-wide inputs, where the block-folding scaled path lost 1-4 %, and that path above),
// 26.9 % on their sum (bench/RESULTS.md).

namespace gpu = ops::gpu;

QuantizedInput Impl::quantize(const float* x, int64_t x_stride, int64_t m, int64_t k, uint8_t* codes, float* scales) {
  gpu::ActQuantArgs q{x, m, k, x_stride, codes, scales};
  gpu::act_quant8(q, stream);
  return {codes, scales, m, k};
}

namespace {
// A norm launch that also writes its rows' ActQuant8 codes where the width allows (d % 32 == 0);
// the codes then need no separate quantise launch.
template <class Launch>
QuantizedInput norm_with_codes(gpu::RmsNormArgs a, bool want_codes, uint8_t* codes, float* scales, Launch&& launch) {
  const bool fused = want_codes && a.d % 32 == 0;
  a.codes = fused ? codes : nullptr;
  a.scales = fused ? scales : nullptr;
  launch(a);
  if (!fused) return {};
  return {codes, scales, a.rows, a.d};
}
}  // namespace

QuantizedInput Impl::rms_norm_rows(gpu::RmsNormArgs a, bool want_codes, uint8_t* codes, float* scales) {
  return norm_with_codes(a, want_codes, codes, scales, [&](const gpu::RmsNormArgs& n) { gpu::rms_norm(n, stream); });
}

QuantizedInput Impl::collapse_norm_rows(const gpu::HcCollapseArgs& c, gpu::RmsNormArgs a, bool want_codes, uint8_t* codes,
                                        float* scales) {
  return norm_with_codes(a, want_codes, codes, scales,
                         [&](const gpu::RmsNormArgs& n) { gpu::hc_collapse_rms_norm(c, n, stream); });
}

void Impl::linear(const GpuLinear& l, const float* x, int64_t x_stride, int64_t m, float* y, int64_t y_stride,
                  bool round, const QuantizedInput& xq) {
  if (m == 0) return;
  if (l.kind == GpuLinear::Kind::Exl3) {
    linear_exl3(l, x, x_stride, m, y, y_stride, round);
    return;
  }
  if (l.kind == GpuLinear::Kind::Dense) {
    gpu::DenseArgs a;
    a.w = l.w.get();
    a.wt = l.dense_type;
    a.in = l.in;
    a.out = l.out;
    a.x = x;
    a.x_stride = x_stride;
    a.m = m;
    a.y = y;
    a.y_stride = y_stride;
    a.round_bf16 = round;
    gpu::lin_dense(a, stream);
    return;
  }
  QuantizedInput in = xq;
  if (in.empty()) in = quantize(x, x_stride, m, l.in, sc.codes, sc.act_scales);
  DSV_ASSERT(in.k == l.in && in.rows >= m, "linear: codes of {} rows of {} for {} rows of {}", in.rows, in.k, m, l.in);
  if (l.kind == GpuLinear::Kind::Fp8) {
    gpu::Lin8Args a;
    a.w = {l.w.as<uint8_t>(), l.s.as<uint8_t>(), l.in, l.out};
    a.x_codes = in.codes;
    a.x_scales = in.scales;
    a.m = m;
    a.y = y;
    a.y_stride = y_stride;
    a.round_bf16 = round;
    a.exact_block_sums = opts.exact_block_sums;
    a.row_invariant = row_invariant_pass;
    a.rows16 = sc.rows16;
    a.rows16_bytes = sc.rows16_bytes;
    gpu::lin8(a, stream);
  } else {
    gpu::Lin4Args a;
    a.w = {l.w.as<uint8_t>(), l.s.as<uint8_t>(), l.in, l.out, 1};
    a.x_codes = in.codes;
    a.x_scales = in.scales;
    a.rows = m;
    a.y = y;
    a.y_stride = y_stride;
    a.round_bf16 = round;
    gpu::lin4(a, stream);
  }
}

void Impl::linear_pair(const GpuLinear& l1, float* y1, int64_t y1_stride, const GpuLinear& l2, float* y2,
                       int64_t y2_stride, const float* x, int64_t x_stride, int64_t m, bool round,
                       const QuantizedInput& xq) {
  if (m == 0) return;
  const bool fp8 = l1.kind == GpuLinear::Kind::Fp8 && l2.kind == GpuLinear::Kind::Fp8;
  const bool fp4 = l1.kind == GpuLinear::Kind::Fp4 && l2.kind == GpuLinear::Kind::Fp4;
  if ((!fp8 && !fp4) || l1.in != l2.in) {
    linear(l1, x, x_stride, m, y1, y1_stride, round, xq);
    linear(l2, x, x_stride, m, y2, y2_stride, round, xq);
    return;
  }
  QuantizedInput in = xq;
  if (in.empty()) in = quantize(x, x_stride, m, l1.in, sc.codes, sc.act_scales);
  DSV_ASSERT(in.k == l1.in && in.rows >= m, "linear_pair: codes of {} rows of {} for {} rows of {}", in.rows, in.k, m,
             l1.in);
  const GpuLinear* ls[2] = {&l1, &l2};
  float* ys[2] = {y1, y2};
  const int64_t strides[2] = {y1_stride, y2_stride};
  if (fp8) {
    gpu::Lin8GroupArgs g;
    g.count = 2;
    for (int p = 0; p < 2; ++p) {
      gpu::Lin8Args& a = g.lin[p];
      a.w = {ls[p]->w.as<uint8_t>(), ls[p]->s.as<uint8_t>(), ls[p]->in, ls[p]->out};
      a.x_codes = in.codes;
      a.x_scales = in.scales;
      a.m = m;
      a.y = ys[p];
      a.y_stride = strides[p];
      a.round_bf16 = round;
      a.exact_block_sums = opts.exact_block_sums;
      a.row_invariant = row_invariant_pass;
      a.rows16 = sc.rows16;
      a.rows16_bytes = sc.rows16_bytes;
    }
    gpu::lin8_group(g, stream);
  } else {
    gpu::Lin4GroupArgs g;
    g.count = 2;
    for (int p = 0; p < 2; ++p) {
      gpu::Lin4Args& a = g.lin[p];
      a.w = {ls[p]->w.as<uint8_t>(), ls[p]->s.as<uint8_t>(), ls[p]->in, ls[p]->out, 1};
      a.x_codes = in.codes;
      a.x_scales = in.scales;
      a.rows = m;
      a.y = ys[p];
      a.y_stride = strides[p];
      a.round_bf16 = round;
    }
    gpu::lin4_group(g, stream);
  }
}

// Engram (block.cpp engram): the pass's table rows (staged for every Engram layer before the pass,
// engram_stage) dequantised on the device, wkv, then the per-stream gates update the streams in place.
void Impl::engram(const GpuBlock& b, const uint8_t* raw_rows, int64_t n) {
  const ModelConfig& c = cfg;
  const int64_t cols = c.n_engram_columns(), hdim = c.engram_head_dim, dim = c.hidden_size, hc = c.hc_mult;
  const int64_t rows = n * cols;
  gpu::EngramDequantArgs d{raw_rows, engram_row_bytes, sc.slots, rows, hdim, sc.engram_rows};
  gpu::engram_dequant(d, stream);
  linear(b.e_wkv, sc.engram_rows, cols * hdim, n, sc.engram_kv, (hc + 1) * dim, true);
  gpu::EngramGateArgs g;
  g.h = sc.h;
  g.kv = sc.engram_kv;
  g.gate_w = b.e_gate_w.as<float>();
  g.n = n;
  g.hc = hc;
  g.dim = dim;
  g.eps = static_cast<float>(c.rms_norm_eps);
  g.inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  gpu::engram_gate(g, stream);
}

// One block (block.cpp block_forward): the attention input is collapsed with the carried `pre`
// weights, the MoE input with the attention site's pre; `pre` then becomes the MoE site's.
void Impl::block_forward(const GpuBlock& b, const Pass& p, const std::function<void(const QuantizedInput&)>& attend) {
  const ModelConfig& c = cfg;
  const int64_t n = p.n, hc = c.hc_mult, dim = c.hidden_size, mixw = (2 + hc) * hc;
  const float eps = static_cast<float>(c.rms_norm_eps);
  row_invariant_pass = p.decode;
  auto mix = [&](const DeviceBuffer& fn, const DeviceBuffer& base, const DeviceBuffer& scale, float* out) {
    gpu::HcMixArgs a = gpu::hc_mix_args(c, sc.h, n, fn.as<float>(), base.as<float>(), scale.as<float>(), out);
    // The reference call these rows belong to decides the sigmoid path (block.cpp): a decode
    // step's single row, or the one-shot prefill of the whole prompt.
    a.t_ref0 = p.decode ? 0 : p.start;
    a.rows_ref = p.decode ? 1 : p.layout_end;
    a.k_parts = p.decode ? model::kMixGemmChunks : model::resolve_mix_gemm_parts(opts.mix_gemm_k_parts, p.layout_end);
    a.counters = sc.mix_counters;  // the split inside the dots' launch where the kernel allows
    if (p.decode && n > 1) {
      // Batched decode: every row is row 0 of its own one-row call, whose first
      // clamp(floor(hc/16)*16, 0, hc) pre/post elements take the vector path; as hc <= 16 that is
      // none of them or all of them, which rows_ref 0 (none, for any row) and -1 (all) express for
      // the whole batch. Anything else runs row by row.
      const int64_t vec = std::clamp<int64_t>(hc / 16 * 16, 0, hc);
      if (vec == 0 || vec == hc) {
        a.rows_ref = vec == 0 ? 0 : -1;
      } else {
        for (int64_t t = 0; t < n; ++t) {
          gpu::HcMixArgs r = a;
          r.h = sc.h + t * hc * dim;
          r.n = 1;
          r.mix = out + t * mixw;
          gpu::hc_mix(r, stream);
        }
        return;
      }
    }
    gpu::hc_mix(a, stream);
  };
  // The normed rows sc.x, with their codes (sc.x_codes) when an FP8/FP4 linear reads them; the
  // collapse and the norm are one launch at decode sizes (a cluster of blocks per row).
  auto collapse_norm = [&](const float* w, int64_t w_stride, const DeviceBuffer& norm, bool want_codes) {
    const gpu::HcCollapseArgs a{sc.h, w, w_stride, n, hc, dim, sc.x};
    const gpu::RmsNormArgs r{sc.x, dim, norm.as<float>(), sc.x, dim, n, dim, eps};
    return collapse_norm_rows(a, r, want_codes, sc.x_codes, sc.x_scales);
  };
  mix(b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, sc.mix_a);
  attend(collapse_norm(sc.pre, hc, b.attn_norm, takes_codes(b.wq_a) || takes_codes(b.wkv)));
  // (The attention site's expand stays its own launch: run inside the MoE site's mix, each of the
  // mix's blocks would expand the whole row, 28.0 us against 16.3 us for the two launches at one
  // token on the H200.)
  gpu::HcExpandArgs ea{sc.y, sc.h, sc.mix_a, n, hc, dim};
  gpu::hc_expand(ea, stream);
  mix(b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, sc.mix_f);
  // EXL3 experts (the shared one too) read the floats; FP4 banks always read codes.
  const bool deferred = moe(b, n, p.decode, collapse_norm(sc.mix_a, mixw, b.ffn_norm, !b.x_experts.loaded()), true);
  // One launch: the MoE combine (when deferred) into sc.y, the expand, and pre <- the MoE site's pre
  // weights (the first hc values of each mix row).
  gpu::HcExpandArgs ef{sc.y, sc.h, sc.mix_f, n, hc, dim};
  if (deferred) {
    ef.routed = sc.routed;
    ef.ids = sc.ids;
    ef.top_k = b.top_k;
    ef.shared = moe_rows(b, n).shared;
    ef.y_out = sc.y;
  }
  ef.pre_out = sc.pre;
  gpu::hc_expand(ef, stream);
}

// The head's fp32 logits (cpu_model.cpp head_logits) of `rows` normed rows x [rows][dim] -> y [rows][vocab]
// (also the DSpark draft's, cuda_dspark.cpp).
void Impl::head_logits(const float* x, int64_t rows, float* y) {
  // Tensor parallelism: this rank's vocabulary rows into a zeroed [rows][vocab], all-reduced.
  if (head_split) tp_zero(y, rows * cfg.vocab_size);
  if (head_exl3.loaded()) {  // EXL3 head: fp32 logits straight from the linear
    linear(head_exl3, x, cfg.hidden_size, rows, y + vocab_begin, cfg.vocab_size, false);
    if (head_split) tp_sum(y, rows * cfg.vocab_size);
    return;
  }
  gpu::DenseArgs ha;
  ha.w = head.get();
  ha.wt = head_type;
  ha.in = cfg.hidden_size;
  ha.out = vocab_end - vocab_begin;
  ha.x = x;
  ha.x_stride = cfg.hidden_size;
  ha.m = rows;
  ha.y = y + vocab_begin;
  ha.y_stride = cfg.vocab_size;
  ha.round_bf16 = false;
  gpu::lin_dense(ha, stream);
  if (head_split) tp_sum(y, rows * cfg.vocab_size);
}

EngramPass Impl::engram_prepare(int64_t n, const std::function<void(int64_t, int64_t*)>& hist) {
  const ModelConfig& c = cfg;
  const int64_t n_eng = static_cast<int64_t>(engram_hash.size()), cols = c.n_engram_columns();
  const int64_t N = c.engram_max_ngram_size;
  EngramPass e;
  e.hash_ids.resize(static_cast<size_t>(n * n_eng * cols));
  e.rows.resize(static_cast<size_t>(n_eng));
  e.fetch.resize(static_cast<size_t>(n_eng));
  if (n_eng == 0) return e;
  std::vector<int64_t> h(static_cast<size_t>(N));
  for (int64_t t = 0; t < n; ++t) {
    hist(t, h.data());
    for (int64_t k = 0; k < n_eng; ++k)
      engram_hash_ids(engram_hash[static_cast<size_t>(k)], c, h.data(), engram_pad, &e.hash_ids[(t * n_eng + k) * cols]);
  }
  for (int64_t k = 0; k < n_eng; ++k) {
    auto& r = e.rows[static_cast<size_t>(k)];
    r.resize(static_cast<size_t>(n * cols));
    for (int64_t t = 0; t < n; ++t) std::copy_n(&e.hash_ids[(t * n_eng + k) * cols], cols, &r[t * cols]);
    e.fetch[static_cast<size_t>(k)] = engram_store->prefetch(k, r);
  }
  return e;
}

void Impl::engram_push_history(CudaSeqState& st, const int32_t* tokens, int64_t n) const {
  if (engram_hash.empty()) return;
  const size_t keep = static_cast<size_t>(std::max<int64_t>(0, cfg.engram_max_ngram_size - 1));
  for (int64_t t = 0; t < n && keep > 0; ++t) {
    if (st.engram_history.size() == keep) st.engram_history.erase(st.engram_history.begin());
    st.engram_history.push_back(token_map[static_cast<size_t>(tokens[t])]);
  }
}

void Impl::embed_rows(const int32_t* tokens, int64_t n) {
  upload_embed_inputs(tokens, n);
  embed_kernel(n);
}

// The upload runs before a step's graph capture begins (pageable sources cannot be captured).
void Impl::upload_embed_inputs(const int32_t* tokens, int64_t n) {
  gpu::check_cuda(cudaMemcpyAsync(sc.tokens, tokens, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream),
                  "tokens upload");
}

// The streams from the tokens' embedding rows, and sc.pre = (1, 0, ..) per token.
void Impl::embed_kernel(int64_t n) {
  const ModelConfig& c = cfg;
  gpu::EmbedArgs ea{embed.as<uint16_t>(), c.vocab_size, c.hidden_size, c.hc_mult, sc.tokens, n, sc.h, sc.pre};
  gpu::embed(ea, stream);
}

void Impl::final_rows(int64_t row0, int64_t rows) {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, hc = c.hc_mult;
  const gpu::HcCollapseArgs ca{sc.h + row0 * hc * dim, sc.pre + row0 * hc, hc, rows, hc, dim, sc.x};
  const gpu::RmsNormArgs rn{sc.x, dim, final_norm.as<float>(), sc.x, dim, rows, dim, static_cast<float>(c.rms_norm_eps)};
  gpu::hc_collapse_rms_norm(ca, rn, stream);
  head_logits(sc.x, rows, sc.logits);
}

void Impl::pick_rows(int64_t rows) {
  gpu::ArgmaxArgs a;
  a.x = sc.logits;
  a.rows = rows;
  a.n = cfg.vocab_size;
  a.out = picks.as<int32_t>();
  a.skip_nan = true;
  gpu::argmax(a, stream);
}

void Impl::run_pass(CudaSeqState& st, const int32_t* tokens, const Pass& p, int64_t logit_rows_from,
                    float* logits_host, BlockDump* dump, int32_t* pick) {
  const ModelConfig& c = cfg;
  const int64_t n = p.n, dim = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  row_invariant_pass = p.decode;

  // Host phases of a decode step or a prefill pass (DSV41_HOST_PHASES=1; cuda_host_phases.h).
  HostPhaseTimer* ph = host_phases.on() ? &host_phases : nullptr;
  auto t_ph = ph ? ph->now() : HostPhaseTimer::Clock::time_point{};
  auto phase = [&](HostPhase k) {
    if (ph) t_ph = ph->add(k, t_ph);
  };

  // ---- Engram hash ids [n][n_engram][cols] and the rows' prefetch (cpu_model.cpp), then the rows
  // staged: a graph step does both before its capture (the upload is eager); an eager pass right
  // before its first Engram layer, so the GPU runs the layers before it while the host hashes, waits
  // for the rows' prefetch and copies them (the same ids, rows and upload, only issued later). An
  // eager decode step hashes and starts the prefetch before its first kernel (a token's hashes
  // take microseconds): the I/O pool reads the rows while the host issues the layers before the
  // Engram layer, instead of afterwards with the GPU waiting (~125 us a step on the H200 host). The
  // hashes read the history as it was before this pass (it is pushed at the end). ----
  StepGraphs* graph = p.decode && !dump ? decode_graphs() : nullptr;
  StepGraphGuard graph_guard(graph);
  const int64_t N = c.engram_max_ngram_size, hlen = static_cast<int64_t>(st.engram_history.size());
  EngramPass eng;
  bool engram_prepared = false, engram_staged = false;
  auto prepare_engram = [&] {
    if (engram_prepared) return;
    engram_prepared = true;
    eng = engram_prepare(n, [&](int64_t t, int64_t* hist) {
      for (int64_t k = 0; k < N; ++k) {
        if (k <= t) hist[k] = token_map[static_cast<size_t>(tokens[t - k])];
        else {
          const int64_t back = k - t;
          hist[k] = back <= hlen ? st.engram_history[static_cast<size_t>(hlen - back)] : -1;
        }
      }
    });
    if (dump) dump->engram_hash_ids.insert(dump->engram_hash_ids.end(), eng.hash_ids.begin(), eng.hash_ids.end());
    phase(HostPhase::EngramPrepare);
  };
  auto stage_engram = [&] {
    if (engram_staged) return;
    engram_staged = true;
    prepare_engram();
    engram_stage(eng, n);
    phase(HostPhase::EngramStage);
  };
  if (graph || dump) stage_engram();
  else if (p.decode) prepare_engram();

  // ---- embedding into hc streams, pre = (1, 0, ..); a decode step from here in CUDA graphs ----
  upload_embed_inputs(tokens, n);
  phase(HostPhase::Uploads);
  if (graph) graph->begin(0);  // bucket 0: the solo decode step (batched passes use their row count)
  embed_kernel(n);

  const double topk_ms0 = ph ? ph->total(HostPhase::TopkWait) + ph->total(HostPhase::TopkHost) : 0.0;
  PassShared shared;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const GpuBlock& b = blocks[static_cast<size_t>(L)];
    // Each layer its own graph segment: the GPU runs the previous layer while this one is captured.
    layer_boundary(graph, L);
    if (b.has_engram) {
      if (ph) phase(HostPhase::LayerIssue);
      stage_engram();
      engram(b, engram_layer_rows(b.engram_index, n), n);
    }
    if (dspark) dspark_capture_tap(*this, L, n);  // DSpark target-layer taps (cuda_dspark.cpp)
    block_forward(b, p, [&](const QuantizedInput& xq) { attention(b, st, shared, p, xq); });
    if (dump) {
      std::vector<float> h(static_cast<size_t>(n * hc * dim)), pr(static_cast<size_t>(n * hc));
      gpu::check_cuda(cudaMemcpyAsync(h.data(), sc.h, h.size() * 4, cudaMemcpyDeviceToHost, stream), "dump h");
      gpu::check_cuda(cudaMemcpyAsync(pr.data(), sc.pre, pr.size() * 4, cudaMemcpyDeviceToHost, stream), "dump pre");
      sync_stream("dump sync");
      auto& dh = dump->h[static_cast<size_t>(L)];
      auto& dp = dump->pre[static_cast<size_t>(L)];
      dh.insert(dh.end(), h.begin(), h.end());
      dp.insert(dp.end(), pr.begin(), pr.end());
    }
  }
  layer_boundary(graph, c.num_hidden_layers);

  if (ph) {  // the top-k host points inside the layers are their own phases
    phase(HostPhase::LayerIssue);
    ph->exclude(HostPhase::LayerIssue, ph->total(HostPhase::TopkWait) + ph->total(HostPhase::TopkHost) - topk_ms0);
  }

  // ---- final norm and head ----
  if (logit_rows_from >= 0) final_rows(logit_rows_from, n - logit_rows_from);
  if (pick) {
    DSV_ASSERT(logit_rows_from == n - 1 && !tp, "forward: a greedy pick is one row of a one-node pass");
    pick_rows(1);
  }
  if (dspark) dspark_feed_rings(*this, st, p);  // DSpark rings of the pass's positions
  if (graph) graph->end();
  // A copy into pageable memory blocks until the stream reaches it: under tensor parallelism wait
  // for the step first (polling the collective, sync_stream), so a lost rank cannot hang the copy.
  if (tp && logit_rows_from >= 0) sync_stream("forward");
  if (pick)  // 4 bytes into pinned memory instead of the vocabulary row
    gpu::check_cuda(cudaMemcpyAsync(picks_host.data(), picks.get(), 4, cudaMemcpyDeviceToHost, stream), "pick download");
  else if (logit_rows_from >= 0)  // into the caller's (pageable) vector, after the graph
    gpu::check_cuda(cudaMemcpyAsync(logits_host, sc.logits, static_cast<size_t>((n - logit_rows_from) * V) * 4,
                                    cudaMemcpyDeviceToHost, stream),
                    "logits download");
  phase(HostPhase::HeadIssue);
  step_done("forward");
  if (pick) *pick = picks_host.data()[0];
  phase(HostPhase::FinalSync);
  if (ph) ph->end_step(n, p.decode);

  // ---- carried host state: Engram history ----
  engram_push_history(st, tokens, n);
  st.n_past = p.start + n;
}

void Impl::check_tokens(const CudaSeqState& st, const int32_t* tokens, int64_t n) const {
  const ModelConfig& c = cfg;
  const int64_t V = c.vocab_size, start = st.n_past, end = start + n;
  DSV_CHECK(n > 0, "forward: no tokens");
  for (int64_t t = 0; t < n; ++t)
    DSV_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id {} at position {} is outside the vocabulary [0, {})",
              tokens[t], start + t, V);
  if (c.vision.enabled())
    for (int64_t t = 0; t < n; ++t)
      DSV_CHECK(tokens[t] != c.image_token_id, "image token {} at position {}: this engine is text-only", tokens[t],
                start + t);
  DSV_CHECK(end <= c.max_position_embeddings,
            "sequence of {} tokens exceeds the configured context (max_position_embeddings = {})", end,
            c.max_position_embeddings);
  DSV_CHECK(end <= st.capacity_tokens && st.prompt_len <= st.capacity_tokens,
            "forward: {} tokens at position {} (prompt of {}) exceed the CUDA sequence capacity of {} tokens", n, start,
            st.prompt_len, st.capacity_tokens);
}

void Impl::forward(CudaSeqState& st, const int32_t* tokens, int64_t n, bool all_logits, std::vector<float>* logits,
                   BlockDump* dump, int32_t* pick) {
  const ModelConfig& c = cfg;
  const int64_t V = c.vocab_size, start = st.n_past, end = start + n;
  check_tokens(st, tokens, n);
  const bool decode = n == 1 && start > 0 && start >= st.prompt_len;
  const int64_t layout_end = std::max(end, st.prompt_len);
  // Every element is written by the passes' logits downloads: a reused vector keeps its memory and
  // is not cleared (clearing it would hold the step's first launch back by a pass over V floats).
  // a pick replaces the last row's logits, one node only
  if (all_logits || !logits || tp || !device_picks) pick = nullptr;
  if (logits && !pick) logits->resize(static_cast<size_t>((all_logits ? n : 1) * V));
  if (dump) {
    dump->h.assign(static_cast<size_t>(c.num_hidden_layers), {});
    dump->pre.assign(static_cast<size_t>(c.num_hidden_layers), {});
    dump->engram_hash_ids.clear();
  }
  // A pass returning every row's logits is at most sc.logit_rows long (results do not depend on the
  // pass size); otherwise only the chunk's last row has logits.
  const int64_t pass = all_logits && logits ? sc.logit_rows : sc.m;
  for (int64_t off = 0; off < n; off += pass) {
    const int64_t cnt = std::min(pass, n - off);
    const Pass p{start + off, cnt, layout_end, decode};
    const bool last = off + cnt == n;
    int64_t from = -1;
    float* dst = nullptr;
    if (logits && all_logits) {
      from = 0;
      dst = logits->data() + off * V;
    } else if (logits && last) {
      from = cnt - 1;
      dst = pick ? nullptr : logits->data();
    }
    run_pass(st, tokens + off, p, from, dst, dump, last ? pick : nullptr);
  }
}

}  // namespace dsv41::model::cuda
#endif
